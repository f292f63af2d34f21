"""Flash attention over tree-packed rows (Pallas): each query block reads only the key blocks
that hold its tokens' ancestors, one block at a time with a running softmax, so no score matrix
larger than a block pair exists (memory O(T x block) per head, not O(T^2)) and masked blocks
cost neither bytes nor FLOPs.

The mask is one integer per key token. Packed rows lay each tree out depth-first (`pack_trees`),
so the tokens of a node's subtree are contiguous: query i sees key j iff `j <= i < kv_end[j]`,
`kv_end[j]` being the end of the subtree of j's node (`subtree_ends`); a padding token's end is
j + 1 (itself only). The key blocks a query block visits are `PackedBatch.kv_blocks` (visible
first, -1 pads), read through scalar prefetch, so a block past a list's count is neither copied
nor computed; the backward pass walks the transposed lists (the query blocks that see each key
block) for dK and dV, the forward lists for dQ.

Grouped-query heads: one program takes the G query heads of one KV head, so each key block is
copied once for all of them. The same kernels run on any backend in Pallas' interpret mode (the
tests' CPU path); compiled, they target TPUs (Mosaic; blocks of 128 tokens or more).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

NEG = -1e30


def subtree_ends(node_ids: jax.Array, ancestors: jax.Array) -> jax.Array:
  """[B, T] int32: for key token j, one past the last token of its node's subtree in the row
  (padding: j + 1). Exact for rows laid out depth-first, as `pack_trees` lays them."""
  b, t = node_ids.shape
  m = ancestors.shape[1]
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  real = node_ids >= 0
  nid = jnp.where(real, node_ids, 0)
  last = jnp.full((b, m), -1, jnp.int32).at[jnp.arange(b)[:, None], nid].max(
      jnp.where(real, pos, -1))                                     # [B, M] last token of node
  # ancestors[b, q, n]: n is q's ancestor or q itself; the subtree of n ends after its last
  # descendant's last token
  ends = jnp.max(jnp.where(ancestors, last[:, :, None], -1), axis=1) + 1        # [B, M]
  return jnp.where(real, jnp.take_along_axis(ends, nid, axis=1), pos + 1).astype(jnp.int32)


def _visible(qblk, kblk, bq, bk, kend):
  """[bq, bk] bool: query i sees key j iff j <= i < kv_end[j]."""
  qpos = qblk * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
  kpos = kblk * bk + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
  return (kpos <= qpos) & (qpos < kend)


def _dot(a, b, contract):
  """A float32-accumulated product; float32 operands at full precision, others (bf16) as they
  are (an explicit precision: a process-wide `jax_default_matmul_precision` of "highest" would
  ask Mosaic for fp32 passes over bf16 operands, which it refuses)."""
  full = a.dtype == jnp.float32 and b.dtype == jnp.float32
  return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32,
                             precision=jax.lax.Precision.HIGHEST if full else
                             jax.lax.Precision.DEFAULT)


def _pick(lists, counts, b, i, s):
  """The s-th block of list (b, i), the last real one for steps past its count (no new copy)."""
  return lists[b, i, jnp.minimum(s, counts[b, i] - 1)]


# ----------------------------------------------------------------------------- forward

def _fwd_kernel(lists, counts, q_ref, k_ref, v_ref, kend_ref, o_ref, lse_ref, m_s, l_s, acc_s,
                *, scale):
  b, i, s = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  g, bq, _ = q_ref.shape[2:]
  bk = k_ref.shape[2]

  @pl.when(s == 0)
  def _():
    m_s[...] = jnp.full(m_s.shape, NEG, jnp.float32)
    l_s[...] = jnp.zeros(l_s.shape, jnp.float32)
    acc_s[...] = jnp.zeros(acc_s.shape, jnp.float32)

  @pl.when(s < counts[b, i])
  def _():
    kblk = lists[b, i, s]
    vis = _visible(i, kblk, bq, bk, kend_ref[0])
    k, v = k_ref[0, 0], v_ref[0, 0]
    for h in range(g):
      rows = slice(h * bq, (h + 1) * bq)
      sc = jnp.where(vis, _dot(q_ref[0, 0, h], k, ((1,), (1,))) * scale, NEG)
      m_old = m_s[rows, :1]
      m_new = jnp.maximum(m_old, sc.max(axis=1, keepdims=True))
      p = jnp.where(vis, jnp.exp(sc - m_new), 0.0)
      corr = jnp.exp(m_old - m_new)
      l_s[rows, :1] = l_s[rows, :1] * corr + p.sum(axis=1, keepdims=True)
      acc_s[rows, :] = acc_s[rows, :] * corr + _dot(p.astype(v.dtype), v, ((1,), (0,)))
      m_s[rows, :1] = m_new

  @pl.when(s == pl.num_programs(3) - 1)
  def _():
    for h in range(g):
      rows = slice(h * bq, (h + 1) * bq)
      o_ref[0, 0, h] = (acc_s[rows, :] / l_s[rows, :1]).astype(o_ref.dtype)
      lse_ref[0, 0, h] = m_s[rows, :1] + jnp.log(l_s[rows, :1])


def _specs(g, bq, bk, d, query_side: bool):
  """BlockSpecs of q / do / lse / delta (query blocks) and k / v / kv_end (key blocks) for a
  grid (B, KV, outer, inner) whose inner axis walks a block list; `query_side`: the outer axis
  is a query block (forward lists), else a key block (transposed lists)."""
  def qi(b, h, o, s, lists, counts):
    return o if query_side else _pick(lists, counts, b, o, s)

  def ki(b, h, o, s, lists, counts):
    return _pick(lists, counts, b, o, s) if query_side else o

  qspec = pl.BlockSpec((1, 1, g, bq, d), lambda *a: (a[0], a[1], 0, qi(*a), 0))
  rowspec = pl.BlockSpec((1, 1, g, bq, 1), lambda *a: (a[0], a[1], 0, qi(*a), 0))
  kspec = pl.BlockSpec((1, 1, bk, d), lambda *a: (a[0], a[1], ki(*a), 0))
  endspec = pl.BlockSpec((1, 1, bk), lambda *a: (a[0], 0, ki(*a)))
  return qspec, rowspec, kspec, endspec


def max_pairs(num_blocks: int, width: int) -> int:
  """The most (query block, key block) pairs the lists can hold: query block i lists at most
  min(width, i + 1) key blocks (none after itself). A static bound on what the kernels compute
  (the lists' counts say what they do)."""
  return sum(min(width, i + 1) for i in range(num_blocks))


def _cost(shape, block: int, pairs: int, matmuls: int, pair_bytes: int, once_bytes: int):
  """XLA's cost of a kernel (`pl.CostEstimate`) over q of `shape` [B, KV, G, T, D] visiting
  `pairs` (query block, key block) pairs per row and KV head (`max_pairs`), each taking
  `matmuls` [block x block x D] products per query head and `pair_bytes` of copies;
  `once_bytes` move once."""
  b, kvh, g, _, d = shape
  n = b * kvh * pairs
  return pl.CostEstimate(flops=int(2 * matmuls * n * g * block * block * d),
                         transcendentals=int(n * g * block * block),
                         bytes_accessed=int(n * pair_bytes + once_bytes))


def _params():
  return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))


