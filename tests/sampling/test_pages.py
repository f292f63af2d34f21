"""Page accounting: tree workload bound, pool exhaustion, one trace per shape."""

import math

import chex
import numpy as np
import pytest

from tree_rl import sampling
from tree_rl.sampling import api
from tree_rl.sampling import StopReason as R

from sampling_helpers import check_greedy, check_invariants
from sampling_harness import MAX_NEW, Driver


def test_tree_workload_page_bound(model):
  p_len, ps, branches, g = 10, 4, 4, MAX_NEW
  d = Driver(model, page_size=ps)
  d.prefill({0: list(range(1, p_len + 1))})
  assert (d.fork([(0, c) for c in range(1, branches + 1)])[:branches] == sampling.Status.OK).all()
  out, res = d.decode(list(range(1, branches + 1)), key=3, temperature=1.0)
  assert (np.asarray(out.lengths)[:branches] == g).all()
  peak = int(d.cache.state.peak_pages[0])
  bound = math.ceil(p_len / ps) + branches * math.ceil(g / ps) + branches
  separate = branches * math.ceil((p_len + g) / ps)
  assert peak <= bound < separate, (peak, bound, separate)
  check_invariants(d.cache)


def test_pool_exhaustion_is_a_clear_recoverable_signal(model):
  d = Driver(model, num_pages=12)
  d.prefill({0: [9, 8, 7, 6, 5, 4]})                       # 5 stored tokens: 2 pages
  assert (d.fork([(0, 1), (0, 2), (0, 3)])[:3] == sampling.Status.OK).all()   # +3 copied partial pages
  assert int(sampling.pages_in_use(d.cache)[0]) == 5
  # 4 rows need 2 pages each (at positions 8 and 12); 7 are free, so the last row stops at 12.
  out, res = d.decode([0, 1, 2, 3])
  reasons = np.asarray(out.stop_reason)[:4]
  np.testing.assert_array_equal(reasons, [R.TURN_LIMIT] * 3 + [R.OUT_OF_PAGES])
  assert int(out.lengths[3]) == 7
  msg = sampling.exhaustion_message(d.cache, [0, 1, 2, 3], out)
  assert "slots [3]" in msg and "config.sampler.num_pages" in msg
  assert sampling.exhaustion_message(d.cache, [0], _first_row(out)) is None
  for prefix, new, lps in res.values():
    check_greedy(model, prefix, new, lps)
  check_invariants(d.cache)
  assert int(d.cache.state.num_free[0]) == 0
  # Prefill and fork refuse rather than overwrite.
  before = np.asarray(d.cache.state.k).copy()
  pre = d.prefill({4: list(range(12))})
  assert int(pre.status[0]) == sampling.Status.OUT_OF_PAGES and 4 not in d.seqs
  assert int(d.fork([(1, 5)])[0]) == sampling.Status.OUT_OF_PAGES
  np.testing.assert_array_equal(np.asarray(d.cache.state.k), before)
  check_invariants(d.cache)
  # Recover: free a branch, the stopped row continues exactly.
  d.release([0])
  _, res = d.decode([3])
  check_greedy(model, *res[3])
  check_invariants(d.cache)


def _first_row(out):
  return out.replace(stop_reason=out.stop_reason[:1])


def test_each_operation_traces_once_per_shape(model, monkeypatch):
  monkeypatch.setattr(api, "WRAP", lambda name, fn: chex.assert_max_traces(fn, n=1))
  api._build.cache_clear()
  try:
    d = Driver(model, max_seqs=6, num_pages=40)   # a spec no other test uses
    for rep in range(3):
      base = 3 * (rep % 2)
      d.prefill({base: [rep + 1, 2, 3, 4, 5][: 2 + rep]}, read_cache=True)
      d.fork([(base, base + 1), (base, base + 2)])
      d.decode([base, base + 1, base + 2], key=rep, temperature=float(rep) / 2,
               attention="cascade", shared_pages=4, window_pages=16)
      d.prefill({base + 1: [7] * (rep + 1)}, read_cache=True)
      d.decode([base + 1], attention="cascade", shared_pages=4, window_pages=16)
      d.release([base, base + 1, base + 2])
    assert int(sampling.pages_in_use(d.cache)[0]) == 0
  finally:
    api._build.cache_clear()


