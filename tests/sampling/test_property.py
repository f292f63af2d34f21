"""Random fork / prefill / decode / release programs keep the page table consistent."""

from hypothesis import HealthCheck, event, given, settings, strategies as st

from tree_rl import sampling

from sampling_helpers import check_greedy, check_invariants, make_model
from sampling_harness import B, T, Driver

SLOTS = 6
PAGES = 12
MODEL = make_model()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_programs_keep_refcounts_consistent(data):
  d = Driver(MODEL, max_seqs=SLOTS, num_pages=PAGES, max_pages_per_seq=8)
  slot = st.integers(0, SLOTS - 1)
  d.prefill({data.draw(slot): list(range(data.draw(st.integers(1, T))))})
  for i in range(data.draw(st.integers(4, 14), "ops")):
    live = sorted(d.seqs)
    dead = [s for s in range(SLOTS) if s not in d.seqs]
    kind = data.draw(st.sampled_from(["prefill", "fork", "fork", "decode", "decode", "release"]))
    # Mostly well-formed operations, sometimes arbitrary slots (which must be refused safely).
    pick = lambda pool: data.draw(st.sampled_from(pool) if pool and data.draw(st.integers(0, 4)) else slot)  # noqa: E731
    if kind == "prefill":
      s, n = pick(live + dead), data.draw(st.integers(1, T))
      stored_after = len(d.seqs.get(s, [])) + n - 1
      out = d.prefill({s: [(7 * i + j) % 64 for j in range(n)]})
      status = int(out.status[0])
      event(f"prefill {sampling.Status(status).name.lower()}")
      assert (status == sampling.Status.SEQ_CAPACITY) == (stored_after > 32)
      assert status in (sampling.Status.OK, sampling.Status.OUT_OF_PAGES, sampling.Status.SEQ_CAPACITY)
    elif kind == "fork":
      a, b = pick(live), pick(dead)
      well_formed = a in d.seqs and b not in d.seqs and a != b
      status = int(d.fork([(a, b)])[0])
      event(f"fork {sampling.Status(status).name.lower()}")
      assert (status in (sampling.Status.OK, sampling.Status.OUT_OF_PAGES)) == well_formed
    elif kind == "decode":
      rows = data.draw(st.lists(st.sampled_from(live) if live else slot, min_size=1, max_size=B, unique=True))
      n = data.draw(st.integers(0, 8))
      out, _ = d.decode(rows, key=i, max_tokens=[n] * len(rows), temperature=1.0,
                        attention="cascade", shared_pages=8, window_pages=8)
      for r in out.stop_reason[:len(rows)].tolist():
        event(f"decode {sampling.StopReason(r).name.lower()}")
    else:
      d.release([pick(live)])
    check_invariants(d.cache, seqs=d.seqs)
  # Every surviving sequence's cache still reproduces its tokens exactly.
  live = sorted(d.seqs)
  for i in range(0, len(live), B):
    _, res = d.decode(live[i:i + B], max_tokens=[2] * len(live[i:i + B]))
    for prefix, new, lps in res.values():
      check_greedy(MODEL, prefix, new, lps)
  d.release(list(range(SLOTS)))
  check_invariants(d.cache, seqs=d.seqs)
  assert int(sampling.pages_in_use(d.cache)[0]) == 0
  assert int(d.cache.state.num_free[0]) == PAGES
