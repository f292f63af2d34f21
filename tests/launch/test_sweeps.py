"""Sweeps: the declarative form, every run of every sweep building a valid locked config, the
papers' ablation values, and clear failures for bad overrides."""

import json
import subprocess
import sys

import pytest

from configs import frozenlake, toolcall
from experiments import sweeps
from experiments.sweeps.build import (SweepError, build, check, check_all, check_equal_budget,
                                     config_args, pages_needed)
from experiments.sweeps.core import Sweep, axis, one_at_a_time
from launch_helpers import REPO
from tree_rl.validation import validate

FL = "configs/frozenlake.py:algo=patr"


def _field(config, dotted):
  for part in dotted.split("."):
    config = getattr(config, part)
  return config


# ------------------------------------------------------------------------------- the form

def test_runs_expand_entries_times_seeds_with_the_seed_last():
  sweep = Sweep("s", FL, {"a": {"rollout.expand_children": 3},
                          "b": {"config": "configs/frozenlake.py:algo=tree_random",
                                "rollout.score_every": 1, "rollout.temperature": 0.5}},
                overrides={"rollout.score_every": 3, "train.num_steps": 2}, seeds=(4, 7))
  runs = sweep.runs()
  assert [r.name for r in runs] == ["a_seed4", "b_seed4", "a_seed7", "b_seed7"]
  a4, b4 = runs[0], runs[1]
  assert a4.config == FL and b4.config == "configs/frozenlake.py:algo=tree_random"
  assert a4.overrides == (("rollout.score_every", 3), ("train.num_steps", 2),
                          ("rollout.expand_children", 3), ("seed", 4))
  assert dict(b4.overrides)["rollout.score_every"] == 1   # the entry's own value wins
  assert b4.train_args("out") == [
      "--config=configs/frozenlake.py:algo=tree_random", "--workdir=out/s/b_seed4",
      "--config.rollout.score_every=1", "--config.train.num_steps=2",
      "--config.rollout.temperature=0.5", "--config.seed=4"]
  assert [r.seed for r in sweep.runs(seeds=[9])] == [9, 9]


def test_form_rejects_bad_names_seed_overrides_and_value_types():
  with pytest.raises(ValueError, match="name"):
    Sweep("bad name", FL, {"a": {}})
  with pytest.raises(ValueError, match="seeds come from"):
    Sweep("s", FL, {"a": {"seed": 3}})
  with pytest.raises(TypeError, match="use bool, int, float or str"):
    Sweep("s", FL, {"a": {"rollout.max_turns": [1, 2]}})
  with pytest.raises(ValueError, match="no entries"):
    Sweep("s", FL, {})


def test_axis_and_one_at_a_time_collapse_restated_base_values():
  k = axis("K", "rollout.score_every", (1, 5))
  assert k == {"K1": {"rollout.score_every": 1}, "K5": {"rollout.score_every": 5}}
  keep = axis("keep", "rollout.keep_pruned", (True, False))
  assert list(keep) == ["keeptrue", "keepfalse"]
  entries = one_at_a_time({"rollout.score_every": 5, "rollout.keep_pruned": True}, k, keep)
  assert entries == {"base": {}, "K1": {"rollout.score_every": 1},
                     "keepfalse": {"rollout.keep_pruned": False}}


# ----------------------------------------------------------------- every run of every sweep

def test_every_run_of_every_sweep_builds_a_valid_locked_config():
  names = sweeps.names()
  assert {"patr_ablation", "tree_grpo_ablation", "budget_curve"} <= set(names)
  workdirs = set()
  for name in names:
    sweep = sweeps.get(name)
    assert sweep.name == name and sweep.seeds[:3] == (0, 1, 2)
    runs = sweep.runs()
    assert len(runs) == len(sweep.seeds) * len(sweep.entries)
    for run, config in zip(runs, check_all(runs)):
      assert config.seed == run.seed
      for key, value in run.overrides:
        assert _field(config, key) == value, (run, key)
      with pytest.raises(AttributeError):
        config.rollout.not_a_field = 1          # locked
      validate(config)
      workdirs.add(run.workdir("runs/sweeps"))
  assert len(workdirs) == sum(len(sweeps.get(n).seeds) * len(sweeps.get(n).entries) for n in names)


