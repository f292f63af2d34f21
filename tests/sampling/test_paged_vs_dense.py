"""Greedy decoding through the paged cache equals greedy decoding by dense recomputation."""

import jax
import numpy as np
import pytest

from tree_rl import sampling
from tree_rl.sampling import StopReason as R

from sampling_helpers import check_greedy, check_invariants, dense_logprobs
from sampling_harness import MAX_NEW, Driver

ATTN = ["reference", "cascade"]
WITH_KERNEL = ATTN + ["pallas"]   # pallas: the window kernel in interpret mode (slow on CPU)


def check_all(model, result, logprob_atol=2e-4):
  for prefix, new, lps in result.values():
    check_greedy(model, prefix, new, lps, atol=logprob_atol)


def test_single_sequence(model):
  d = Driver(model)
  pre = d.prefill({0: [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]})
  assert int(pre.status[0]) == sampling.Status.OK and int(pre.computed[0]) == 11
  np.testing.assert_allclose(_log_softmax(pre.logits[0]), dense_logprobs(model, d.seqs[0])[-1], atol=2e-4)
  for _ in range(3):  # three turns back to back: the pending token carries over
    out, res = d.decode([0])
    assert int(out.lengths[0]) == MAX_NEW and int(out.stop_reason[0]) == R.TURN_LIMIT
    check_all(model, res)
  check_invariants(d.cache)


def _log_softmax(logits):
  x = np.asarray(logits, np.float64)
  return x - x.max() - np.log(np.exp(x - x.max()).sum())


def test_prefill_logits_are_dense_logits(model):
  d = Driver(model)
  out = d.prefill({1: [7, 8, 9, 10, 11]})
  np.testing.assert_allclose(_log_softmax(out.logits[0]), dense_logprobs(model, [7, 8, 9, 10, 11])[-1], atol=2e-4)


@pytest.mark.parametrize("attention", ATTN)
def test_batch_of_different_lengths(model, attention):
  d = Driver(model, attention=attention)
  d.prefill({0: [5], 1: [1, 2, 3, 4, 5], 2: list(range(10, 18)), 3: list(range(20, 32))})
  out, res = d.decode([0, 1, 2, 3], max_tokens=[8, 3, 7, 1])
  np.testing.assert_array_equal(np.asarray(out.lengths), [8, 3, 7, 1])
  check_all(model, res)
  out, res = d.decode([3, 1, 0])
  check_all(model, res)
  check_invariants(d.cache)


@pytest.mark.parametrize("attention", WITH_KERNEL)
def test_forks_mid_page_and_mid_turn_then_decoded_apart(model, attention):
  d = Driver(model, attention=attention)
  d.prefill({0: [9, 8, 7, 6, 5, 4]})                   # 5 tokens stored: mid-page (page 4)
  status = d.fork([(0, 1), (0, 2), (0, 3)])
  assert (status[:3] == sampling.Status.OK).all()
  check_invariants(d.cache)
  # Sampled turns make the branches diverge; logprobs verify each branch's cache.
  out, res = d.decode([0, 1, 2, 3], key=1, max_tokens=[5, 5, 5, 5], temperature=1.0)
  for prefix, new, lps in res.values():
    ref = dense_logprobs(model, prefix + new)
    np.testing.assert_allclose(lps, [ref[len(prefix) - 1 + i, t] for i, t in enumerate(new)], atol=2e-4)
  assert len({tuple(d.seqs[s]) for s in range(4)}) > 1
  check_invariants(d.cache)
  # Fork again mid-turn (after 5 of 8 tokens, mid-page), give the children different chunks.
  status = d.fork([(2, 4), (2, 5)])
  assert (status[:2] == sampling.Status.OK).all()
  d.prefill({4: [1, 2, 3], 5: [33]})
  out, res = d.decode([0, 2, 4, 5])
  check_all(model, res)
  check_invariants(d.cache)
  d.release(list(range(6)))
  assert int(sampling.pages_in_use(d.cache)[0]) == 0
  check_invariants(d.cache)


