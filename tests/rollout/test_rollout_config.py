"""Method and scorer selection by config; impossible settings fail naming the field."""

import pytest

from tree_rl.config import base_config
from tree_rl.rollout import build, methods


def test_every_method_selectable_with_its_config_fields():
  c = base_config()
  for name in ("chain", "tree_grpo", "patr", "tree_random"):
    c.rollout.method = name
    method = build.make_method(c)
    assert method.name == name
  c.rollout.method = "tree_grpo"
  c.rollout.num_trees, c.rollout.expand_nodes, c.rollout.expand_iterations = 3, 2, 2
  p = build.make_method(c)
  assert (p.num_trees, p.expand_nodes, p.expand_iterations, p.slots) == (3, 2, 2, 6)
  assert p.capacity(4) == 3 + 3 * (1 + 2 * 2) * 4
  c.rollout.method = "tree_random"
  assert build.make_method(c).scorer_override == "random"


def test_custom_method_registered_by_name():
  @methods.register("chain_of_two")
  def make(rc):
    return methods.Chain(name="chain_of_two", num_trees=1, slots=2, keep_contexts=False, group_size=2)

  c = base_config()
  c.rollout.method = "chain_of_two"
  assert build.make_method(c).slots == 2


@pytest.mark.parametrize("field,value,match", [
    ("method", "beam", "config.rollout.method"),
    ("budget_unit", "dollars", "budget_unit"),
    ("max_turns", 0, "max_turns"),
    ("budget", -1, "budget"),
    ("initial_branches", 32, "max_branches"),
    ("expand_children", 0, "expand_children"),
])
def test_bad_rollout_settings_fail_with_field_name(field, value, match):
  c = base_config()
  c.rollout[field] = value
  with pytest.raises((ValueError, KeyError), match=match):
    build.validate(c)


def test_unknown_scorer_fails_for_scoring_methods():
  c = base_config()
  c.scorer.name = "oracle"
  with pytest.raises(KeyError, match="config.scorer.name"):
    build.validate(c)
  c.rollout.method = "chain"
  build.validate(c)     # chain never scores


def test_sampler_knobs_reach_the_engine():
  from tree_rl.models import BuiltinTokenizer
  from tree_rl.envs import FrozenLake
  c = base_config()
  c.sampler.max_shared_pages, c.sampler.attention = 12, "cascade"
  tok = BuiltinTokenizer()
  engine = build.make_engine(c, FrozenLake("rllm_small", tokenizer=tok), tok)
  assert (engine.max_shared_pages, engine.attention) == (12, "cascade")


def test_tree_grpo_keeps_three_leaves_and_refuses_smaller_trees():
  c = base_config()
  c.rollout.method = "tree_grpo"
  assert c.rollout.keep_leaves == 3 and build.make_method(c).keep_k == 3   # the public code's K
  for n, l in ((1, 1), (2, 0)):   # 1 + L*N = 2 and 1 leaves per tree
    c.rollout.expand_nodes, c.rollout.expand_iterations = n, l
    with pytest.raises(ValueError, match=rf"config\.rollout\.keep_leaves=3 .* 1 \+ L\*N = {1 + l * n}"):
      build.validate(c)
    c.rollout.keep_leaves = 0                                   # keep all: allowed
    build.validate(c)
    c.rollout.keep_leaves = 3
  c.rollout.expand_nodes, c.rollout.expand_iterations = 1, 2    # 3 leaves: allowed
  build.validate(c)


@pytest.mark.parametrize("best", [-1, 17])
def test_patr_keep_best_outside_the_group_is_refused(best):
  c = base_config()                # max_branches 16
  c.rollout.keep_best = best
  with pytest.raises(ValueError, match=f"config.rollout.keep_best={best} must be in"):
    build.validate(c)
