"""The Pallas window kernel (interpret mode) against a gather of the same pages: random page
ids in any order, partial last pages, empty rows, any pages per block."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tree_rl.sampling.paged_kernel import NEG, pack_window, window_attention


def _gathered(q, pool_k, pool_v, layer, table, count, valid):
  """The same part by gathering: unnormalised sum, max and denominator per query head."""
  b, h, d = q.shape
  n, ps, kd = pool_k.shape[1:]
  kvh, w = kd // d, table.shape[1]
  keys = pool_k[layer][table].reshape(b, w * ps, kvh, d)
  vals = pool_v[layer][table].reshape(b, w * ps, kvh, d)
  vis = ((np.arange(w)[None, :, None] < count[:, None, None])
         & (np.arange(ps)[None, None, :] < valid[:, :, None])).reshape(b, w * ps)
  qg = np.asarray(q, np.float64).reshape(b, kvh, h // kvh, d)
  s = np.einsum("bkgd,bskd->bkgs", qg, np.asarray(keys, np.float64)) * d ** -0.5
  s = np.where(vis[:, None, None], s, -np.inf)
  m = s.max(-1, initial=-np.inf)
  p = np.where(vis[:, None, None], np.exp(s - np.where(np.isfinite(m), m, 0)[..., None]), 0.0)
  acc = np.einsum("bkgs,bskd->bkgd", p, np.asarray(vals, np.float64))
  return acc.reshape(b, h, d), m.reshape(b, h, 1), p.sum(-1).reshape(b, h, 1)


@pytest.mark.parametrize("pages_per_block", [1, 3, 8])
def test_pallas_window_kernel_equals_the_gathered_pages(pages_per_block):
  rng = np.random.default_rng(pages_per_block)
  layers, n, ps, kvh, d, h, b, w = 3, 40, 4, 2, 16, 6, 5, 7
  pool_k = rng.normal(size=(layers, n, ps, kvh * d)).astype(np.float32)
  pool_v = rng.normal(size=(layers, n, ps, kvh * d)).astype(np.float32)
  q = rng.normal(size=(b, h, d)).astype(np.float32)
  table = rng.permutation(n)[:b * w].reshape(b, w).astype(np.int32)   # scattered, any order
  count = np.array([7, 3, 0, 1, 5], np.int32)                          # row 2 holds nothing
  valid = np.where(np.arange(w)[None] < count[:, None], ps, 0)
  valid[np.arange(b), np.maximum(count - 1, 0)] = np.where(count > 0, [4, 1, 0, 3, 2], 0)
  acc, m, l = window_attention(jnp.asarray(q), jnp.asarray(pool_k), jnp.asarray(pool_v),
                               pack_window(jnp.asarray(table), jnp.asarray(valid), n),
                               jnp.asarray(count), layer=2, pages_per_block=pages_per_block,
                               interpret=True)
  want_acc, want_m, want_l = _gathered(q, pool_k, pool_v, 2, table, count, valid)
  live = count > 0
  np.testing.assert_allclose(np.asarray(acc)[live], want_acc[live], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(m)[live], want_m[live], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(l)[live], want_l[live], rtol=1e-5, atol=1e-5)
  assert (np.asarray(acc)[~live] == 0).all() and (np.asarray(l)[~live] == 0).all()
  assert (np.asarray(m)[~live] == NEG).all()