@pytest.mark.parametrize("attention", ATTN)
def test_multi_turn_with_observation_chunks(model, attention):
  d = Driver(model, attention=attention)
  d.prefill({0: [1, 2, 3], 1: list(range(40, 50)), 2: [60, 61, 62, 63, 0, 1, 2]})
  obs = {0: [[5, 6], [7], [8, 9, 10, 11, 12]], 1: [[13], [14, 15, 16, 17, 18, 19, 20, 21, 22], [2]],
         2: [[23, 24, 25], [26, 27], [28]]}
  for turn in range(3):
    _, res = d.decode([0, 1, 2], max_tokens=[4 + turn, 6, 3])
    check_all(model, res)
    d.prefill({s: obs[s][turn] for s in (0, 1, 2)})
  _, res = d.decode([0, 1, 2])
  check_all(model, res)
  check_invariants(d.cache)


def test_stop_ids_and_budget(model):
  d = Driver(model)
  d.prefill({0: [4, 5, 6], 1: [4, 5, 6]})
  _, res = d.decode([0])
  greedy = res[0][1]
  d2 = Driver(model)
  d2.prefill({0: [4, 5, 6], 1: [4, 5, 6]})
  stop = greedy[3]
  first = greedy.index(stop)
  out, _ = d2.decode([0, 1], stop_ids=[stop], budget=[8, 2])
  assert int(out.stop_reason[0]) == R.STOP_TOKEN and int(out.lengths[0]) == first + 1
  assert int(out.stop_reason[1]) == (R.STOP_TOKEN if first < 2 else R.BUDGET)
  assert int(out.lengths[1]) == min(first + 1, 2)
  # Continuing after a stop resumes from the stop token (now pending).
  _, res = d2.decode([0])
  check_all(model, res)


def test_sampled_logprobs_match_dense_log_softmax(model):
  """Tolerance 2e-4 absolute (float32 KV, highest matmul precision)."""
  d = Driver(model)
  d.prefill({0: [1, 2, 3, 4], 1: [5, 6], 2: [7], 3: list(range(12))})
  out, res = d.decode([0, 1, 2, 3], key=7, temperature=0.8, top_k=10, top_p=0.9, attention="cascade")
  for prefix, new, lps in res.values():
    ref = dense_logprobs(model, prefix + new)
    for i, t in enumerate(new):
      row = ref[len(prefix) - 1 + i]
      tempered = row / 0.8 - np.logaddexp.reduce(row / 0.8)    # log_softmax(logits / 0.8)
      assert abs(lps[i] - tempered[t]) < 2e-4
      assert t in np.argsort(-row)[:10]


def test_segmented_turn_loop_equals_dense(model):
  d = Driver(model, attention="cascade")
  d.prefill({0: [3, 4, 5, 6, 7], 1: [8]})
  d.fork([(0, 2)])
  out, res = d.decode([0, 1, 2], max_tokens=[8, 5, 7], turn_segments=3)
  np.testing.assert_array_equal(np.asarray(out.lengths)[:3], [8, 5, 7])
  check_all(model, res)
  _, res = d.decode([0, 1, 2], turn_segments=3)
  check_all(model, res)
  check_invariants(d.cache)


