"""Flash attention over tree-packed rows (Pallas): each query block reads only the key blocks
that hold its tokens' ancestors, one block at a time with a running softmax, so no score matrix
larger than a block pair exists (memory O(T x block) per head, not O(T^2)) and masked blocks
cost neither bytes nor FLOPs.

The mask is one integer per key token. Packed rows lay each tree out depth-first (`pack_trees`),
so the tokens of a node's subtree are contiguous: query i sees key j iff `j <= i < kv_end[j]`,
`kv_end[j]` being the end of the subtree of j's node (`subtree_ends`); a padding token's end is
j + 1 (itself only). The (query block, key block) pairs to visit come from
`PackedBatch.kv_blocks`, flattened into one list per row (`pair_lists`) that the kernels' last
grid axis walks through scalar prefetch (`flash_layout` builds them and `kv_end` once per batch
for every layer): ordered by query block for the forward pass and dQ (the
output block stays in VMEM while its pairs run), by key block for dK and dV. The grid has as
many steps as the most pairs any row can hold (`max_pairs`), not blocks x blocks; steps past a
row's own count repeat its last pair without copying or computing.

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


# ----------------------------------------------------------------------------- pair lists

def max_pairs(num_blocks: int, width: int) -> int:
  """The most (query block, key block) pairs the lists can hold: query block i lists at most
  min(width, i + 1) key blocks (none after itself). The kernels' grid length."""
  return sum(min(width, i + 1) for i in range(num_blocks))


