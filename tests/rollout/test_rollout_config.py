"""Method and scorer selection by config; impossible settings fail naming the field."""

import pytest

from tree_rl.config import base_config
from tree_rl.rollout import build, methods


def test_every_method_selectable_with_its_config_fields():
  c = base_config()
  for name in ("chain", "tree_grpo", "patr", "tree_random", "arpo"):
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
  from tree_rl.envs.frozenlake import FrozenLake
  c = base_config()
  c.sampler.max_shared_pages, c.sampler.attention = 12, "cascade"
  tok = BuiltinTokenizer()
  engine = build.make_engine(c, FrozenLake("rllm_small", tokenizer=tok), tok)
  assert (engine.max_shared_pages, engine.attention) == (12, "cascade")
  assert engine.entropy_tokens == 0                      # evaluation engines: no entropy
  c.rollout.method, c.rollout.entropy_tokens = "arpo", 7
  method, engine, _ = build.make_training_engine(c, FrozenLake("rllm_small", tokenizer=tok), tok)
  assert method.entropy_tokens == engine.entropy_tokens == 7
  assert method.entropy_top == engine.entropy_top == 10     # the reference's top-10 listing
  c.rollout.arpo_entropy = "mean"
  assert build.make_training_engine(c, FrozenLake("rllm_small", tokenizer=tok), tok)[1].entropy_top == 0
  c.rollout.method = "patr"
  assert build.make_training_engine(c, FrozenLake("rllm_small", tokenizer=tok), tok)[1].entropy_tokens == 0


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
  with pytest.raises(ValueError, match=f"config.rollout.keep_best={best} must be"):
    build.validate(c)


# ------------------------------------------------------------------- planned cost (budgets)

def _rc(**fields):
  from tree_rl.config import base_config
  r = base_config().rollout
  r.max_turns, r.max_tokens_per_turn = 10, 16
  for k, v in fields.items():
    r[k] = v
  return r


@pytest.mark.parametrize("fields, trajectories", [
    (dict(method="chain", group_size=4), 4),
    # Tree-GRPO: M chains + M*L*N expansions half-way down: 2 * (1 + 2/2) = 4; 3 * (1 + 2*4/2) = 15
    (dict(method="tree_grpo", num_trees=2, expand_nodes=2, expand_iterations=1), 4),
    (dict(method="tree_grpo", num_trees=3, expand_nodes=4, expand_iterations=2), 15),
    # PATR: B0=4, top-2 into 2 at turn 5 of 10 (one round): 4 + 2 * 5/10 = 5
    (dict(method="patr", initial_branches=4, expand_children=2, score_every=5, expand_top_k=2,
          max_branches=8), 5),
    # 6 turns, K=2: rounds at turns 2 and 4; B0=2, top-1 into 3: 2 + 2 * 4/6 + 2 * 2/6 = 4
    (dict(method="tree_random", max_turns=6, initial_branches=2, expand_children=3, score_every=2,
          expand_top_k=1, max_branches=7), 4),
    # the same with room for one more expansion only: 2 + 2 * 4/6 = 3 1/3
    (dict(method="patr", max_turns=6, initial_branches=2, expand_children=3, score_every=2,
          expand_top_k=1, max_branches=5), 2 + 4 / 3),
    # ARPO: its full group, every rollout at most a whole trajectory (fresh chains fill it, with
    # forks or without: expand_children = 1)
    (dict(method="arpo", initial_branches=4, max_branches=8), 8),
    (dict(method="arpo", max_turns=2, initial_branches=3, max_branches=6, arpo_rule="threshold",
          entropy_threshold=-0.5), 6),
    (dict(method="arpo", initial_branches=3, expand_children=1, max_branches=8), 8),
])
def test_planned_cost_equals_hand_computation(fields, trajectories):
  from tree_rl.rollout.budget import planned_cost, planned_trajectories
  rc = _rc(**fields)
  assert planned_trajectories(rc) == pytest.approx(trajectories)
  t, n = rc.max_turns, rc.max_tokens_per_turn
  assert planned_cost(rc, "generated") == pytest.approx(trajectories * t * n)
  assert planned_cost(rc, "env_steps") == pytest.approx(trajectories * t)
  assert planned_cost(rc, "tool_calls", max_calls=3) == pytest.approx(trajectories * min(t, 3))
  # computed: the prompt, every reply, every observation but the last one's (+1 pending token)
  assert planned_cost(rc, "computed", prompt_tokens=50, obs_tokens=20) == pytest.approx(
      trajectories * (50 + t * n + (t - 1) * 21))
  assert planned_cost(rc, "computed") is None


def test_a_method_without_a_planned_cost_cannot_be_built():
  import dataclasses

  @dataclasses.dataclass(frozen=True)
  class NoCost(methods.Chain):
    planned_trajectories = methods.RolloutMethod.planned_trajectories   # left abstract

  with pytest.raises(TypeError, match="planned_trajectories"):
    NoCost(name="no_cost", num_trees=1, slots=2, keep_contexts=False, group_size=2)


def test_cost_model_remaining_cost_of_a_branch():
  from tree_rl.rollout.budget import CostModel
  c = CostModel(max_turns=3, max_tokens_per_turn=6, prompt_tokens=40, obs_tokens=10, max_calls=2)
  assert [int(c.remaining("generated", d)) for d in (0, 1, 2, 3)] == [18, 12, 6, 0]
  assert [int(c.remaining("computed", d)) for d in (0, 2)] == [18 + 2 * 11, 6]
  assert [int(c.remaining("tool_calls", d)) for d in (0, 2)] == [2, 1]
  assert c.trajectory("computed") == 40 + 18 + 22 and c.trajectory("env_steps") == 3
  base = CostModel(3, 6, 40, 10, share_prefix=False)   # a fork re-encodes its 25-token context
  assert int(base.remaining("computed", 1, ctx_len=25, fork=True)) == 12 + 11 + 26