def test_one_prefill_program_reads_cached_contexts_of_any_length(model, monkeypatch):
  """Observation prefills read the cached pages in blocks (2 pages of 4 tokens here), only as
  far as the longest row's cache reaches: contexts of 0 to 6 blocks run through one compiled
  program, with no host read of the cache, and give the dense logits."""
  from tree_rl.sampling import api, prefill_chunks
  monkeypatch.setattr(prefill_chunks, "PREFIX_BLOCK_TOKENS", 8)
  seen = []
  build = api._build.__wrapped__

  def spy(make, graphdef, spec, mesh, data_axis, statics):
    if make is api._prefill_op:
      seen.append(dict(statics)["prefix_pages"])
    return build(make, graphdef, spec, mesh, data_axis, statics)

  monkeypatch.setattr(api, "_build", spy)
  d = Driver(model, max_pages_per_seq=16)            # page size 4: a 64-token page table
  d.prefill({0: list(range(3, 13)), 1: [5, 6, 7]})    # fresh rows: nothing cached yet
  for chunk in ([40, 41, 42], [43] * 9, [44, 45]):    # row 0 holds 9, then 12, then 21 tokens
    out = d.prefill({0: chunk, 1: [50, 51]})
    for row, slot in ((0, 0), (1, 1)):
      np.testing.assert_allclose(_log_softmax(out.logits[row]),
                                 dense_logprobs(model, d.seqs[slot])[-1], atol=2e-4)
  assert set(seen) == {None}   # one static signature (the harness keeps B and T fixed)


def test_prefill_built_ahead_of_time_is_not_built_again(model):
  """prefill(..., run=False) compiles the program for its shapes and changes nothing; the real
  call with those shapes, and a consumer built from the output shapes it hands back, then
  build no program, and the call gives the dense logits."""
  from tree_rl import compile_cache
  d = Driver(model, max_seqs=8, num_pages=80)   # a pool no other test uses: a fresh shape
  tokens = np.zeros((3, 5), np.int32)
  tokens[:, :4] = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
  slots, lens = np.array([0, 1, 2], np.int32), np.array([4, 4, 2], np.int32)
  before, _ = compile_cache.programs_built()
  cache, shapes = sampling.prefill(d.cache, slots, tokens, lens, run=False)
  assert cache is d.cache and int(np.asarray(cache.lens).sum()) == 0
  # a consumer of the output built ahead from the shapes handed back
  consume = jax.jit(lambda o: o.computed + o.status)
  consume.lower(shapes).compile()
  assert compile_cache.programs_built()[0] > before
  built, _ = compile_cache.programs_built()
  cache, out = sampling.prefill(d.cache, slots, tokens, lens)
  consume(out)
  assert compile_cache.programs_built()[0] == built   # neither is built again
  for i in range(3):
    want = dense_logprobs(model, tokens[i, :lens[i]])[-1]
    np.testing.assert_allclose(_log_softmax(out.logits[i]), want, atol=2e-4)


def test_a_reset_cache_of_mesh_placed_weights_needs_no_new_program(model):
  """Weights on a one-device mesh (the learner's) make every operation's output state carry
  that sharding; a new or reset cache starts with it too, so its first prefill finds the
  program an operation's output already met (a differently placed state would build another)."""
  import jax
  from flax import nnx
  from jax.sharding import Mesh, NamedSharding, PartitionSpec
  from tree_rl import compile_cache
  graphdef, state = nnx.split(model)
  mesh = Mesh(np.array(jax.devices()[:1]), ("learner",))
  placed = nnx.merge(graphdef, jax.device_put(state, NamedSharding(mesh, PartitionSpec())))
  cache = sampling.init_cache(placed, max_seqs=8, num_pages=72, page_size=4, max_pages_per_seq=16,
                              kv_dtype="float32")
  tokens, slots, lens = np.ones((2, 3), np.int32), np.array([0, 1], np.int32), np.array([3, 2], np.int32)
  used, _ = sampling.prefill(cache, slots, tokens, lens)      # an operation's output state
  used, _ = sampling.prefill(used, slots + 2, tokens, lens)   # and a prefill on such a state
  fresh = sampling.reset(used, placed)
  assert [a.sharding for a in jax.tree.leaves(fresh.state)] == [a.sharding for a in jax.tree.leaves(used.state)]
  built, _ = compile_cache.programs_built()
  fresh, out = sampling.prefill(fresh, slots, tokens, lens)
  assert (np.asarray(out.status) == sampling.Status.OK).all()
  assert compile_cache.programs_built()[0] == built