def test_patr_ablation_varies_one_factor_at_a_time():
  base = frozenlake.get_config("algo=patr")
  sweep = sweeps.get("patr_ablation")
  configs = {r.entry: c for r, c in zip(sweep.runs([0]), check_all(sweep.runs([0])))}
  papers = {"M2": ("rollout.expand_children", 2), "M3": ("rollout.expand_children", 3),
            "K1": ("rollout.score_every", 1), "K3": ("rollout.score_every", 3),
            "K5": ("rollout.score_every", 5), "top1": ("rollout.expand_top_k", 1),
            "top2": ("rollout.expand_top_k", 2), "top4": ("rollout.expand_top_k", 4),
            "keep_all": ("rollout.keep_pruned", True), "drop_pruned": ("rollout.keep_pruned", False),
            "best_n": ("rollout.keep_best", base.rollout.initial_branches),
            "heuristic": ("scorer.name", "heuristic"), "judge": ("scorer.name", "judge")}
  # Values the base config already has are covered by the single `base` entry.
  want = {e: kv for e, kv in papers.items() if _field(base, kv[0]) != kv[1]}
  assert len(want) >= 7
  assert set(configs) == {"base", "random", *want}
  knobs = [k for k, _ in papers.values()]
  for entry, (key, value) in want.items():
    c = configs[entry]
    assert _field(c, key) == value and c.rollout.method == "patr"
    for knob in knobs:                           # every other knob stays at the base value
      if knob != key:
        assert _field(c, knob) == _field(base, knob), (entry, knob)
  assert all(_field(configs["base"], k) == _field(base, k) for k in knobs)
  assert configs["base"].rollout.method == "patr"
  assert configs["random"].rollout.method == "tree_random"


def test_single_axis_sweeps_cover_the_papers_values():
  def values(name, key):
    return sorted(_field(c, key) for c in check_all(sweeps.get(name).runs([0])))
  assert values("patr_expand", "rollout.expand_children") == [2, 3]
  assert values("patr_interval", "rollout.score_every") == [1, 3, 5]
  assert values("patr_topk", "rollout.expand_top_k") == [1, 2, 4]
  assert values("patr_keep_pruned", "rollout.keep_pruned") == [False, True, True]
  assert values("patr_keep_pruned", "rollout.keep_best") == [0, 0, 4]   # Best_n with n = B0
  methods = [(c.rollout.method, c.scorer.name) for c in check_all(sweeps.get("patr_scorer").runs([0]))]
  assert methods == [("patr", "heuristic"), ("patr", "judge"), ("tree_random", "heuristic")]
  assert values("tree_grpo_advantage", "learner.advantage") == ["tree_grpo", "tree_inter", "tree_intra"]
  assert values("toolcall_tree_grpo_advantage", "learner.advantage") == [
      "tree_grpo", "tree_inter", "tree_intra"]
  shapes = {(c.rollout.expand_nodes, c.rollout.expand_iterations): c.rollout.keep_leaves
            for c in check_all(sweeps.get("tree_grpo_shape").runs([0]))}
  r = frozenlake.get_config("algo=tree_grpo").rollout
  assert set(shapes) == ({(n, r.expand_iterations) for n in (1, 2, 4)}
                         | {(r.expand_nodes, l) for l in (1, 2, 3)})
  # the public code's K = 3 random leaves per tree; the 2-leaf tree (N=1, L=1) keeps both
  assert shapes == {(1, 1): 0, (2, 1): 3, (4, 1): 3, (2, 2): 3, (2, 3): 3}
  qa = check_all(sweeps.get("toolcall_patr_scorer").runs([0]))
  assert {c.env.name for c in qa} == {"toolcall"} and {c.rollout.score_every for c in qa} == {2}


@pytest.mark.parametrize("name,module", [("budget_curve", frozenlake), ("toolcall_budget_curve", toolcall)])
def test_budget_curves_give_every_method_the_same_budget(name, module):
  r = module.get_config("algo=grpo").rollout
  one = r.max_turns * r.max_tokens_per_turn
  sweep = sweeps.get(name)
  seen = set()
  for run, c in zip(sweep.runs([0]), check_all(sweep.runs([0]))):
    algo, k = run.entry.rsplit("_b", 1)
    k = int(k)
    seen.add((algo, k))
    assert c.rollout.budget == k * one and c.rollout.budget_unit == "generated"
    assert c.rollout.method == {"grpo": "chain", "dapo": "chain", "gigpo": "chain"}.get(algo, algo)
    rc = c.rollout
    if algo in ("grpo", "dapo", "gigpo"):
      assert rc.group_size == k and c.learner.advantage == {"gigpo": "gigpo"}.get(algo, "grpo")
    elif algo == "tree_grpo":   # M * (1 + L*N/2) = k trajectories, the base N and L
      assert (rc.expand_nodes, rc.expand_iterations) == (2, 1) and rc.num_trees * 2 == k
    elif algo == "arpo":   # worst case: B0 chains, every other branch forked after turn 2
      t = rc.max_turns
      worst = (rc.initial_branches * t + (rc.max_branches - rc.initial_branches) * (t - 1)) / t
      assert abs(worst - k) <= 0.1 * k and abs(2 * rc.initial_branches - k) <= 1
    else:   # B0 branches plus the top-k expansions of each scoring round, all alive
      assert simulated_patr_trajectories(rc) == pytest.approx(k)
  algos = ("grpo", "tree_grpo", "patr", "tree_random", "dapo", "gigpo", "arpo")
  assert seen == {(a, k) for a in algos for k in (2, 4, 8, 16)}
  assert sweep.equal_budget == tuple(tuple(f"{a}_b{k}" for a in algos) for k in (2, 4, 8, 16))


