"""Smoke runs of the RL loop: every rollout method on both environments, a couple of steps."""

import os

import numpy as np
import pytest

from configs import frozenlake, toolcall
from tree_rl.metrics import read_jsonl
from tree_rl.train import train_and_evaluate

from loop_helpers import checkpoint_params, max_abs_diff, smoke

METHODS = ["chain", "tree_grpo", "patr", "tree_random", "dapo", "gigpo", "arpo"]


# these run 4 steps and check that no program is built after the first
COMPILES_CHECKED = {(frozenlake, "patr"), (toolcall, "tree_grpo")}


# Tree-Random is PATR's routing with an env-independent random scorer and DAPO a learner recipe
# (test_dapo.py runs it further): on tool-call QA, PATR and the chain runs cover what they touch.
PAIRS = [(m, a) for m in (frozenlake, toolcall) for a in METHODS
         if not (m is toolcall and a in ("tree_random", "dapo"))]


@pytest.mark.parametrize("module,algo", PAIRS)
def test_smoke_run_trains_and_evaluates(tmp_path, data_dir, module, algo):
  n = 4 if (module, algo) in COMPILES_CHECKED else 2
  # learner rows of a fixed shape where compiles are counted: bucketed rows compile again when a
  # step's trees fall into another bucket (rows, length, key-block width), by design
  fixed = {"learner.row_tokens": 480} if n == 4 and module is toolcall else {}
  summary = train_and_evaluate(smoke(module, algo, data_dir, **{"train.num_steps": n}, **fixed),
                               str(tmp_path))
  assert summary["step"] == n and not summary["stopped_early"]
  rows = read_jsonl(os.path.join(str(tmp_path), "metrics.jsonl"))
  steps = [r for r in rows if "learner/loss" in r]
  assert algo == "dapo" or [r["step"] for r in steps] == list(range(1, n + 1))
  if algo == "dapo":   # dynamic sampling: a step without an informative group does no update
    rollouts = [r for r in rows if "rollout/draws" in r]
    assert [r["step"] for r in rollouts] == [1, 2]
    for r in rollouts:
      # draws of 3 x 2 prompts, at most 2 in the smoke
      assert r["rollout/groups_kept"] + r["rollout/groups_dropped"] == 6 * r["rollout/draws"]
      assert (r["learner/updates"] > 0) == (r["rollout/groups_kept"] > 0)
      assert r["rollout/draws"] == 2 or r["rollout/groups_kept"] == 2
      assert r["rollout/groups_short"] == 2 - r["rollout/groups_kept"]
    steps = [r for r in rollouts if r["learner/updates"]]
  for r in steps:
    assert r["rollout/trajectories"] > 0 and r["learner/skipped"] == 0
    assert r["rollout/budget/generated"] > 0 and np.isfinite(r["learner/loss"])
  assert 0.0 <= summary["eval_after"]["eval/greedy_success"] <= 1.0
  # tool calls are reported where the env has tools (tool-call QA), not for FrozenLake
  assert ("eval/sampled_tool_calls" in summary["eval_after"]) == (module is toolcall)
  assert os.path.exists(os.path.join(str(tmp_path), "curves.png"))
  assert os.listdir(os.path.join(str(tmp_path), "tensorboard"))
  if n == 4:   # every shape is built in step 1: later steps compile (or load) no XLA program
    compiles = {r["step"]: r["time/compiles"] for r in steps}
    assert [compiles[s] for s in (2, 3, 4)] == [0, 0, 0], compiles


def test_built_programs_are_counted():
  """`time/compiles` counts from jax.monitoring: a new program adds one, a cached one none."""
  import jax
  from tree_rl import compile_cache
  fn = jax.jit(lambda x: x * 3 + 1)
  before, _ = compile_cache.programs_built()
  fn(np.zeros(7, np.float32))
  fn(np.ones(7, np.float32))
  assert compile_cache.programs_built()[0] == before + 1


def test_learner_micro_batches_in_the_loop_match_one_batch(tmp_path, data_dir):
  """learner.microbatches=3: rows are padded to a multiple of 3 (padding rows weigh nothing) and
  one RL step lands on the same parameters as the undivided batch. The smoke policy wins no
  episode (zero advantages), so an entropy bonus makes the gradient non-zero."""
  params = {}
  for n in (1, 3):
    config = smoke(frozenlake, "tree_random", data_dir, **{
        "learner.microbatches": n, "learner.row_tokens": 0, "learner.entropy_coef": 0.01,
        "train.num_steps": 1})
    summary = train_and_evaluate(config, str(tmp_path / f"mb{n}"))
    assert summary["step"] == 1
    params[n] = checkpoint_params(str(tmp_path / f"mb{n}"), 1)
  assert max_abs_diff(params[1], params[3]) < 1e-5
  # the update moved the weights by far more than that
  assert max_abs_diff(params[1], checkpoint_params(str(tmp_path / "mb1"), 0)) > 1e-4


def test_warm_start_stops_at_the_target_on_train_maps(tmp_path, data_dir, capsys):
  config = smoke(frozenlake, "chain", data_dir, **{
      "warmstart.steps": 6, "warmstart.eval_every": 2, "warmstart.target_success": 0.0,
      "warmstart.eval_prompts": 16, "train.num_steps": 1})
  assert config.warmstart.stop_window == 2   # FrozenLake's rule: the mean of the last 2 checks
  summary = train_and_evaluate(config, str(tmp_path))
  warm = summary["warm_start"]
  assert warm["steps"] == 4 and warm["stopped_early"]        # the first 2-check mean meets target 0
  assert [step for step, _ in warm["evals"]] == [2, 4]
  out = capsys.readouterr().out
  for step, success in warm["evals"]:
    assert 0.0 <= success <= 1.0
    assert f"warm start: step {step}, greedy success {success:.2f} on 16 train tasks" in out


def test_warm_start_checks_more_train_questions_than_the_held_out_eval(tmp_path, data_dir, capsys):
  # tool-call QA's train split has its own env and engine: the check's 16 questions (more than
  # the 8 held-out ones the run's cache was sized for) get their slots in the cache
  config = smoke(toolcall, "chain", data_dir, **{
      "warmstart.steps": 2, "warmstart.eval_every": 2, "warmstart.target_success": 0.0,
      "warmstart.eval_prompts": 16, "train.eval_prompts": 0, "train.num_steps": 1})
  summary = train_and_evaluate(config, str(tmp_path))
  (step, success), = summary["warm_start"]["evals"]
  assert step == 2 and round(success * 16) == success * 16
  assert f"greedy success {success:.2f} on 16 train tasks" in capsys.readouterr().out

