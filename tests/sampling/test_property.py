"""Random fork / prefill / decode / release programs keep the page table consistent."""

import jax
from hypothesis import HealthCheck, given, settings, strategies as st

from tree_rl import sampling

from conftest import check_greedy, check_invariants, make_model
from harness import B, T, Driver

SLOTS = 6
MODEL = make_model()

op = st.one_of(
    st.tuples(st.just("prefill"), st.integers(0, SLOTS - 1), st.integers(1, T)),
    st.tuples(st.just("fork"), st.integers(0, SLOTS - 1), st.integers(0, SLOTS - 1)),
    st.tuples(st.just("decode"), st.lists(st.integers(0, SLOTS - 1), min_size=1, max_size=B, unique=True),
              st.integers(0, 8)),
    st.tuples(st.just("release"), st.integers(0, SLOTS - 1), st.just(0)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(op, min_size=1, max_size=12), st.integers(0, 2 ** 16))
def test_random_programs_keep_refcounts_consistent(program, seed):
  d = Driver(MODEL, max_seqs=SLOTS, num_pages=20, max_pages_per_seq=8)
  for i, (kind, a, b) in enumerate(program):
    if kind == "prefill":
      stored_after = len(d.seqs.get(a, [])) + b - 1
      out = d.prefill({a: [(seed + i + j) % 64 for j in range(b)]})
      status = int(out.status[0])
      assert (status == sampling.SEQ_CAPACITY) == (stored_after > 32)
      assert status in (sampling.OK, sampling.OUT_OF_PAGES, sampling.SEQ_CAPACITY)
    elif kind == "fork":
      ok_expected = a in d.seqs and b not in d.seqs and a != b
      status = int(d.fork([(a, b)])[0])
      assert (status in (sampling.OK, sampling.OUT_OF_PAGES)) == ok_expected
    elif kind == "decode":
      d.decode(a, key=seed + i, max_tokens=[b] * len(a), temperature=1.0,
               attention="cascade", shared_pages=8, window_pages=8)
    else:
      d.release([a])
    check_invariants(d.cache)
  # Every surviving sequence's cache still reproduces its tokens exactly.
  live = sorted(d.seqs)
  for i in range(0, len(live), B):
    _, res = d.decode(live[i:i + B], max_tokens=[2] * len(live[i:i + B]))
    for prefix, new, lps in res.values():
      check_greedy(MODEL, prefix, new, lps)
  d.release(list(range(SLOTS)))
  check_invariants(d.cache)
  assert int(sampling.pages_in_use(d.cache)[0]) == 0
  assert int(d.cache.state.num_free[0]) == 20
