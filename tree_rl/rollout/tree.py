"""The rollout tree: fixed-capacity node arrays for a batch of prompts.

Layout: every array has leading axes [P, N] (prompt, node slot within the prompt's block).
A node is one agent step: the policy's tokens for a turn followed by the observation the
environment returned. Root nodes (depth 0, `parent == -1`) hold the prompt as "observation"
tokens, so a root-to-node path concatenates to exactly the context the sampler saw.
A prompt may hold several trees (Tree-GRPO's M trees); `tree_id` is the tree's index within
its prompt. Node `i` of prompt `p` keeps its context in sampler sequence `p * N + i`.

Node token layout: `tokens[p, i, :policy_len]` are policy tokens (loss mask 1),
`tokens[p, i, policy_len:policy_len + obs_len]` observation tokens (loss mask 0).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Tree:
  """Node arrays [P, N, ...] plus per-prompt counters [P]."""

  parent: jax.Array        # int32 [P, N] local parent index, -1 for roots and empty slots
  depth: jax.Array         # int32 [P, N] root 0
  tree_id: jax.Array       # int32 [P, N] tree index within the prompt
  used: jax.Array          # bool [P, N]
  tokens: jax.Array        # int32 [P, N, T] policy tokens then observation tokens
  logprobs: jax.Array      # float32 [P, N, T] sampler log-probs of policy tokens (0 elsewhere)
  entropy: jax.Array       # float32 [P, N] mean sampler entropy (nats) of the reply's first k
                           # tokens (k: the engine's entropy_tokens); 0 at roots, for empty
                           # replies, and everywhere when the engine computes none (k = 0)
  policy_len: jax.Array    # int32 [P, N]
  obs_len: jax.Array       # int32 [P, N]
  ctx_len: jax.Array       # int32 [P, N] tokens on the root..node path, node included
  action: jax.Array        # int32 [P, N] parsed action id of the turn (-1 at roots)
  action_run: jax.Array    # int32 [P, N] identical actions in a row ending at this node
  score: jax.Array         # float32 [P, N] last process score (NaN when never scored)
  reward: jax.Array        # float32 [P, N] environment reward of this step
  ret: jax.Array           # float32 [P, N] sum of rewards along the root..node path
  tool_calls: jax.Array    # int32 [P, N] tool calls of this node's step
  finished: jax.Array      # bool [P, N] the episode ended at this node (env done)
  pruned: jax.Array        # bool [P, N] a routing policy stopped the branch here
  truncated: jax.Array     # bool [P, N] stopped by the turn limit, capacity or budget
  num_children: jax.Array  # int32 [P, N]
  env_state: Any           # env state pytree with leading [P, N]: the state after this node's step
  size: jax.Array          # int32 [P] node slots used per prompt
  prompt_id: jax.Array     # int32 [P] caller's id of each prompt, its advantage group (distinct per batch)

  @property
  def num_prompts(self) -> int:
    return self.parent.shape[0]

  @property
  def capacity(self) -> int:
    return self.parent.shape[1]

  @property
  def node_tokens(self) -> int:
    return self.tokens.shape[2]

  @property
  def length(self) -> jax.Array:
    return self.policy_len + self.obs_len

  @property
  def is_leaf(self) -> jax.Array:
    """Used non-root nodes without children: the ends of trajectories."""
    return self.used & (self.depth > 0) & (self.num_children == 0)


def empty(num_prompts: int, capacity: int, node_tokens: int, env_state_example: Any,
          prompt_id: jax.Array | None = None) -> Tree:
  """An empty tree; `env_state_example` is one unbatched env state (arrays or
  jax.ShapeDtypeStruct: only shapes and dtypes are read)."""
  p, n, t = num_prompts, capacity, node_tokens
  zi = jnp.zeros((p, n), jnp.int32)
  zb = jnp.zeros((p, n), bool)
  zf = jnp.zeros((p, n), jnp.float32)
  env = jax.tree.map(lambda x: jnp.zeros((p, n) + x.shape, x.dtype), env_state_example)
  return Tree(parent=zi - 1, depth=zi, tree_id=zi, used=zb,
              tokens=jnp.zeros((p, n, t), jnp.int32), logprobs=jnp.zeros((p, n, t), jnp.float32),
              entropy=zf,
              policy_len=zi, obs_len=zi, ctx_len=zi, action=zi - 1, action_run=zi,
              score=zf + jnp.nan, reward=zf, ret=zf, tool_calls=zi, finished=zb, pruned=zb,
              truncated=zb,
              num_children=zi, env_state=env, size=jnp.zeros((p,), jnp.int32),
              prompt_id=jnp.arange(p, dtype=jnp.int32) if prompt_id is None
              else jnp.asarray(prompt_id, jnp.int32))


def allocate(tree: Tree, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Local ids for new nodes, one per True in `mask` [P, S], in order; -1 where masked out.

  Returns (ids [P, S], overflow [P]) where overflow marks prompts whose block is full (the
  requests that did not fit get -1).
  """
  mask = mask.astype(bool)
  offs = jnp.cumsum(mask, axis=1) - 1
  ids = tree.size[:, None] + offs
  fits = ids < tree.capacity
  ids = jnp.where(mask & fits, ids, -1)
  overflow = jnp.any(mask & ~fits, axis=1)
  return ids, overflow