def simulated_patr_trajectories(rc):
  """Branch by branch: every branch alive, the top-k of each round at turn K, 2K, ... forks into
  M, a child started at turn t runs max_turns - t turns (independent of the planner's loop)."""
  starts = [0] * rc.initial_branches
  for t in range(rc.score_every, rc.max_turns, rc.score_every):
    alive = len(starts)
    for _ in range(min(rc.expand_top_k, alive)):
      if len(starts) + rc.expand_children - 1 <= rc.max_branches:
        starts += [t] * (rc.expand_children - 1)
  return sum(rc.max_turns - t for t in starts) / rc.max_turns


@pytest.mark.parametrize("name", ["budget_curve", "toolcall_budget_curve", "frozenlake_methods",
                                  "frozenlake_reproduction", "frozenlake_ablations",
                                  "frozenlake_long", "toolcall_reproduction"])
def test_shipped_equal_budget_sweeps_plan_equal_costs(name):
  sweep = sweeps.get(name)   # get refuses an unequal one
  costs = check_equal_budget(sweep)
  assert set(costs) == {e for g in sweep.equal_budget for e in g} and sweep.equal_budget
  for group in sweep.equal_budget:
    values = [costs[e] for e in group]
    assert max(values) <= 1.1 * min(values)


def test_frozenlake_methods_compare_at_the_chain_group_budget():
  assert frozenlake.get_config("algo=grpo").rollout.group_size == 8   # PATR's GRPO baseline
  configs = {r.entry: c for r, c in zip(sweeps.get("frozenlake_methods").runs([0]),
                                        check_all(sweeps.get("frozenlake_methods").runs([0])))}
  g = configs["grpo"].rollout.group_size
  assert g == 8
  t = configs["tree_grpo"].rollout
  assert t.num_trees * (1 + t.expand_iterations * t.expand_nodes / 2) == g
  for algo in ("patr", "tree_random"):
    assert simulated_patr_trajectories(configs[algo].rollout) == pytest.approx(g)
  for algo in ("dapo", "gigpo"):
    assert configs[algo].rollout.group_size == g and configs[algo].rollout.method == "chain"
  a = configs["arpo"].rollout   # B0 = 4 chains, a cap of 8: 4 forks redoing turns 2..10
  assert (a.method, a.initial_branches, a.max_branches) == ("arpo", 4, 8)


def test_frozenlake_reproduction_runs_the_issue_arms_on_the_testbed():
  repro, abl = sweeps.get("frozenlake_reproduction"), sweeps.get("frozenlake_ablations")
  assert repro.seeds == (0, 1, 2, 3, 4) and abl.seeds == (0, 1, 2)
  c = {r.entry: cfg for r, cfg in zip(repro.runs([0]), check_all(repro.runs([0])))}
  c.update({r.entry: cfg for r, cfg in zip(abl.runs([0]), check_all(abl.runs([0])))})
  testbed = frozenlake.get_config("algo=grpo,testbed")
  assert testbed.env.local_view
  assert all(cfg.env == testbed.env and cfg.warmstart == testbed.warmstart for cfg in c.values())
  assert c["grpo"].rollout.group_size == 8 and c["grpo"].rollout.method == "chain"
  for name, trajectories in (("tree_grpo", 8), ("tree_grpo_quarter", 2), ("tree_grpo_intra", 8),
                             ("tree_grpo_inter", 8)):
    t = c[name].rollout
    assert t.num_trees * (1 + t.expand_iterations * t.expand_nodes / 2) == trajectories
    assert (t.expand_nodes, t.expand_iterations) == (2, 1)
  assert [c[n].learner.advantage for n in ("tree_grpo", "tree_grpo_intra", "tree_grpo_inter")] \
      == ["tree_grpo", "tree_intra", "tree_inter"]
  for name in ("tree_random", "patr", "patr_drop_pruned", "patr_best_n"):
    assert simulated_patr_trajectories(c[name].rollout) == pytest.approx(8)
  assert (c["patr"].rollout.keep_pruned, c["patr"].rollout.keep_best) == (True, 0)
  assert c["patr_drop_pruned"].rollout.keep_pruned is False
  assert c["patr_best_n"].rollout.keep_best == c["patr"].rollout.initial_branches
  assert (c["tree_random"].rollout.method, c["patr"].rollout.method) == ("tree_random", "patr")


