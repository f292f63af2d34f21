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


def test_expand_plan_repeats_parents_in_order():
  slots, dropped = routing.expand_plan(jnp.array([5, 7, 9]), jnp.array([2, 0, 3]), 6)
  np.testing.assert_array_equal(np.array(slots), [5, 5, 9, 9, 9, -1])
  assert int(dropped) == 0
  slots, dropped = routing.expand_plan(jnp.array([5, 7]), jnp.array([3, 2]), 4)
  np.testing.assert_array_equal(np.array(slots), [5, 5, 5, 7])
  assert int(dropped) == 1