def test_too_small_explicit_window_refuses_the_row(model):
  d = Driver(model)
  d.prefill({0: list(range(1, 12)), 1: [5, 6]})          # 10 stored tokens: 3 private pages
  k_before = np.asarray(d.cache.state.k).copy()
  out, _ = d.decode([0, 1], attention="cascade", shared_pages=0, window_pages=1)
  assert int(out.stop_reason[0]) == R.WINDOW and int(out.lengths[0]) == 0
  assert int(out.stop_reason[1]) == R.TURN_LIMIT
  assert int(d.cache.state.lens[0]) == 10
  np.testing.assert_array_equal(np.asarray(d.cache.state.k)[:, np.asarray(d.cache.state.page_table)[0, :3]],
                                k_before[:, np.asarray(d.cache.state.page_table)[0, :3]])
  _, res = d.decode([0])                                   # the reference window still works
  check_greedy(model, *res[0])


def test_new_weights_need_a_reset_that_empties_the_cache(model):
  from sampling_helpers import make_model
  d = Driver(model)
  d.prefill({0: [1, 2, 3, 4, 5]})
  old_version = d.cache.params_version
  new_model = make_model(seed=1)
  d.cache = sampling.reset(d.cache, new_model)
  d.seqs.clear()
  assert d.cache.params_version > old_version
  assert int(sampling.pages_in_use(d.cache)[0]) == 0 and not np.asarray(d.cache.state.live).any()
  out, _ = d.decode([0])
  assert int(out.stop_reason[0]) == R.NOT_LIVE and int(out.lengths[0]) == 0
  d.prefill({0: [1, 2, 3, 4, 5]})
  _, res = d.decode([0])
  check_greedy(new_model, *res[0])


def test_rebind_moves_an_empty_cache_to_other_weights_of_the_same_model(model):
  from sampling_helpers import make_model
  d = Driver(model)
  new_model = make_model(seed=1)
  new_params = sampling.init_cache(new_model, max_seqs=1, num_pages=1, max_pages_per_seq=1).params
  d.prefill({0: [1, 2, 3, 4, 5]})
  with pytest.raises(ValueError, match="release every slot"):   # KV of the old weights is live
    sampling.rebind(d.cache, new_params)
  d.release([0])
  version = d.cache.params_version
  assert sampling.rebind(d.cache, d.cache.params) is d.cache     # the same arrays: no new binding
  d.cache = sampling.rebind(sampling.unbind(d.cache), new_params)
  assert d.cache.params_version > version
  d.prefill({0: [1, 2, 3, 4, 5]})
  _, res = d.decode([0])
  check_greedy(new_model, *res[0])                               # decodes with the new weights
  d.release([0])
  with pytest.raises(ValueError, match="another model"):
    sampling.rebind(d.cache, new_params[:-1] + (new_params[-1][:1],))


def test_bad_arguments_name_the_field(model):
  with pytest.raises(ValueError, match="kv_dtype"):
    sampling.init_cache(model, max_seqs=2, num_pages=4, max_pages_per_seq=2, kv_dtype="int8")
  with pytest.raises(ValueError, match="num_pages"):
    sampling.init_cache(model, max_seqs=2, num_pages=0, max_pages_per_seq=2)
  d = Driver(model)
  for kw, field in [(dict(top_p=0.0), "top_p"), (dict(attention="flash"), "attention"), (dict(top_k=-1), "top_k")]:
    with pytest.raises(ValueError, match=field):
      d.decode([0], **kw)
  with pytest.raises(ValueError, match="tokens"):
    sampling.prefill(d.cache, np.zeros(2, np.int32), np.zeros((3, 4), np.int32), np.ones(2, np.int32))


def test_prefill_without_cache_reads_refuses_rows_with_cached_pages(model):
  d = Driver(model)
  d.prefill({0: [1, 2, 3, 4, 5, 6]}, read_cache=False)              # fresh: allowed
  out = d.prefill({0: [7, 8], 1: [9, 10]}, read_cache=False)        # slot 0 has cached pages
  np.testing.assert_array_equal(np.asarray(out.status)[:2], [sampling.Status.INVALID, sampling.Status.OK])
  out = d.prefill({0: [7, 8]})                                       # auto: reads the cache
  assert int(out.status[0]) == sampling.Status.OK
  _, res = d.decode([0, 1])
  for prefix, new, lps in res.values():
    check_greedy(model, prefix, new, lps)