def _forward(q, k, v, kend, lists, counts, block, interpret):
  b, kvh, g, t, d = q.shape
  nb, w = lists.shape[1:]
  qspec, rowspec, kspec, endspec = _specs(g, block, block, d, True)
  spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2, grid=(b, kvh, nb, w),
      in_specs=[qspec, kspec, kspec, endspec], out_specs=[qspec, rowspec],
      scratch_shapes=[pltpu.VMEM((g * block, 128), jnp.float32),
                      pltpu.VMEM((g * block, 128), jnp.float32),
                      pltpu.VMEM((g * block, d), jnp.float32)])
  kv_pair = 2 * block * d * k.dtype.itemsize + 4 * block           # a K and a V block, kv_end
  rows = b * kvh * g * t * 4                                         # one float32 per query
  cost = _cost(q.shape, block, max_pairs(nb, w), 2, kv_pair, 2 * q.size * q.dtype.itemsize + rows)
  return pl.pallas_call(
      functools.partial(_fwd_kernel, scale=d ** -0.5), grid_spec=spec, interpret=interpret,
      cost_estimate=cost,
      out_shape=(jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, kvh, g, t, 1), jnp.float32)),
      compiler_params=_params(),
  )(lists, counts, q, k, v, kend)


# ----------------------------------------------------------------------------- backward