def pair_lists(lists: jax.Array, by_key: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Every listed (query block, key block) pair of each row, ordered by query block (then as
  listed) or, `by_key`, by key block (then by query block): (query blocks [B, P], key blocks
  [B, P], pairs per row [B]), P = `max_pairs`; entries past a row's count repeat its last."""
  b, nb, w = lists.shape
  total = max_pairs(nb, w)
  qb = jnp.broadcast_to(jnp.arange(nb, dtype=jnp.int32)[:, None], (nb, w)).reshape(-1)
  kb = lists.reshape(b, nb * w)
  valid = kb >= 0
  if by_key:
    key = jnp.where(valid, kb * nb + qb[None], nb * nb)
  else:
    key = jnp.where(valid, jnp.arange(nb * w, dtype=jnp.int32)[None], nb * w)
  order = jnp.argsort(key, axis=-1, stable=True)[:, :total]
  count = valid.sum(-1).astype(jnp.int32)
  order = jnp.take_along_axis(order, jnp.minimum(jnp.arange(total)[None], count[:, None] - 1),
                              axis=-1)
  return (jnp.take(qb, order).astype(jnp.int32),
          jnp.take_along_axis(kb, order, axis=-1).astype(jnp.int32), count)


def flash_layout(node_ids: jax.Array, ancestors: jax.Array, kv_blocks: jax.Array) -> dict:
  """What every layer's kernels read, computed once per batch: `kv_end` as [B, blocks, 1, block]
  (`subtree_ends`; a key block's entries are one tile, whatever the block size), and the pair
  lists by query block and by key block (`pair_lists`)."""
  b, t = node_ids.shape
  nb = kv_blocks.shape[1]
  lists = kv_blocks.astype(jnp.int32)
  return {"kv_end": subtree_ends(node_ids, ancestors).reshape(b, nb, 1, t // nb),
          "by_query": pair_lists(lists, False), "by_key": pair_lists(lists, True)}


def _edges(major, p):
  """Whether pair p is the first / last of its run of equal `major` blocks in its row."""
  b, n = pl.program_id(0), pl.num_programs(2)
  here = major[b, p]
  first = (p == 0) | (major[b, jnp.maximum(p - 1, 0)] != here)
  last = (p == n - 1) | (major[b, jnp.minimum(p + 1, n - 1)] != here)
  return first, last


# ----------------------------------------------------------------------------- forward

def _pair_loop(major, count, init, visit, finish):
  """The kernels' skeleton over a grid (B, KV, pairs): `init` at the first pair of a run of
  equal `major` blocks (the output block's), `visit` at each of the row's real pairs, `finish`
  at the run's last pair."""
  b, p = pl.program_id(0), pl.program_id(2)
  first, last = _edges(major, p)
  pl.when(first)(init)
  pl.when(p < count[b])(visit)
  pl.when(last)(finish)


def _fwd_kernel(pq, pk, count, q_ref, k_ref, v_ref, kend_ref, o_ref, lse_ref, m_s, l_s, acc_s,
                *, scale):
  b, p = pl.program_id(0), pl.program_id(2)
  g, bq, _ = q_ref.shape[2:]

  def init():
    m_s[...] = jnp.full(m_s.shape, NEG, jnp.float32)
    l_s[...] = jnp.zeros(l_s.shape, jnp.float32)
    acc_s[...] = jnp.zeros(acc_s.shape, jnp.float32)

  def visit():
    vis = _visible(pq[b, p], pk[b, p], bq, k_ref.shape[2], kend_ref[0, 0])
    k, v = k_ref[0, 0], v_ref[0, 0]
    for h in range(g):
      rows = slice(h * bq, (h + 1) * bq)
      sc = jnp.where(vis, _dot(q_ref[0, 0, h], k, ((1,), (1,))) * scale, NEG)
      m_old = m_s[rows, :1]
      m_new = jnp.maximum(m_old, sc.max(axis=1, keepdims=True))
      pr = jnp.where(vis, jnp.exp(sc - m_new), 0.0)
      corr = jnp.exp(m_old - m_new)
      l_s[rows, :1] = l_s[rows, :1] * corr + pr.sum(axis=1, keepdims=True)
      acc_s[rows, :] = acc_s[rows, :] * corr + _dot(pr.astype(v.dtype), v, ((1,), (0,)))
      m_s[rows, :1] = m_new

  def finish():
    for h in range(g):
      rows = slice(h * bq, (h + 1) * bq)
      o_ref[0, 0, h] = (acc_s[rows, :] / l_s[rows, :1]).astype(o_ref.dtype)
      lse_ref[0, 0, h] = m_s[rows, :1] + jnp.log(l_s[rows, :1])

  _pair_loop(pq, count, init, visit, finish)


def _specs(g, block, d):
  """BlockSpecs for a grid (B, KV, pairs): q / dO / dQ and lse / delta at the pair's query
  block, k / v / dK / dV and kv_end at its key block."""
  qspec = pl.BlockSpec((1, 1, g, block, d), lambda b, h, p, pq, pk, n: (b, h, 0, pq[b, p], 0))
  rowspec = pl.BlockSpec((1, 1, g, block, 1), lambda b, h, p, pq, pk, n: (b, h, 0, pq[b, p], 0))
  kspec = pl.BlockSpec((1, 1, block, d), lambda b, h, p, pq, pk, n: (b, h, pk[b, p], 0))
  endspec = pl.BlockSpec((1, 1, 1, block), lambda b, h, p, pq, pk, n: (b, pk[b, p], 0, 0))
  return qspec, rowspec, kspec, endspec


def _cost(shape, block: int, pairs: int, matmuls: int, pair_bytes: int, once_bytes: int):
  """XLA's cost of a kernel (`pl.CostEstimate`) over q of `shape` [B, KV, G, T, D] visiting
  `pairs` (query block, key block) pairs per row and KV head (`max_pairs`: an upper bound on
  what runs), each taking `matmuls` [block x block x D] products per query head and
  `pair_bytes` of copies; `once_bytes` move once."""
  b, kvh, g, _, d = shape
  n = b * kvh * pairs
  return pl.CostEstimate(flops=int(2 * matmuls * n * g * block * block * d),
                         transcendentals=int(n * g * block * block),
                         bytes_accessed=int(n * pair_bytes + once_bytes))


def _params():
  return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))