def test_frozenlake_long_runs_the_five_arms_on_the_long_testbed_at_its_own_shapes():
  sweep = sweeps.get("frozenlake_long")
  assert sweep.seeds == (0, 1, 2, 3, 4)
  c = {r.entry: cfg for r, cfg in zip(sweep.runs([0]), check_all(sweep.runs([0])))}
  assert set(c) == {"grpo", "tree_grpo", "tree_random", "patr", "tree_grpo_quarter"}
  long = frozenlake.get_config("algo=grpo,testbed_long")
  assert (long.env.preset, long.env.grid, long.env.local_view, long.rollout.max_turns) == (
      "long", False, True, 16)
  assert all(cfg.env == long.env and cfg.warmstart == long.warmstart for cfg in c.values())
  for name, trajectories in (("tree_grpo", 8), ("tree_grpo_quarter", 2)):
    t = c[name].rollout
    assert t.num_trees * (1 + t.expand_iterations * t.expand_nodes / 2) == trajectories
  for name in ("tree_random", "patr"):
    r = c[name].rollout
    assert r.score_every == 4 and r.expand_top_k == 2 and r.expand_children == 2
    # 16 turns scored at 4, 8 and 12: B0 = 5 and the top 2 of each scoring plan about 8
    assert simulated_patr_trajectories(r) == pytest.approx(8, rel=0.1)


def test_toolcall_reproduction_runs_chain_and_trees_on_the_testbed():
  sweep = sweeps.get("toolcall_reproduction")
  assert sweep.seeds == (0, 1, 2, 3, 4)
  c = {r.entry: cfg for r, cfg in zip(sweep.runs([0]), check_all(sweep.runs([0])))}
  assert set(c) == {"grpo", "tree_grpo", "tree_grpo_quarter"}
  testbed = toolcall.get_config("algo=grpo,testbed")
  assert all(cfg.env == testbed.env and cfg.warmstart == testbed.warmstart for cfg in c.values())
  assert c["grpo"].rollout.group_size == 8 and c["grpo"].rollout.method == "chain"
  for name, trajectories in (("tree_grpo", 8), ("tree_grpo_quarter", 2)):
    t = c[name].rollout
    assert t.num_trees * (1 + t.expand_iterations * t.expand_nodes / 2) == trajectories
    assert c[name].learner.advantage == "tree_grpo"


def test_runs_of_one_seed_across_report_sweeps_can_share_one_warm_start():
  # run_reproductions copies the first run's step-0 checkpoint into the others of its seed:
  # valid only where everything the warm start reads is equal.
  runs = sweeps.get("frozenlake_reproduction").runs([1]) + sweeps.get("frozenlake_ablations").runs([1])
  configs = check_all(runs)
  reads = {(cfg.seed, json.dumps({k: cfg[k].to_dict() for k in ("warmstart", "env", "model",
                                                                "tokenizer")}, sort_keys=True))
           for cfg in configs}
  assert len(reads) == 1


def test_unequal_budget_sweep_is_refused_naming_the_entries():
  # chain G=4 plans 4 trajectories (640 tokens); PATR's base B0=4 + top-2 at turn 5 of 10 plans 5 (800)
  sweep = Sweep("uneq", FL, {"chain4": {"config": "configs/frozenlake.py:algo=grpo",
                                        "rollout.group_size": 4},
                             "patr_base": {}, "patr3": {"rollout.initial_branches": 3,
                                                        "rollout.max_branches": 5}},
                equal_budget=(("chain4", "patr_base", "patr3"),))
  with pytest.raises(SweepError, match=r"uneq: equal-budget entries differ by more than 10% in planned "
                                       r"cost \(generated per prompt\): chain4=640, patr_base=800, patr3=640"):
    check_equal_budget(sweep)
  sweeps.register("uneq", lambda: sweep)
  try:
    with pytest.raises(SweepError, match="chain4=640, patr_base=800"):
      sweeps.get("uneq")
  finally:
    sweeps._FACTORIES.pop("uneq")
  ok = sweep.replace(equal_budget=(("chain4", "patr3"),))
  assert check_equal_budget(ok) == {"chain4": 640.0, "patr3": 640.0}
  with pytest.raises(ValueError, match="unknown entries \\['nope'\\]"):
    Sweep("s", FL, {"a": {}}, equal_budget=(("a", "nope"),))


