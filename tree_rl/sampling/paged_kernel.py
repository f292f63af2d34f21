"""Decode attention over each row's pages read in place (Pallas): the private window part of
the cascade layout (`attention.attend`), without gathering the pages into a dense copy first.

One grid step takes one row and `pages_per_block` entries of its window: it copies those pages
of the layer from the pool (HBM) into VMEM with one DMA each (pages past the row's count are
not copied), scores the row's query heads against them and folds the result into a running
softmax. The output is that part's unnormalised sum, running max and denominator, which
`attention.attend` merges with the other parts (shared pages, the turn's own keys).

The pool layout is the sampler's, `[L, pages, page_size, KV * D]`: one page of one layer is a
`[16, 128]` bf16 tile at Qwen2.5's KV = 2, D = 64. The same kernel runs on any backend in Pallas'
interpret mode (the tests' CPU path); compiled, it targets TPUs (Mosaic).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

NEG = -1e30
_VALID_BITS = 8   # a window entry packs page << 8 | valid tokens (page_size <= 255)


def pack_window(table: jax.Array, valid_tokens: jax.Array, num_pages: int) -> jax.Array:
  """One int32 per window entry: the page id and how many of its tokens are visible."""
  return jnp.left_shift(jnp.clip(table, 0, num_pages - 1), _VALID_BITS) | valid_tokens


def _kernel(count_ref, window_ref, q_ref, k_hbm, v_hbm, o_ref, m_ref, l_ref,
            kbuf, vbuf, sem, m_s, l_s, acc_s, *, layer: int, kvh: int, ppb: int, width: int):
  row, blk = pl.program_id(0), pl.program_id(1)
  ps, h, d = kbuf.shape[1], q_ref.shape[1], q_ref.shape[2]
  g = h // kvh

  @pl.when(blk == 0)
  def _():
    m_s[...] = jnp.full(m_s.shape, NEG, jnp.float32)
    l_s[...] = jnp.zeros(l_s.shape, jnp.float32)
    acc_s[...] = jnp.zeros(acc_s.shape, jnp.float32)

  count = count_ref[row]
  first = blk * ppb

  @pl.when(first < count)
  def _():
    entries = [window_ref[row, jnp.minimum(first + p, width - 1)] for p in range(ppb)]
    copies = []
    for p, e in enumerate(entries):
      page = jax.lax.shift_right_logical(e, _VALID_BITS)
      copies.append((first + p < count,
                     pltpu.make_async_copy(k_hbm.at[layer, page], kbuf.at[p], sem.at[0, p]),
                     pltpu.make_async_copy(v_hbm.at[layer, page], vbuf.at[p], sem.at[1, p])))
    for ok, ck, cv in copies:
      @pl.when(ok)
      def _():
        ck.start()
        cv.start()
    for ok, ck, cv in copies:
      @pl.when(ok)
      def _():
        ck.wait()
        cv.wait()
    # token t of the block is visible iff its entry is in the window and within its valid count
    def visibility(shape, axis):
      tok = jax.lax.broadcasted_iota(jnp.int32, shape, axis)
      out = jnp.zeros(shape, jnp.bool_)
      for p, e in enumerate(entries):
        n_ok = jnp.where(first + p < count, e & ((1 << _VALID_BITS) - 1), 0)
        out = out | ((tok >= p * ps) & (tok < p * ps + n_ok))
      return out

    visible = visibility((1, ppb * ps), 1)          # per key, along the scores' lanes
    visible_col = visibility((ppb * ps, 1), 0)      # per key, along the values' sublanes
    keys = kbuf[...].reshape(ppb * ps, kvh * d)
    vals = vbuf[...].reshape(ppb * ps, kvh * d)
    q = q_ref[0]
    for k in range(kvh):
      rows = slice(k * g, (k + 1) * g)
      kk = keys[:, k * d:(k + 1) * d]
      vv = jnp.where(visible_col, vals[:, k * d:(k + 1) * d], 0).astype(jnp.float32)
      s = jax.lax.dot_general(q[rows], kk, (((1,), (1,)), ((), ())),
                              preferred_element_type=jnp.float32) * (d ** -0.5)
      s = jnp.where(visible, s, NEG)
      m_old = m_s[rows, :1]
      m_new = jnp.maximum(m_old, s.max(axis=1, keepdims=True))
      pr = jnp.where(visible, jnp.exp(s - m_new), 0.0)
      corr = jnp.exp(m_old - m_new)
      l_s[rows, :1] = l_s[rows, :1] * corr + pr.sum(axis=1, keepdims=True)
      acc_s[rows, :] = acc_s[rows, :] * corr + jnp.dot(pr, vv, preferred_element_type=jnp.float32)
      m_s[rows, :1] = m_new

  @pl.when(blk == pl.num_programs(1) - 1)
  def _():
    o_ref[0] = acc_s[...]
    m_ref[0] = m_s[:, :1]
    l_ref[0] = l_s[:, :1]


@functools.partial(jax.jit, static_argnames=("layer", "pages_per_block", "interpret"))
def window_attention(q: jax.Array, pool_k: jax.Array, pool_v: jax.Array, window: jax.Array,
                     count: jax.Array, *, layer: int, pages_per_block: int = 8,
                     interpret: bool = False):
  """The private-window part of one decode step's attention, pages read in place.

  q [B, H, D] (one query per row); pool_k / pool_v [L, N, page_size, KV * D]; window [B, W]
  (`pack_window`: page ids and visible tokens per entry, in any order); count [B] entries in
  use. Returns (acc [B, H, D] float32, the unnormalised sum of exp(score - max) x value; max
  [B, H, 1]; denominator [B, H, 1]); a row with no entry gives max NEG and denominator 0.
  """
  b, h, d = q.shape
  _, _, ps, kd = pool_k.shape
  kvh, w = kd // d, window.shape[1]
  ppb = max(1, min(int(pages_per_block), w))
  kern = functools.partial(_kernel, layer=int(layer), kvh=kvh, ppb=ppb, width=w)
  per_row = lambda r, j, *_: (r, 0, 0)  # noqa: E731
  spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2, grid=(b, -(-w // ppb)),
      in_specs=[pl.BlockSpec((1, h, d), per_row),
                pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
      out_specs=[pl.BlockSpec((1, h, d), per_row), pl.BlockSpec((1, h, 1), per_row),
                 pl.BlockSpec((1, h, 1), per_row)],
      scratch_shapes=[pltpu.VMEM((ppb, ps, kd), pool_k.dtype),
                      pltpu.VMEM((ppb, ps, kd), pool_v.dtype),
                      pltpu.SemaphoreType.DMA((2, ppb)),
                      pltpu.VMEM((h, 128), jnp.float32), pltpu.VMEM((h, 128), jnp.float32),
                      pltpu.VMEM((h, d), jnp.float32)])
  out_shape = (jax.ShapeDtypeStruct((b, h, d), jnp.float32),
               jax.ShapeDtypeStruct((b, h, 1), jnp.float32),
               jax.ShapeDtypeStruct((b, h, 1), jnp.float32))
  return pl.pallas_call(
      kern, grid_spec=spec, out_shape=out_shape, interpret=interpret,
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
  )(count.astype(jnp.int32), window.astype(jnp.int32), q, pool_k, pool_v)


def kernel_bytes(pages: float, page_bytes: float, layers: int, heads: int, head_dim: int,
                 q_itemsize: int = 2) -> float:
  """HBM bytes the kernel moves for one decode step of one row: `pages` pages of K and of V
  (`page_bytes` each) in every layer, one DMA per page and nothing else of the pool, the row's
  queries, and its float32 outputs (the sum per head and dimension, the max and denominator)."""
  return layers * (2 * pages * page_bytes + heads * head_dim * q_itemsize
                   + 4 * heads * (head_dim + 2))