def _call(kernel, pairs, in_specs, out_specs, out_shape, scratch, cost, interpret, *args):
  """One kernel over the grid (B, KV, pairs) with the pair lists `pairs` prefetched."""
  b, kvh = args[0].shape[:2]
  return pl.pallas_call(
      kernel, interpret=interpret, cost_estimate=cost, out_shape=out_shape,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3, grid=(b, kvh, pairs[0].shape[1]), in_specs=in_specs,
          out_specs=out_specs, scratch_shapes=scratch),
      compiler_params=_params(),
  )(*pairs, *args)


def _forward(q, k, v, layout, interpret):
  b, kvh, g, t, d = q.shape
  kend, pairs = layout["kv_end"], layout["by_query"]
  block = kend.shape[3]
  qspec, rowspec, kspec, endspec = _specs(g, block, d)
  kv_pair = 2 * block * d * k.dtype.itemsize + 4 * block           # a K and a V block, kv_end
  rows = b * kvh * g * t * 4                                         # one float32 per query
  cost = _cost(q.shape, block, pairs[0].shape[1], 2, kv_pair, 2 * q.size * q.dtype.itemsize + rows)
  return _call(
      functools.partial(_fwd_kernel, scale=d ** -0.5), pairs,
      [qspec, kspec, kspec, endspec], [qspec, rowspec],
      (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, kvh, g, t, 1), jnp.float32)),
      [pltpu.VMEM((g * block, 128), jnp.float32), pltpu.VMEM((g * block, 128), jnp.float32),
       pltpu.VMEM((g * block, d), jnp.float32)], cost, interpret, q, k, v, kend)


# ----------------------------------------------------------------------------- backward

def _grad_terms(refs, h, vis, scale):
  """Query head h of a pair: the probabilities recomputed from the saved log-sum-exp, and
  dS = P * (dO V^T - delta)."""
  q_ref, k_ref, v_ref, lse_ref, do_ref, delta_ref = refs
  sc = _dot(q_ref[0, 0, h], k_ref[0, 0], ((1,), (1,))) * scale
  pr = jnp.where(vis, jnp.exp(sc - lse_ref[0, 0, h]), 0.0)
  return pr, pr * (_dot(do_ref[0, 0, h], v_ref[0, 0], ((1,), (1,))) - delta_ref[0, 0, h])


def _dq_kernel(pq, pk, count, q_ref, k_ref, v_ref, kend_ref, lse_ref, do_ref, delta_ref,
               dq_ref, dq_s, *, scale):
  b, p = pl.program_id(0), pl.program_id(2)
  g, bq, _ = q_ref.shape[2:]
  refs = (q_ref, k_ref, v_ref, lse_ref, do_ref, delta_ref)

  def init():
    dq_s[...] = jnp.zeros(dq_s.shape, jnp.float32)

  def visit():
    vis = _visible(pq[b, p], pk[b, p], bq, k_ref.shape[2], kend_ref[0, 0])
    k = k_ref[0, 0]
    for h in range(g):
      _, ds = _grad_terms(refs, h, vis, scale)
      dq_s[h * bq:(h + 1) * bq, :] += _dot(ds.astype(k.dtype), k, ((1,), (0,))) * scale

  def finish():
    for h in range(g):
      dq_ref[0, 0, h] = dq_s[h * bq:(h + 1) * bq, :].astype(dq_ref.dtype)

  _pair_loop(pq, count, init, visit, finish)


