"""Sharded (data x tensor over 8 CPU devices) decode (tokens, logprobs, entropy), greedy and
sampled, equals single-device decode: a row's draws depend on its own key, not its shard."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from tree_rl import sampling

from sampling_helpers import check_invariants

ROWS = 8


def _program(cache, attention, temperature):
  """prefill even slots -> fork each into the next odd slot -> decode -> observation -> decode."""
  outs = []
  slots = np.arange(ROWS, dtype=np.int32)
  toks = np.array([[(7 * r + j) % 64 for j in range(12)] for r in range(ROWS)], np.int32)
  lens = np.array([3 + r for r in range(ROWS)], np.int32)
  cache, pre = sampling.prefill(cache, slots, toks, lens, valid=slots % 2 == 0)
  outs.append(pre.logits[::2])
  cache, status = sampling.fork(cache, slots - slots % 2, slots + 1, valid=slots % 2 == 0)
  outs.append(status)
  kw = dict(max_new=8, temperature=temperature, attention=attention)
  cache, out = sampling.decode(cache, slots, jax.random.key(0), max_tokens=[8, 5] * 4, **kw)
  outs += [out.tokens, out.logprobs, out.lengths]
  cache, pre = sampling.prefill(cache, slots, toks[::-1], (lens % 5) + 1)
  cache, out = sampling.decode(cache, slots, jax.random.key(1), entropy_tokens=5, **kw)
  outs += [out.tokens, out.logprobs, out.lengths, pre.logits, out.entropy]
  return cache, outs


def _assert_same(ref, got):
  """Floats to tolerance, integers exactly."""
  for a, b in zip(ref, got):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f":
      np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-4)
    else:
      np.testing.assert_array_equal(a, b)

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sharded_decode_equals_single_device(model, temperature):
  assert len(jax.devices()) == 8
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "tensor"))   # Auto axes, as the learner builds it
  common = dict(page_size=4, max_pages_per_seq=16, kv_dtype="float32")
  single = sampling.init_cache(model, max_seqs=ROWS, num_pages=64, **common)
  sharded = sampling.init_cache(model, max_seqs=ROWS // 4, num_pages=16, mesh=mesh, **common)
  assert tuple(sharded.state.k.sharding.spec)[:4] == (None, "data", None, "tensor")
  specs = [tuple(x.sharding.spec) for x in jax.tree.leaves(sharded.params)]
  assert any("tensor" in s for s in specs)
  single, ref = _program(single, "reference", temperature)
  sharded, got = _program(sharded, "cascade", temperature)
  assert len(got[2].sharding.device_set) == 8
  _assert_same(ref, got)
  for shard in range(4):
    check_invariants(sharded, shard)
  np.testing.assert_array_equal(np.asarray(sampling.pages_in_use(sharded)).sum(),
                                np.asarray(sampling.pages_in_use(single)).sum())


def test_pallas_window_kernel_sharded_over_data_equals_single_device(model):
  """The Pallas window kernel (interpret mode) runs per data shard: a (data=4) mesh decodes
  what one device decodes with the gathered window; a tensor axis is refused."""
  mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
  common = dict(page_size=4, max_pages_per_seq=16, kv_dtype="float32")
  single = sampling.init_cache(model, max_seqs=ROWS, num_pages=64, **common)
  sharded = sampling.init_cache(model, max_seqs=ROWS // 4, num_pages=16, mesh=mesh, **common)
  assert sampling.window_kernel(sharded, "pallas") == "interpret"
  assert sampling.window_kernel(sharded, "auto") == ""          # not a TPU: the gathered window
  _, ref = _program(single, "cascade", 1.0)
  _, got = _program(sharded, "pallas", 1.0)
  _assert_same(ref, got)
  split = sampling.init_cache(model, max_seqs=ROWS // 4, num_pages=16, **common,
                              mesh=Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "tensor")))
  with pytest.raises(ValueError, match="tensor"):
    sampling.window_kernel(split, "pallas")