def _dq_kernel(lists, counts, q_ref, k_ref, v_ref, kend_ref, lse_ref, do_ref, delta_ref,
               dq_ref, dq_s, *, scale):
  b, i, s = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  g, bq, _ = q_ref.shape[2:]
  bk = k_ref.shape[2]

  @pl.when(s == 0)
  def _():
    dq_s[...] = jnp.zeros(dq_s.shape, jnp.float32)

  @pl.when(s < counts[b, i])
  def _():
    vis = _visible(i, lists[b, i, s], bq, bk, kend_ref[0])
    k, v = k_ref[0, 0], v_ref[0, 0]
    for h in range(g):
      rows = slice(h * bq, (h + 1) * bq)
      sc = _dot(q_ref[0, 0, h], k, ((1,), (1,))) * scale
      p = jnp.where(vis, jnp.exp(sc - lse_ref[0, 0, h]), 0.0)
      dp = _dot(do_ref[0, 0, h], v, ((1,), (1,)))
      ds = p * (dp - delta_ref[0, 0, h])
      dq_s[rows, :] += _dot(ds.astype(k.dtype), k, ((1,), (0,))) * scale

  @pl.when(s == pl.num_programs(3) - 1)
  def _():
    for h in range(g):
      dq_ref[0, 0, h] = dq_s[h * bq:(h + 1) * bq, :].astype(dq_ref.dtype)


def _dkv_kernel(lists, counts, q_ref, k_ref, v_ref, kend_ref, lse_ref, do_ref, delta_ref,
                dk_ref, dv_ref, dk_s, dv_s, *, scale):
  b, j, s = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  g, bq, _ = q_ref.shape[2:]
  bk = k_ref.shape[2]

  @pl.when(s == 0)
  def _():
    dk_s[...] = jnp.zeros(dk_s.shape, jnp.float32)
    dv_s[...] = jnp.zeros(dv_s.shape, jnp.float32)

  @pl.when(s < counts[b, j])
  def _():
    vis = _visible(lists[b, j, s], j, bq, bk, kend_ref[0])
    k, v = k_ref[0, 0], v_ref[0, 0]
    for h in range(g):
      q, do = q_ref[0, 0, h], do_ref[0, 0, h]
      sc = _dot(q, k, ((1,), (1,))) * scale
      p = jnp.where(vis, jnp.exp(sc - lse_ref[0, 0, h]), 0.0)
      dv_s[...] += _dot(p.astype(do.dtype), do, ((0,), (0,)))
      ds = p * (_dot(do, v, ((1,), (1,))) - delta_ref[0, 0, h])
      dk_s[...] += _dot(ds.astype(q.dtype), q, ((0,), (0,))) * scale

  @pl.when(s == pl.num_programs(3) - 1)
  def _():
    dk_ref[0, 0] = dk_s[...].astype(dk_ref.dtype)
    dv_ref[0, 0] = dv_s[...].astype(dv_ref.dtype)


def transposed_lists(lists: jax.Array) -> tuple[jax.Array, jax.Array]:
  """For key block j, the query blocks whose lists hold it (ascending, -1 pads) and their
  count: [B, NB, NB] and [B, NB]."""
  b, nb, _ = lists.shape
  seen = jnp.zeros((b, nb + 1, nb), bool).at[
      jnp.arange(b)[:, None, None], jnp.where(lists >= 0, lists, nb),
      jnp.arange(nb)[None, :, None]].set(True)[:, :nb]              # [B, key block, query block]
  order = jnp.argsort(~seen, axis=-1, stable=True).astype(jnp.int32)
  keep = jnp.take_along_axis(seen, order, axis=-1)
  return jnp.where(keep, order, -1), keep.sum(-1).astype(jnp.int32)