def _dkv_kernel(pq, pk, count, q_ref, k_ref, v_ref, kend_ref, lse_ref, do_ref, delta_ref,
                dk_ref, dv_ref, dk_s, dv_s, *, scale):
  b, p = pl.program_id(0), pl.program_id(2)
  g, bq, _ = q_ref.shape[2:]
  refs = (q_ref, k_ref, v_ref, lse_ref, do_ref, delta_ref)

  def init():
    dk_s[...] = jnp.zeros(dk_s.shape, jnp.float32)
    dv_s[...] = jnp.zeros(dv_s.shape, jnp.float32)

  def visit():
    vis = _visible(pq[b, p], pk[b, p], bq, k_ref.shape[2], kend_ref[0, 0])
    for h in range(g):
      q, do = q_ref[0, 0, h], do_ref[0, 0, h]
      pr, ds = _grad_terms(refs, h, vis, scale)
      dv_s[...] += _dot(pr.astype(do.dtype), do, ((0,), (0,)))
      dk_s[...] += _dot(ds.astype(q.dtype), q, ((0,), (0,))) * scale

  def finish():
    dk_ref[0, 0] = dk_s[...].astype(dk_ref.dtype)
    dv_ref[0, 0] = dv_s[...].astype(dv_ref.dtype)

  _pair_loop(pk, count, init, visit, finish)


def _backward(q, k, v, layout, o, lse, do, interpret):
  b, kvh, g, t, d = q.shape
  kend = layout["kv_end"]
  block, pairs = kend.shape[3], layout["by_query"][0].shape[1]
  delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
  qspec, rowspec, kspec, endspec = _specs(g, block, d)
  ins = [qspec, kspec, kspec, endspec, rowspec, qspec, rowspec]
  args = (q, k, v, kend, lse, do, delta)
  qbytes, kbytes, rows = q.size * q.dtype.itemsize, k.size * k.dtype.itemsize, b * kvh * g * t * 4
  kv_pair = 2 * block * d * k.dtype.itemsize + 4 * block
  q_pair = 2 * g * block * (d * q.dtype.itemsize + 4)                # q and dO blocks, lse, delta
  dq = _call(functools.partial(_dq_kernel, scale=d ** -0.5), layout["by_query"], ins,
             qspec, jax.ShapeDtypeStruct(q.shape, q.dtype),
             [pltpu.VMEM((g * block, d), jnp.float32)],
             _cost(q.shape, block, pairs, 3, kv_pair, 3 * qbytes + 2 * rows), interpret, *args)
  dk, dv = _call(functools.partial(_dkv_kernel, scale=d ** -0.5), layout["by_key"], ins,
                 [kspec, kspec], (jax.ShapeDtypeStruct(k.shape, k.dtype),
                                  jax.ShapeDtypeStruct(v.shape, v.dtype)),
                 [pltpu.VMEM((block, d), jnp.float32), pltpu.VMEM((block, d), jnp.float32)],
                 _cost(q.shape, block, pairs, 4, q_pair, 4 * kbytes + b * t * 4), interpret,
                 *args)
  return dq, dk, dv


# ----------------------------------------------------------------------------- the op

@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, layout, interpret):
  return _forward(q, k, v, layout, interpret)[0]


def _flash_fwd(q, k, v, layout, interpret):
  o, lse = _forward(q, k, v, layout, interpret)
  return o, (q, k, v, layout, o, lse)


def _flash_bwd(interpret, res, do):
  q, k, v, layout, o, lse = res
  dq, dk, dv = _backward(q, k, v, layout, o, lse, do, interpret)
  return dq, dk, dv, jax.tree.map(lambda _: None, layout)


_flash.defvjp(_flash_fwd, _flash_bwd)


def tree_flash_attention(q, k, v, layout: dict, *, interpret: bool = False):
  """Attention of packed rows: q [B,T,H,D], k/v [B,T,KV,D], `layout` of `flash_layout` (its
  `kv_end` gives the block size). Returns [B,T,H,D]; differentiable in q, k and v."""
  b, t, h, d = q.shape
  kvh = k.shape[2]
  g = h // kvh
  qh = q.reshape(b, t, kvh, g, d).transpose(0, 2, 3, 1, 4)          # [B, KV, G, T, D]
  kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)          # [B, KV, T, D]
  out = _flash(qh, kh, vh, layout, interpret)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)
