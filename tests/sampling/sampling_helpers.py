"""Helpers: a tiny model with peaked logits, a dense reference, cache invariants."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tree_rl.models import Transformer
from tree_rl.models.config import tiny

VOCAB = 64
DENSE_LEN = 64


def make_model(seed=0):
  """Tiny Qwen2-shaped model; weights scaled up so greedy choices have clear margins."""
  model = Transformer(tiny(VOCAB), rngs=nnx.Rngs(seed))
  graphdef, params = nnx.split(model)
  params = jax.tree.map(lambda x: x * 6.0 if x.ndim >= 2 else x, params)
  return nnx.merge(graphdef, params)


@functools.lru_cache(maxsize=None)
def _dense_fn(model):
  return jax.jit(lambda toks: jax.nn.log_softmax(model(toks), axis=-1))


def dense_logprobs(model, seq):
  """log_softmax of the dense causal forward over `seq` (padded to a fixed length): [len, V]."""
  seq = list(seq)
  assert len(seq) <= DENSE_LEN
  toks = np.zeros((1, DENSE_LEN), np.int32)
  toks[0, :len(seq)] = seq
  return np.asarray(_dense_fn(model)(jnp.asarray(toks)))[0, :len(seq)]


def check_greedy(model, prefix, new, logprobs=None, atol=2e-4):
  """`new` is the greedy continuation of `prefix` under dense recomputation (teacher forcing:
  equal argmax at every step given equal history is token-for-token greedy equality), and the
  returned logprobs equal the dense log_softmax at each position within atol."""
  full = list(prefix) + list(new)
  lp = dense_logprobs(model, full)
  for i, tok in enumerate(new):
    row = lp[len(prefix) - 1 + i]
    assert int(np.argmax(row)) == tok, f"step {i}: paged {tok} vs dense {int(np.argmax(row))}"
    if logprobs is not None:
      np.testing.assert_allclose(logprobs[i], row[tok], atol=atol)


def check_invariants(cache, shard=0, seqs=None):
  """Refcounts equal table references, the free list is exactly the free pages, shared pages are
  full for all owners, and (given the Python mirror `seqs`: slot -> tokens) every owner of a
  shared page has the same tokens in it, so no page is owned by two diverged sequences."""
  st = jax.device_get(cache.state)
  spec = cache.spec
  n, s, ps = spec.num_pages, spec.max_seqs, spec.page_size
  sl = slice(shard * s, (shard + 1) * s)
  table, lens, live = st.page_table[sl], st.lens[sl], st.live[sl]
  refcount, stack = st.refcount[shard * n:(shard + 1) * n], st.free_stack[shard * n:(shard + 1) * n]
  num_free = int(st.num_free[shard])
  counts = np.zeros(n, np.int64)
  owners = {}
  for slot in range(s):
    if not live[slot]:
      continue
    for j in range(-(-int(lens[slot]) // ps)):
      p = int(table[slot, j])
      counts[p] += 1
      owners.setdefault(p, []).append((slot, j))
  np.testing.assert_array_equal(counts, refcount)
  free = stack[:num_free]
  assert len(set(free.tolist())) == num_free
  assert set(free.tolist()) == set(np.nonzero(refcount == 0)[0].tolist())
  for p, own in owners.items():
    if len(own) > 1:
      for slot, j in own:
        assert (j + 1) * ps <= lens[slot], f"page {p} shared but partially filled for slot {slot}"
      if seqs is not None:
        blocks = {tuple(seqs[slot][j * ps:(j + 1) * ps]) for slot, j in own}
        assert len(blocks) == 1, f"page {p} shared by sequences with different tokens: {blocks}"
  if seqs is not None:
    assert {i for i in range(s) if live[i]} == set(seqs)
    for slot, toks in seqs.items():
      assert int(lens[slot]) == len(toks) - 1