def test_page_pool_is_raised_only_where_the_rollout_needs_it():
  sweep = sweeps.get("budget_curve")
  raw = frozenlake.get_config("algo=patr")
  for entry in ("patr_b16", "patr_b2"):
    run = sweep.run(entry, 0)
    config = check(run)
    assert pages_needed(config) <= config.sampler.num_pages
    overrides = dict(run.overrides)
    if entry == "patr_b16":
      # Without the raised pool the same run fails training's own page check (on one data
      # shard: the sweep sizes the pool for one, so it holds on any machine).
      assert overrides["sampler.num_pages"] > raw.sampler.num_pages
      del overrides["sampler.num_pages"]
      overrides["sampler.data_shards"] = 1
      bare = Sweep("bare", run.config, {"e": {k: v for k, v in overrides.items() if k != "seed"}})
      with pytest.raises(SweepError, match=f"config.sampler.num_pages={raw.sampler.num_pages} is too small"):
        check(bare.run("e", 0))
    else:
      assert "sampler.num_pages" not in overrides


# ------------------------------------------------------------------------------ bad overrides

@pytest.mark.parametrize("overrides,needles", [
    ({"rollout.expand_chldren": 3}, ["bad/e_seed0", "--config.rollout.expand_chldren",
                                     'Did you mean "expand_children"']),
    ({"rolout.expand_children": 3}, ["--config.rolout.expand_children", 'Did you mean "rollout"']),
    ({"rollout.max_turns": "ten"}, ["--config.rollout.max_turns=ten", "invalid literal"]),
    ({"rollout.budget": 10}, ["config.rollout.budget=10", "less than one trajectory"]),
    ({"scorer.name": "oracle"}, ["bad/e_seed0", "oracle"]),
])
def test_bad_overrides_fail_with_one_line_naming_the_run_and_field(overrides, needles):
  run = Sweep("bad", FL, {"e": overrides}).run("e", 0)
  with pytest.raises(SweepError) as err:
    check(run)
  message = str(err.value)
  assert "\n" not in message
  for needle in needles:
    assert needle in message


def test_registry_get_unknown_and_register():
  with pytest.raises(KeyError, match="known: .*patr_ablation"):
    sweeps.get("patr_ablaton")
  sweeps.register("tmp_sweep", lambda: Sweep("tmp_sweep", FL, {"x": {"rollout.score_every": 2}}))
  try:
    assert "tmp_sweep" in sweeps.names()
    assert sweeps.get("tmp_sweep").runs()[0].name == "x_seed0"
  finally:
    sweeps._FACTORIES.pop("tmp_sweep")
    sweeps._BUILT.pop("tmp_sweep", None)


# ------------------------------------------------------------------- parity with the trainer

def test_train_builds_the_same_config_from_the_printed_arguments():
  for name, entry in (("patr_ablation", "best_n"), ("budget_curve", "tree_grpo_b16")):
    run = sweeps.get(name).run(entry, 2)
    proc = subprocess.run([sys.executable, "-m", "experiments.train", *run.train_args("runs/sweeps"),
                           "--print_config"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(build(run).to_json_best_effort())


def test_extra_arguments_override_a_run_and_only_config_flags_are_read():
  """Arguments added to every run (the runner's `-- ...`) come after the run's own overrides
  and win, in any absl spelling; the entry point's other flags are not the config's."""
  extra = ["--compile_cache=", "--config.train.num_steps", "7", "-config.learner.learning_rate=0.5",
           "--noconfig.rollout.keep_pruned", "--print_config"]
  assert config_args(extra) == extra[1:5]
  run = sweeps.get("patr_keep_pruned").run("keep_all", 0)   # sets rollout.keep_pruned=true
  assert build(run).rollout.keep_pruned is True
  config = build(run, extra=extra)
  assert (config.train.num_steps, config.learner.learning_rate) == (7, 0.5)
  assert config.rollout.keep_pruned is False
