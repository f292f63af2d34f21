"""A run directory becomes a small summary: cumulative budget, eval rows, training rows, by hand."""

import json
import os

import numpy as np
from report_fixtures import write_run

from experiments.reports import summaries

COST = "rollout/cost_per_prompt/generated"
ROWS = [
    {"step": 0, "eval/greedy_success": 0.25, "eval/sampled_success": 0.2,
     "eval/sampled_success/side_2": 0.5},
    {"step": 1, COST: 100.0, "rollout/trajectories": 8, "rollout/budget/generated": 480,
     "rollout/success_rate": 0.25, "rollout/mean_turns": 3.0, "learner/entropy": 1.5,
     "learner/loss": 0.1, "time/step_s": 2.0},
    {"step": 2, COST: 120.0, "rollout/trajectories": 8, "rollout/budget/generated": 400,
     "rollout/success_rate": 0.5, "time/step_s": 3.0, "eval/greedy_success": 0.5,
     "eval/sampled_success": 1 / 3},
    {"step": 2, COST: 110.0},   # logged again by a resumed run: the later value wins
    {"step": 3, "rollout/cost_per_prompt": 90.0, "learner/entropy": "nan", "time/step_s": 1.0},
    {"step": 4, COST: 80.0, "rollout/trajectories": 6, "time/step_s": 2.0,
     "eval/greedy_success": 0.75, "eval/sampled_success": 0.5},
]


def test_summary_fields_by_hand(tmp_path):
  s = summaries.summarize(write_run(str(tmp_path), "grpo_seed1", ROWS))
  assert (s["method"], s["seed"], s["env"], s["steps"]) == ("grpo", 1, "frozenlake", 4)
  # chain: 4 chains x 10 turns x 16 tokens generated per prompt
  assert s["planned_budget"] == 640.0 and s["budget_unit"] == "generated"
  # per-prompt cost of steps 1..4: 100, 110 (the later row of step 2), 90 (the unit-less key), 80
  assert s["spent_budget"] == 95.0
  assert s["evals"] == [
      {"step": 0, "spent": 0.0, "eval/greedy_success": 0.25, "eval/sampled_success": 0.2,
       "eval/sampled_success/side_2": 0.5},
      {"step": 2, "spent": 210.0, "eval/greedy_success": 0.5, "eval/sampled_success": 0.333333},
      {"step": 4, "spent": 380.0, "eval/greedy_success": 0.75, "eval/sampled_success": 0.5}]
  assert s["train"] == [
      {"step": 1, "rollout/success_rate": 0.25, "rollout/mean_turns": 3.0,
       "rollout/trajectories": 8, "learner/entropy": 1.5, COST: 100.0,
       "rollout/response_tokens_per_trajectory": 60.0},
      {"step": 2, "rollout/success_rate": 0.5, "rollout/trajectories": 8, COST: 110.0,
       "rollout/response_tokens_per_trajectory": 50.0},
      {"step": 3, COST: 90.0},
      {"step": 4, "rollout/trajectories": 6, COST: 80.0}]
  assert s["wall_s"] == 8.0
  # the compact config: the report's sections, the model preset, no long values
  assert sorted(s["config"]) == ["env", "learner", "model", "rollout", "train", "warmstart"]
  assert s["config"]["model"] == {"preset": "tiny"} and "eval_maps" not in s["config"]["env"]
  json.dumps(s, allow_nan=False)


def test_method_and_seed_can_be_given(tmp_path):
  s = summaries.summarize(write_run(str(tmp_path), "odd_name", ROWS[:2]), method="patr", seed=7)
  assert (s["method"], s["seed"], s["evals"][0]["spent"]) == ("patr", 7, 0.0)


def test_unknown_planned_cost_is_null(tmp_path):
  rollout = {"method": "chain", "group_size": 4, "budget_unit": "computed", "max_turns": 10,
             "max_tokens_per_turn": 16, "prompts_per_step": 2}
  assert summaries.summarize(write_run(str(tmp_path), "a_seed0", ROWS, rollout))["planned_budget"] is None


def test_cli_writes_one_file_per_finished_run(tmp_path):
  runs, out = os.path.join(str(tmp_path), "sweep"), os.path.join(str(tmp_path), "out")
  write_run(runs, "both_seed0", ROWS)
  write_run(runs, "intra_seed0", ROWS)
  write_run(runs, "intra_seed1", ROWS, finished=False)
  summaries.main(["--runs", runs, "--out", out, "--prefix", "tree_grpo_",
                  "--rename", "both=tree_grpo"])
  assert sorted(os.listdir(out)) == ["tree_grpo_intra_seed0.json", "tree_grpo_seed0.json"]
  loaded = summaries.load_summaries(out)
  assert [(s["method"], s["seed"]) for s in loaded] == [("tree_grpo_intra", 0), ("tree_grpo", 0)]


