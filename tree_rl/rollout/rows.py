"""Rows of a turn: where each node's sampler slot lives, and how a turn's requests are compacted
into a few fixed row counts.

The cache splits its slots over the data axis: prompt p lives on data shard p // (P / shards),
with `Layout.capacity` slots per prompt in that shard's block. The sampler splits a call's rows
over the same axis in equal blocks, so every row set here is compacted per data shard
(`shard_rows`) and padded to one of at most four row counts (`shard_width`): a run meets every
shape early and compiles each once.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tree_rl.buckets import pow2_bucket


@dataclasses.dataclass(frozen=True)
class Layout:
  """Static shape of one rollout batch."""

  num_prompts: int   # P
  capacity: int      # N node slots per prompt
  slots: int         # S branches per prompt per turn
  num_trees: int     # trees per prompt (roots at nodes 0..num_trees-1)


def slot_ids(wp, nodes, layout: Layout, shards: int, seqs_per_shard: int) -> jax.Array:
  """The sampler slot of node `nodes` of batch prompt `wp`: prompt p lives on data shard
  p // (P / shards), in that shard's slot block, with `layout.capacity` slots per prompt."""
  per = layout.num_prompts // shards
  wp = jnp.asarray(wp, jnp.int32)
  return ((wp // per) * seqs_per_shard + (wp % per) * layout.capacity
          + jnp.maximum(nodes, 0)).astype(jnp.int32)


def layout_slots(layout: Layout, shards: int, seqs_per_shard: int) -> np.ndarray:
  """Slots [P, N] of every node of a layout (host arithmetic: nothing compiled)."""
  per = layout.num_prompts // shards
  p = np.arange(layout.num_prompts)[:, None]
  return ((p // per) * seqs_per_shard + (p % per) * layout.capacity
          + np.arange(layout.capacity)[None, :]).astype(np.int32)


def node_keys(key, prompt_ids, nodes) -> jax.Array:
  """Keys [W] of new nodes: fold_in(fold_in(key, prompt id), node), so a node's randomness is a
  function of its prompt's id (its stream position) and its place in the tree only, never of
  where its row sits in a batch, a shard or a host."""
  return jax.vmap(lambda p, n: jax.random.fold_in(jax.random.fold_in(key, p), n))(
      prompt_ids, jnp.maximum(nodes, 0))


def busiest_shard(mask: jax.Array, shards: int, xp=jnp) -> jax.Array:
  """The most True entries of `mask` (any shape, [P, ...] split into `shards` equal blocks of
  prompts; int ids count where >= 0) held by one data shard. xp: the array module (numpy for
  host arrays: nothing compiled)."""
  mask = mask if mask.dtype == xp.bool_ else mask >= 0
  return xp.max(xp.sum(mask.reshape(shards, -1), axis=1)).astype(xp.int32)


def shard_rows(mask: jax.Array, shards: int, width: int) -> jax.Array:
  """Indices [width] of the True entries of `mask` [M], compacted per data shard: the M
  entries form `shards` equal blocks and block d's entries fill rows [d*w, (d+1)*w) (w =
  width / shards), -1 where a block has fewer; so the sampler, which splits rows over the data
  axis in equal blocks, finds each row on the shard that holds its slot."""
  m = mask.shape[0] // shards
  w = width // shards
  local = jax.vmap(lambda b: jnp.nonzero(b, size=w, fill_value=-1)[0])(mask.reshape(shards, m))
  base = (jnp.arange(shards) * m)[:, None]
  return jnp.where(local >= 0, local + base, -1).reshape(-1).astype(jnp.int32)


def shard_width(busiest: int, shards: int, full: int, bucketed: bool) -> int:
  """Rows for entries laid out by `shard_rows` when the busiest data shard holds `busiest`:
  `full` unbucketed, else shards x a power of two of `busiest` of at least an eighth of a
  shard's rows: at most four row counts per layout, so a run meets them all early (the few
  rows of the last turns pad to that eighth)."""
  if not bucketed:
    return full
  per = full // shards
  return shards * pow2_bucket(busiest, pow2_bucket(max(1, per // 8), 1, per), per)


def row_counts(layout: Layout, shards: int, bucketed: bool) -> list[int]:
  """Every row count a turn of `layout` can decode over (`shard_width` of each possible
  busiest-shard request count)."""
  per = layout.num_prompts * layout.slots // shards
  return sorted({shard_width(b, shards, per * shards, bucketed) for b in range(1, per + 1)})


def bucket_requests(layout: Layout, shards: int, bucketed: bool) -> list[np.ndarray]:
  """Parent requests [P, S] whose turn decodes over each of `row_counts` in turn: children of
  the first root, the most requests per shard that fit the row count (nothing compiled)."""
  per_prompts = layout.num_prompts // shards
  out = []
  for width in row_counts(layout, shards, bucketed):
    want = min(width // shards, per_prompts * layout.slots)
    block = np.where(np.arange(per_prompts * layout.slots) < want, 0, -1)
    out.append(np.tile(block, shards).reshape(layout.num_prompts, layout.slots).astype(np.int32))
  return out


@struct.dataclass
class TurnPlan:
  """One turn's branch requests compacted into W rows (row w: one new child node)."""

  prompt: jax.Array   # int32 [W] prompt of the row (0 on padding rows)
  parent: jax.Array   # int32 [W] parent node (-1 on padding rows)
  child: jax.Array    # int32 [W] new child node (-1 on padding rows)
  valid: jax.Array    # bool [W] the row is a real request
  fork: jax.Array     # bool [W] the child branches off a parent that already has a child
  temperature: jax.Array   # float32 [W] sampling temperature of the row's request slot (0: greedy)


def fork_rows(plan: TurnPlan, shards: int, width: int):
  """The forked rows of a plan compacted into `width` rows (grouped by shard): rows, valid."""
  if width == plan.fork.shape[0]:
    return jnp.arange(width), plan.fork
  idx = shard_rows(plan.fork, shards, width)
  return jnp.maximum(idx, 0), idx >= 0


@struct.dataclass
class ObsRows:
  """A turn's observations to prefill, on the rows of the branches that go on (compacted by data
  shard like decode rows, `shard_rows`; padding rows invalid)."""

  prompt: jax.Array    # int32 [R] prompt of the row
  slots: jax.Array     # int32 [R] the child's sampler slot
  obs: jax.Array       # int32 [R, obs_capacity]
  obs_len: jax.Array   # int32 [R] (0 on padding rows)
  valid: jax.Array     # bool [R]

  @staticmethod
  def going(prompt, slots, obs, obs_len, need_obs, shards: int, width: int) -> "ObsRows":
    """The rows of `need_obs` [W] (grouped by data shard) compacted into `width` rows."""
    idx = shard_rows(need_obs, shards, width)
    ok = idx >= 0
    i = jnp.maximum(idx, 0)
    return ObsRows(prompt=prompt[i], slots=slots[i], obs=obs[i],
                   obs_len=jnp.where(ok, obs_len[i], 0), valid=ok)

  def chunk(self, start, tokens: int):
    """Tokens [start, start + tokens) of the observations (start traced: one program per row
    count): tokens [R, tokens], lengths (at least 1), valid (rows with tokens there)."""
    obs = jnp.pad(self.obs, ((0, 0), (0, tokens)))
    part = jax.lax.dynamic_slice_in_dim(obs, start, tokens, axis=1)
    lens = jnp.clip(self.obs_len - start, 0, tokens)
    return part, jnp.maximum(lens, 1), self.valid & (lens > 0)