def _rows(x, p_idx, ids):
  return x[p_idx, jnp.maximum(ids, 0)]


def gather(tree_field: jax.Array, ids: jax.Array) -> jax.Array:
  """field[p, ids[p, s]] for ids [P, S] (ids < 0 read slot 0; mask the result yourself)."""
  p_idx = jnp.arange(ids.shape[0])[:, None]
  return _rows(tree_field, p_idx, ids)


def gather_env(env_state: Any, ids: jax.Array) -> Any:
  return jax.tree.map(lambda x: gather(x, ids), env_state)


def scatter(field: jax.Array, ids: jax.Array, values: jax.Array) -> jax.Array:
  """field[p, ids[p, s]] = values[p, s] where ids >= 0 (ids < 0 are dropped)."""
  p_idx = jnp.broadcast_to(jnp.arange(ids.shape[0])[:, None], ids.shape)
  safe = jnp.where(ids >= 0, ids, field.shape[1])  # out of bounds -> dropped
  return field.at[p_idx, safe].set(values, mode="drop")


def path_nodes(tree: Tree, max_depth: int) -> jax.Array:
  """Ancestors of every node, root first: int32 [P, N, max_depth + 1], -1 padded at the end."""
  n = tree.capacity

  def up(cur, _):
    par = jnp.where(cur >= 0, jnp.take_along_axis(tree.parent, jnp.maximum(cur, 0), axis=1), -1)
    return par, cur

  start = jnp.where(tree.used, jnp.arange(n, dtype=jnp.int32)[None], -1)
  _, chain = jax.lax.scan(up, start, None, length=max_depth + 1)  # [D+1, P, N], node first
  chain = jnp.moveaxis(chain, 0, -1)                             # [P, N, D+1] leaf..root
  # Reverse the valid prefix of each row so the root comes first.
  count = jnp.sum(chain >= 0, axis=-1, keepdims=True)
  k = jnp.arange(max_depth + 1)
  src = jnp.clip(count - 1 - k, 0, max_depth)
  out = jnp.take_along_axis(chain, src, axis=-1)
  return jnp.where(k < count, out, -1)


def leaf_ids(tree: Tree, max_leaves: int) -> tuple[jax.Array, jax.Array]:
  """Leaves of each prompt in creation order: (ids [P, max_leaves] with -1 fill, mask)."""
  ids = jax.vmap(lambda m: jnp.nonzero(m, size=max_leaves, fill_value=-1)[0])(tree.is_leaf)
  return ids.astype(jnp.int32), ids >= 0