def test_a_summary_of_more_steps_is_not_overwritten_by_a_shorter_run(tmp_path, capsys):
  """A run extended elsewhere (its 6-step summary committed) is not replaced by a local copy
  of the run that stopped at 4 steps; a summary of fewer steps is."""
  runs, out = os.path.join(str(tmp_path), "sweep"), os.path.join(str(tmp_path), "out")
  write_run(runs, "grpo_seed0", ROWS)
  write_run(runs, "grpo_seed1", ROWS)
  os.makedirs(out)
  longer, shorter = {"method": "grpo", "seed": 0, "steps": 6}, {"method": "grpo", "seed": 1, "steps": 2}
  for s in (longer, shorter):
    with open(os.path.join(out, f"grpo_seed{s['seed']}.json"), "w") as f:
      json.dump(s, f)
  written = summaries.write_summaries(runs, out)
  assert written == [os.path.join(out, "grpo_seed1.json")]
  assert [s["steps"] for s in summaries.load_summaries(out)] == [6, 4]
  assert "grpo_seed0.json: kept (6 steps" in capsys.readouterr().out


def _warm_start(run_dir, params):
  from tree_rl.checkpointing import Checkpointer
  ckpt = Checkpointer(os.path.join(run_dir, "checkpoints"))
  ckpt.save(0, {"train": {"params": params}, "step": np.int32(0)}, {"step": 0})
  ckpt.close()


def test_the_warm_start_digest_tells_a_copied_warm_start_from_a_recomputed_one(tmp_path):
  import shutil
  w = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)
  runs = {n: write_run(str(tmp_path), f"{n}_seed0", ROWS) for n in ("grpo", "tree_grpo", "patr")}
  _warm_start(runs["grpo"], {"w": w, "b": np.zeros(4, np.float32)})
  # a copy of the step-0 checkpoint, as the report runner shares a seed's warm start
  shutil.copytree(os.path.join(runs["grpo"], "checkpoints"),
                  os.path.join(runs["tree_grpo"], "checkpoints"))
  # recomputed elsewhere: one weight off by one unit in the last place
  w2 = w.copy()
  w2[1, 2] = np.nextafter(w2[1, 2], np.float32(2))
  _warm_start(runs["patr"], {"w": w2, "b": np.zeros(4, np.float32)})
  got = {n: summaries.summarize(d).get("warm_start_digest") for n, d in runs.items()}
  assert len(got["grpo"]) == 16 and got["grpo"] == got["tree_grpo"] != got["patr"]
  bare = write_run(str(tmp_path), "tree_random_seed0", ROWS)   # no checkpoint kept
  assert "warm_start_digest" not in summaries.summarize(bare)


def test_pairing_reads_digests_before_step_0_evals():
  from report_fixtures import summary
  from experiments.reports import claims
  a, b = summary("tree_grpo", 0, 0.5, 0.7), summary("grpo", 0, 0.5, 0.6)
  runs = {"tree_grpo": {0: a}, "grpo": {0: b}}
  assert claims.warm_start_mismatch(runs, "tree_grpo", "grpo", [0]) == []
  a["warm_start_digest"], b["warm_start_digest"] = "0123456789abcdef", "0123456789abcdee"
  assert claims.warm_start_mismatch(runs, "tree_grpo", "grpo", [0]) == [0]   # same evals
  b["warm_start_digest"] = a["warm_start_digest"]
  b["evals"][0]["eval/sampled_success"] = 0.4
  assert claims.warm_start_mismatch(runs, "tree_grpo", "grpo", [0]) == []
  del a["warm_start_digest"]    # one summary without a digest: the step-0 evals decide
  assert claims.warm_start_mismatch(runs, "tree_grpo", "grpo", [0]) == [0]
  b["evals"][0]["eval/sampled_success"] = a["evals"][0]["eval/sampled_success"]
  assert claims.warm_start_mismatch(runs, "tree_grpo", "grpo", [0]) == []
  a["evals"][0]["eval/greedy_mean_turns"], b["evals"][0]["eval/greedy_mean_turns"] = 2.92, 2.95
  assert claims.warm_start_mismatch(runs, "tree_grpo", "grpo", [0]) == [0]  # same success
  b["evals"][0]["eval/greedy_mean_turns"] = None    # not logged by one: not compared
  assert claims.warm_start_mismatch(runs, "tree_grpo", "grpo", [0]) == []


def test_a_loose_pair_is_named_once_per_pair_of_arms():
  from report_fixtures import summary
  from experiments.reports import claim_text, claims
  runs = {m: {s: summary(m, s, 0.5, 0.6 + 0.01 * s + 0.02 * (m == "patr"))
              for s in range(3)} for m in ("patr", "tree_random", "grpo")}
  for s in range(3):     # seed 1's PATR run started from a recomputed warm start
    for m in runs:
      runs[m][s]["warm_start_digest"] = "0123456789abcdef"
  runs["patr"][1]["warm_start_digest"] = "fedcba9876543210"
  claim = next(c for c in claims.claims_for("frozenlake") if c.key == "a")
  text = "\n".join(claim_text.section(claims.assess(runs, claim)))
  # PATR - Tree-Random has two primary rows (the mean over the RL steps, the last eval)
  assert text.count("Seeds [1] of PATR - Tree-Random started from different warm starts") == 1
  assert "of Tree-Random - chain GRPO started" not in text
