"""Token views of a rollout tree for the learner.

- `path_sequences`: one root-to-node sequence per selected node (usually the leaves): tokens,
  loss mask (policy tokens 1, prompt/observation tokens 0), sampler log-probs, positions.
- `packed_sequences`: per prompt, every node's tokens once (nodes in creation order, which puts
  parents before children), with each token's node, its position on its own root path, and
  the ancestor relation; `packed_attention_mask` expands it to the [T, T] mask the
  transformer's `attention_mask` takes (a token sees earlier tokens of its own node and all
  tokens of its ancestors).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from tree_rl.rollout.tree import Tree, ancestor_matrix, path_nodes


@struct.dataclass
class PathBatch:
  """Root-to-node sequences [P, L, T] (left-aligned, zero padded)."""

  tokens: jax.Array      # int32
  loss_mask: jax.Array   # bool: policy tokens
  logprobs: jax.Array    # float32 sampler log-probs (0 where loss_mask is False)
  positions: jax.Array   # int32 0..len-1 (0 in the padding)
  valid: jax.Array       # bool token is inside the sequence
  lengths: jax.Array     # int32 [P, L]


def path_sequences(tree: Tree, node_ids: jax.Array, max_len: int, max_depth: int) -> PathBatch:
  """Sequences of the root..node paths for `node_ids` [P, L] (-1 gives an empty row).

  `max_depth` bounds the depth of any node (the turn limit); tokens past `max_len` are cut.
  """
  paths = path_nodes(tree, max_depth)                                   # [P, N, D+1]
  p_idx = jnp.arange(tree.num_prompts)[:, None]
  rows = paths[p_idx, jnp.maximum(node_ids, 0)]                         # [P, L, D+1]
  rows = jnp.where(node_ids[..., None] >= 0, rows, -1)
  seg_len = jnp.where(rows >= 0, tree.length[p_idx[..., None], jnp.maximum(rows, 0)], 0)
  ends = jnp.cumsum(seg_len, axis=-1)                                   # [P, L, D+1]
  starts = ends - seg_len
  total = ends[..., -1]
  t = jnp.arange(max_len)
  seg = jnp.sum(ends[..., None, :] <= t[:, None], axis=-1)              # [P, L, T]
  seg = jnp.minimum(seg, max_depth)
  node = jnp.take_along_axis(rows, seg, axis=-1)
  within = t - jnp.take_along_axis(starts, seg, axis=-1)
  valid = (t < total[..., None]) & (node >= 0)
  pp = p_idx[..., None]
  safe_node, safe_within = jnp.maximum(node, 0), jnp.clip(within, 0, tree.node_tokens - 1)
  tokens = jnp.where(valid, tree.tokens[pp, safe_node, safe_within], 0)
  policy = valid & (within < tree.policy_len[pp, safe_node])
  logprobs = jnp.where(policy, tree.logprobs[pp, safe_node, safe_within], 0.0)
  return PathBatch(tokens=tokens, loss_mask=policy, logprobs=logprobs,
                   positions=jnp.where(valid, t, 0).astype(jnp.int32), valid=valid,
                   lengths=jnp.minimum(total, max_len).astype(jnp.int32))


@struct.dataclass
class PackedBatch:
  """Each prompt's nodes packed once: token arrays [P, T], ancestor relation [P, N, N]."""

  tokens: jax.Array      # int32 [P, T]
  loss_mask: jax.Array   # bool [P, T] policy tokens
  logprobs: jax.Array    # float32 [P, T]
  positions: jax.Array   # int32 [P, T] position on the token's own root path
  node: jax.Array        # int32 [P, T] local node id of each token (-1 in the padding)
  valid: jax.Array       # bool [P, T]
  ancestor: jax.Array    # bool [P, N, N] [p, i, j]: j is i or an ancestor of i
  num_tokens: jax.Array  # int32 [P] packed length (tokens past max_len are cut)


def packed_sequences(tree: Tree, max_len: int, max_depth: int) -> PackedBatch:
  """Pack every used node of each prompt once, in node order, into `max_len` tokens."""
  n, tn = tree.capacity, tree.node_tokens
  length = jnp.where(tree.used, tree.length, 0)                          # [P, N]
  ends = jnp.cumsum(length, axis=1)
  starts = ends - length
  anc = ancestor_matrix(tree, max_depth)
  # Context before each node = lengths of its strict ancestors.
  strict = anc & ~jnp.eye(n, dtype=bool)[None]
  before = jnp.einsum("pij,pj->pi", strict.astype(jnp.int32), length)
  t = jnp.arange(max_len)
  node = jnp.sum(ends[:, None, :] <= t[None, :, None], axis=-1)          # [P, T]
  node = jnp.minimum(node, n - 1)
  within = t[None] - jnp.take_along_axis(starts, node, axis=1)
  valid = t[None] < ends[:, -1:]
  p_idx = jnp.arange(tree.num_prompts)[:, None]
  safe_within = jnp.clip(within, 0, tn - 1)
  tokens = jnp.where(valid, tree.tokens[p_idx, node, safe_within], 0)
  policy = valid & (within < tree.policy_len[p_idx, node])
  logprobs = jnp.where(policy, tree.logprobs[p_idx, node, safe_within], 0.0)
  positions = jnp.where(valid, jnp.take_along_axis(before, node, axis=1) + within, 0)
  return PackedBatch(tokens=tokens, loss_mask=policy, logprobs=logprobs,
                     positions=positions.astype(jnp.int32), node=jnp.where(valid, node, -1),
                     valid=valid, ancestor=anc,
                     num_tokens=jnp.minimum(ends[:, -1], max_len).astype(jnp.int32))


def packed_attention_mask(packed: PackedBatch) -> jax.Array:
  """bool [P, T, T] (query, key): key is in the query's node at or before it, or in an ancestor."""
  q, k = packed.node[:, :, None], packed.node[:, None, :]
  p_idx = jnp.arange(packed.node.shape[0])[:, None, None]
  anc = packed.ancestor[p_idx, jnp.maximum(q, 0), jnp.maximum(k, 0)]
  t = packed.node.shape[1]
  causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
  same = q == k
  ok = jnp.where(same, causal[None], anc)
  return ok & packed.valid[:, :, None] & packed.valid[:, None, :]


def leaf_token_membership(packed: PackedBatch, leaf_ids: jax.Array) -> jax.Array:
  """bool [P, T, L]: packed token t lies on the root path of leaf l (for per-leaf loss weights)."""
  p_idx = jnp.arange(packed.node.shape[0])[:, None, None]
  leaf = leaf_ids[:, None, :]
  tok_node = packed.node[:, :, None]
  on = packed.ancestor[p_idx, jnp.maximum(leaf, 0), jnp.maximum(tok_node, 0)]
  return on & (leaf >= 0) & packed.valid[:, :, None]
