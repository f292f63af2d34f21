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


def gather_pages(pages: jax.Array, table: jax.Array) -> jax.Array:
  """pages [N, ps, KV, D], table [B, W] -> [B, W*ps, KV, D] (entries clipped into range)."""
  b, w = table.shape
  g = pages[jnp.clip(table, 0, pages.shape[0] - 1)]
  return g.reshape(b, w * pages.shape[1], *pages.shape[2:])


def attend(q: jax.Array, parts) -> jax.Array:
  """q [B, T, H, D]; parts: sequence of (k, v, mask). Returns [B, T, H, D] in q's dtype.

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
  mx = jnp.max(allscores, axis=-1, keepdims=True)
  out = 0.0
  denom = 0.0
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
