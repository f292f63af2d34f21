"""Root-to-node token sequences of a rollout tree, on device: what a process scorer reads and
what the no-sharing baseline re-encodes (the learner's layouts are built on the host by
`tree_rl.learner.from_rollout`).

`path_sequences`: one root-to-node sequence per selected node: tokens, loss mask (policy tokens
1, prompt/observation tokens 0), sampler log-probs, positions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from tree_rl.rollout.tree import Tree, path_nodes


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
