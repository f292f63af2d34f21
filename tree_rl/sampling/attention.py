"""Paged attention as a sum of key/value "parts", combined in one float32 softmax.

A part is either per-row keys `[B, S, KV, D]` or keys shared by the whole batch `[S, KV, D]`
(read once and multiplied against every row's queries: the shared-prefix / cascade form), each
with a visibility mask `[B, T, S]`. Key order inside a part is irrelevant (RoPE is applied before
caching), so pages can be attended in any order.

`attend` is the one entry point; the reference layout (every row gathers its whole page table)
and the cascade layout (shared pages once + a per-row private window + the turn's new tokens)
only differ in which parts they pass, and are tested against each other and a dense model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG = -1e30


def gather_pages(pages: jax.Array, table: jax.Array, kv_heads: int,
                 layer: int | None = None) -> jax.Array:
  """pages [N, ps, KV*D] (or [L, N, ps, KV*D] and a `layer`: the pool's layout, heads flattened
  into the minor dimension), table [B, W] -> [B, W*ps, KV, D] (entries clipped into range)."""
  b, w = table.shape
  idx = jnp.clip(table, 0, pages.shape[-3] - 1)
  g = pages[idx] if layer is None else pages[layer, idx]
  return g.reshape(b, w * pages.shape[-2], kv_heads, pages.shape[-1] // kv_heads)


def attend(q: jax.Array, parts, partial=None) -> jax.Array:
  """q [B, T, H, D]; parts: sequence of (k, v, mask). Returns [B, T, H, D] in q's dtype.

  partial: a part already reduced elsewhere (`paged_kernel.window_attention`, T = 1): (acc
  [B, H, D] unnormalised, max [B, H, 1], denominator [B, H, 1]), merged into the same softmax.
  Rows whose mask is empty everywhere give zeros.
  """
  b, t, h, d = q.shape
  kvh = parts[0][0].shape[-2]
  qg = q.reshape(b, t, kvh, h // kvh, d)
  scale = d ** -0.5
  scores, masks = [], []
  for k, v, mask in parts:
    if k.ndim == 3:   # shared by all rows
      s = jnp.einsum("btkgd,skd->bkgts", qg, k.astype(q.dtype), preferred_element_type=jnp.float32)
    else:
      s = jnp.einsum("btkgd,bskd->bkgts", qg, k.astype(q.dtype), preferred_element_type=jnp.float32)
    m = mask[:, None, None]
    scores.append(jnp.where(m, s * scale, NEG))
    masks.append(m)
  allscores = jnp.concatenate(scores, axis=-1)
  mx = jnp.max(allscores, axis=-1, keepdims=True)                       # [B, KV, G, T, 1]
  out = 0.0
  denom = 0.0
  if partial is not None:
    acc, pm, pl = (x.reshape(b, kvh, h // kvh, 1, -1) for x in partial)   # T = 1
    mx = jnp.maximum(mx, pm)
    w = jnp.exp(pm - mx)
    denom = pl * w
    out = jnp.moveaxis(acc * w, 3, 1)                                    # [B, T, KV, G, D]
  for s, m, (k, v, _) in zip(scores, masks, parts):
    p = jnp.where(m, jnp.exp(s - mx), 0.0)
    denom = denom + p.sum(-1, keepdims=True)
    if k.ndim == 3:
      o = jnp.einsum("bkgts,skd->btkgd", p.astype(q.dtype), v.astype(q.dtype), preferred_element_type=jnp.float32)
    else:
      o = jnp.einsum("bkgts,bskd->btkgd", p.astype(q.dtype), v.astype(q.dtype), preferred_element_type=jnp.float32)
    out = out + o
  denom = jnp.moveaxis(denom[..., 0], 3, 1)[..., None]   # [B, T, KV, G, 1]
  out = out / jnp.maximum(denom, 1e-30)
  return out.reshape(b, t, h, d).astype(q.dtype)


def attend_with_pages(q, k, v, mask, pages_k, pages_v, table, cached, block: int,
                      layer: int | None = None):
  """Attention of a chunk over its own keys (k, v [B, T, KV, D] with `mask` [B, T, T]) and each
  row's first `cached` [B] tokens in the page pool (pages [N, ps, KV*D], rows' page tables
  `table` [B, W]; with `layer`, pages are [L, N, ps, KV*D] and layer `layer` is read). The
  pages are read `block` at a time in a loop that runs only as far as the
  longest row's cache reaches (a dynamic trip count: one program for every context length),
  with a running (online) softmax; the result equals `attend` over the same keys.
  """
  b, t, h, d = q.shape
  kvh = k.shape[2]
  ps, width = pages_k.shape[-2], table.shape[1]
  qg = q.reshape(b, t, kvh, h // kvh, d)
  scale = d ** -0.5

  def scores(keys, visible):   # visible [B, T or 1, S] -> scores [B, KV, G, T, S]
    s = jnp.einsum("btkgd,bskd->bkgts", qg, keys.astype(q.dtype), preferred_element_type=jnp.float32)
    return jnp.where(visible[:, None, None], s * scale, NEG)

  def update(carry, s, values, visible):
    m, l, acc = carry
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.where(visible[:, None, None], jnp.exp(s - m_new[..., None]), 0.0)
    corr = jnp.exp(m - m_new)
    acc = acc * corr[..., None] + jnp.einsum("bkgts,bskd->bkgtd", p.astype(q.dtype),
                                             values.astype(q.dtype), preferred_element_type=jnp.float32)
    return m_new, l * corr + p.sum(-1), acc

  g = h // kvh
  start = (jnp.full((b, kvh, g, t), NEG, jnp.float32), jnp.zeros((b, kvh, g, t), jnp.float32),
           jnp.zeros((b, kvh, g, t, d), jnp.float32))
  carry = update(start, scores(k, mask), v, mask)

  def body(i, carry):
    cols = i * block + jnp.arange(block)
    pages = jnp.where(cols < width, table[:, jnp.clip(cols, 0, width - 1)], 0)      # [B, block]
    pos = (cols[:, None] * ps + jnp.arange(ps)).reshape(-1)                          # [block * ps]
    visible = jnp.broadcast_to((pos[None, :] < cached[:, None])[:, None, :], (b, 1, pos.shape[0]))
    kb, vb = gather_pages(pages_k, pages, kvh, layer), gather_pages(pages_v, pages, kvh, layer)
    return update(carry, scores(kb, visible), vb, visible)

  steps = -(-jnp.max(-(-cached // ps)) // block)   # blocks of pages the longest row holds
  m, l, acc = jax.lax.fori_loop(0, steps, body, carry)
  out = acc / jnp.maximum(l, 1e-30)[..., None]                                        # [B,KV,G,T,D]
  return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, t, h, d).astype(q.dtype)
