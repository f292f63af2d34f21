"""Routing policies on hand-built score vectors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tree_rl.rollout import routing


def test_masked_median_odd_even_empty():
  v = jnp.array([0.9, 0.1, 0.5, 7.0])
  assert float(routing.masked_median(v, jnp.array([1, 1, 1, 0], bool))) == pytest.approx(0.5)
  assert float(routing.masked_median(v, jnp.array([1, 1, 1, 1], bool))) == pytest.approx(0.7)
  assert np.isnan(float(routing.masked_median(v, jnp.zeros(4, bool))))


def route(scores, active, run, **kw):
  kw = dict(alpha=0.3, theta=3, top_k=1, children=3, room=jnp.int32(100)) | kw
  r = routing.patr_route(jnp.array(scores, jnp.float32), jnp.array(active, bool),
                         jnp.array(run, jnp.int32), **kw)
  return np.array(r.multiplicity), np.array(r.expand), np.array(r.prune)


def test_patr_expand_survive_prune():
  # median over active {0.9, 0.1, 0.5, 0.6, 0.55} = 0.55; prune below 0.25 -> branch 1.
  mult, expand, prune = route([0.9, 0.1, 0.5, 0.6, 0.55, 0.99], [1, 1, 1, 1, 1, 0], [1] * 6)
  np.testing.assert_array_equal(mult, [3, 0, 1, 1, 1, 0])
  np.testing.assert_array_equal(expand, [1, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(prune, [0, 1, 0, 0, 0, 0])


def test_patr_top_k_and_room_cap():
  scores, active, run = [0.2, 0.8, 0.7, 0.6], [1, 1, 1, 1], [1] * 4
  mult, _, _ = route(scores, active, run, top_k=2, alpha=1.0)
  np.testing.assert_array_equal(mult, [1, 3, 3, 1])
  # Each expansion into 3 adds 2 branches: room for 3 new branches allows only one expansion.
  mult, _, _ = route(scores, active, run, top_k=2, alpha=1.0, room=jnp.int32(3))
  np.testing.assert_array_equal(mult, [1, 3, 1, 1])
  mult, _, _ = route(scores, active, run, top_k=2, alpha=1.0, room=jnp.int32(0))
  np.testing.assert_array_equal(mult, [1, 1, 1, 1])


def test_patr_repeated_action_rule_fires_at_theta():
  scores, active = [0.9, 0.5, 0.5, 0.5], [1, 1, 1, 1]
  mult, expand, prune = route(scores, active, [3, 2, 1, 1], theta=3)
  # The best branch repeats its action Theta times: pruned, so the next best is expanded.
  np.testing.assert_array_equal(prune, [1, 0, 0, 0])
  np.testing.assert_array_equal(expand, [0, 1, 0, 0])
  np.testing.assert_array_equal(mult, [0, 3, 1, 1])
  _, _, prune = route(scores, active, [2, 2, 1, 1], theta=3)
  assert not prune.any()
  r = routing.loop_prune(jnp.array([1, 1, 0], bool), jnp.array([6, 5, 9]), theta=6)
  np.testing.assert_array_equal(np.array(r.prune), [1, 0, 0])
  np.testing.assert_array_equal(np.array(r.multiplicity), [0, 1, 0])
  r = routing.loop_prune(jnp.array([1, 1], bool), jnp.array([60, 5]), theta=0)
  assert not np.array(r.prune).any()


def test_tree_grpo_pick_only_candidates_of_each_tree_uniformly():
  cand = jnp.array([1, 1, 0, 1, 1, 0, 0, 1], bool)
  tree_id = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
  picks = jax.vmap(lambda k: routing.tree_grpo_pick(k, cand, tree_id, 2, 3))(
      jax.random.split(jax.random.key(0), 4000))
  picks = np.array(picks)
  assert picks.shape == (4000, 6)
  t0, t1 = picks[:, :3].ravel(), picks[:, 3:].ravel()
  assert set(t0) == {0, 1, 3} and set(t1) == {4, 7}
  freq = np.bincount(t0, minlength=8)[[0, 1, 3]] / t0.size
  np.testing.assert_allclose(freq, 1 / 3, atol=0.02)
  none = routing.tree_grpo_pick(jax.random.key(1), jnp.zeros(8, bool), tree_id, 2, 2)
  np.testing.assert_array_equal(np.array(none), [-1] * 4)


def test_keep_random_leaves_per_tree():
  leaf = jnp.array([1, 1, 1, 1, 0, 1, 1, 0], bool)
  tree_id = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
  kept = np.array(routing.keep_random_leaves(jax.random.key(3), leaf, tree_id, 2, 3))
  assert kept[:4].sum() == 3 and kept[4:].sum() == 2 and not kept[[4, 7]].any()
  np.testing.assert_array_equal(np.array(routing.keep_random_leaves(None, leaf, tree_id, 2, 0)), leaf)


def test_keep_three_leaves_per_tree_uniformly():
  # trees of 5 and 3 leaves (1 + L*N) and one whose expansions the budget stopped (2 leaves)
  tree_id = jnp.array([0] * 5 + [1] * 3 + [2] * 2 + [0, 1])
  leaf = jnp.array([1] * 10 + [0, 0], bool)
  keys = jax.random.split(jax.random.key(0), 3000)
  kept = np.array(jax.vmap(lambda k: routing.keep_random_leaves(k, leaf, tree_id, 3, 3))(keys))
  per_tree = np.stack([kept[:, :5].sum(1), kept[:, 5:8].sum(1), kept[:, 8:10].sum(1)], 1)
  assert (per_tree == [3, 3, 2]).all() and not kept[:, 10:].any()
  np.testing.assert_allclose(kept[:, :5].mean(0), 3 / 5, atol=0.04)   # each leaf equally likely


def test_last_score_on_the_path_and_best_n_ties():
  nan = np.nan
  # 0 root; 1 scored 0.25 -> 2 -> 3 (unscored); 1 -> 4 scored 0.75 -> 5; 6 a root-level leaf never scored
  score = jnp.array([nan, 0.25, nan, nan, 0.75, nan, nan])
  parent = jnp.array([-1, 0, 1, 2, 1, 4, 0])
  np.testing.assert_array_equal(np.array(routing.last_scores(score, parent)),
                                [nan, 0.25, 0.25, 0.25, 0.75, 0.75, nan])
  finished = jnp.array([0, 0, 0, 1, 0, 0, 0], bool)
  ret = jnp.array([0, 0, 0, 1.0, 0, 0, 0])
  rank = np.array(routing.best_leaf_score(score, parent, finished, ret))
  np.testing.assert_array_equal(rank[[3, 5, 6]], [1.0, 0.75, -np.inf])  # outcome, last score, none
  cand = jnp.array([0, 0, 1, 1, 1, 1, 1], bool)
  tied = jnp.array([9.0, 9.0, 0.5, 0.7, 0.5, 0.5, -jnp.inf])
  best = lambda n: np.nonzero(np.array(routing.keep_best_leaves(tied, cand, n)))[0].tolist()  # noqa: E731
  assert best(1) == [3] and best(2) == [2, 3] and best(3) == [2, 3, 4]   # ties: lower index
  assert best(5) == [2, 3, 4, 5, 6] and best(9) == [2, 3, 4, 5, 6]      # non-candidates never


def test_expand_plan_repeats_parents_in_order():
  slots, dropped = routing.expand_plan(jnp.array([5, 7, 9]), jnp.array([2, 0, 3]), 6)
  np.testing.assert_array_equal(np.array(slots), [5, 5, 9, 9, 9, -1])
  assert int(dropped) == 0
  slots, dropped = routing.expand_plan(jnp.array([5, 7]), jnp.array([3, 2]), 4)
  np.testing.assert_array_equal(np.array(slots), [5, 5, 5, 7])
  assert int(dropped) == 1