def _backward(q, k, v, kend, lists, counts, o, lse, do, block, interpret):
  b, kvh, g, t, d = q.shape
  nb, w = lists.shape[1:]
  delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
  qspec, rowspec, kspec, endspec = _specs(g, block, block, d, True)
  qbytes, kbytes, rows = q.size * q.dtype.itemsize, k.size * k.dtype.itemsize, b * kvh * g * t * 4
  kv_pair = 2 * block * d * k.dtype.itemsize + 4 * block
  q_pair = 2 * g * block * (d * q.dtype.itemsize + 4)                # q and dO blocks, lse, delta
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, scale=d ** -0.5), interpret=interpret,
      cost_estimate=_cost(q.shape, block, max_pairs(nb, w), 3, kv_pair, 3 * qbytes + 2 * rows),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=2, grid=(b, kvh, nb, w),
          in_specs=[qspec, kspec, kspec, endspec, rowspec, qspec, rowspec], out_specs=qspec,
          scratch_shapes=[pltpu.VMEM((g * block, d), jnp.float32)]),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), compiler_params=_params(),
  )(lists, counts, q, k, v, kend, lse, do, delta)
  tlists, tcounts = transposed_lists(lists)
  qspec, rowspec, kspec, endspec = _specs(g, block, block, d, False)
  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, scale=d ** -0.5), interpret=interpret,
      cost_estimate=_cost(q.shape, block, max_pairs(nb, w), 4, q_pair, 4 * kbytes + b * t * 4),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=2, grid=(b, kvh, nb, nb),
          in_specs=[qspec, kspec, kspec, endspec, rowspec, qspec, rowspec],
          out_specs=[kspec, kspec],
          scratch_shapes=[pltpu.VMEM((block, d), jnp.float32),
                          pltpu.VMEM((block, d), jnp.float32)]),
      out_shape=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
      compiler_params=_params(),
  )(tlists, tcounts, q, k, v, kend, lse, do, delta)
  return dq, dk, dv


# ----------------------------------------------------------------------------- the op

@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _flash(q, k, v, kend, lists, block, interpret):
  counts = (lists >= 0).sum(-1).astype(jnp.int32)
  return _forward(q, k, v, kend, lists, counts, block, interpret)[0]


def _flash_fwd(q, k, v, kend, lists, block, interpret):
  counts = (lists >= 0).sum(-1).astype(jnp.int32)
  o, lse = _forward(q, k, v, kend, lists, counts, block, interpret)
  return o, (q, k, v, kend, lists, counts, o, lse)


def _flash_bwd(block, interpret, res, do):
  q, k, v, kend, lists, counts, o, lse = res
  dq, dk, dv = _backward(q, k, v, kend, lists, counts, o, lse, do, block, interpret)
  return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def tree_flash_attention(q, k, v, kv_end, kv_blocks, *, interpret: bool = False):
  """Attention of packed rows: q [B,T,H,D], k/v [B,T,KV,D], kv_end [B,T] (`subtree_ends`),
  kv_blocks [B, T // block, W] (`PackedBatch.kv_blocks`; the block size is T // its second
  dimension). Returns [B,T,H,D]; differentiable in q, k and v."""
  b, t, h, d = q.shape
  kvh = k.shape[2]
  g, block = h // kvh, t // kv_blocks.shape[1]
  qh = q.reshape(b, t, kvh, g, d).transpose(0, 2, 3, 1, 4)          # [B, KV, G, T, D]
  kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)          # [B, KV, T, D]
  out = _flash(qh, kh, vh, kv_end.astype(jnp.int32)[:, None, :], kv_blocks.astype(jnp.int32),
               block, interpret)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)
