"""An advantage estimator registered with a knob of its own: the knob is a config field with the
registration's default, survives config.json, and reaches the estimator."""

import jax.numpy as jnp
import numpy as np
import pytest

from configs import frozenlake
from tree_rl import config as config_lib
from tree_rl import fields
from tree_rl.learner import advantages, from_rollout
from tree_rl.rollout import tree as tree_lib
from tree_rl.rollout.budget import Budget
from tree_rl.rollout.driver import RolloutOutput


@pytest.fixture
def toy_estimator(monkeypatch):
  """`toy_scaled` (A = scale * (r - 0.5)) with its knob `scale`, registered for one test."""
  monkeypatch.setattr(advantages._REGISTRY, "_items", dict(advantages._REGISTRY._items))
  monkeypatch.setattr(fields, "_DECLARED", {k: dict(v) for k, v in fields._DECLARED.items()})

  @advantages.register("toy_scaled", scale=2.0)
  def toy_scaled(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6, scale=2.0):
    del prompt_ids, tree_ids, eps
    return jnp.where(valid, scale * (rewards - 0.5), 0.0)

  return toy_scaled


def _output(rewards, valid) -> RolloutOutput:
  """Two prompts of two leaves (nodes 1 and 2 under the root), with these outcome rewards."""
  p, l = np.shape(rewards)
  tree = tree_lib.empty(p, 1 + l, 1, jnp.zeros(()))
  return RolloutOutput(tree=tree, leaf=jnp.tile(jnp.arange(1, l + 1, dtype=jnp.int32), (p, 1)),
                       valid=jnp.asarray(valid, bool), reward=jnp.asarray(rewards, jnp.float32),
                       tree_id=jnp.zeros((p, l), jnp.int32),
                       state_key=jnp.zeros((p, 1 + l), jnp.int32), budget=Budget.zeros(p),
                       stats={})


def test_the_knob_is_a_config_field_that_round_trips_and_reaches_the_estimator(toy_estimator):
  c = frozenlake.get_config("algo=grpo,smoke")
  assert c.learner.scale == 2.0                  # the registration's default
  c.learner.advantage, c.learner.scale = "toy_scaled", 3.0
  c = config_lib.from_json(c.to_json())          # as a run's config.json is read back
  assert (c.learner.advantage, c.learner.scale) == ("toy_scaled", 3.0)
  out = _output(rewards=[[1.0, 0.0], [0.5, 0.25]], valid=[[True, True], [True, False]])
  # 3 * (r - 0.5) on the valid leaves, 0 on the dropped one
  np.testing.assert_allclose(np.asarray(from_rollout.advantages(c.learner, out, max_turns=c.rollout.max_turns)), [1.5, -1.5, 0.0, 0.0])
  c.learner.scale = 1.0
  np.testing.assert_allclose(np.asarray(from_rollout.advantages(c.learner, out, max_turns=c.rollout.max_turns)), [0.5, -0.5, 0.0, 0.0])


def test_gigpo_declares_its_step_knobs():
  assert advantages.knobs("gigpo") == {"step_weight": 1.0, "step_gamma": 0.95,
                                       "episode_stats": "step_rows"}
  assert advantages.knobs("grpo") == {}
  lc = config_lib.base_config().learner
  assert (lc.step_weight, lc.step_gamma, lc.episode_stats) == (1.0, 0.95, "step_rows")


def test_a_knob_the_estimator_does_not_take_or_a_second_default_is_refused(monkeypatch):
  monkeypatch.setattr(advantages._REGISTRY, "_items", dict(advantages._REGISTRY._items))
  monkeypatch.setattr(fields, "_DECLARED", {k: dict(v) for k, v in fields._DECLARED.items()})

  def plain(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6, step_gamma=0.9):
    return rewards

  with pytest.raises(TypeError, match="'bad'.*\\['scale'\\]"):
    advantages.register("bad", scale=1.0)(plain)
  with pytest.raises(ValueError, match="step_gamma defaults to 0.9.*0.95"):
    advantages.register("bad", step_gamma=0.9)(plain)
  assert "bad" not in advantages.names()
