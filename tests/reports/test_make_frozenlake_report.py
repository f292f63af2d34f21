"""The report builder reads run logs into budget curves and checks the claims on them."""

import json
import os

from experiments.reports import make_frozenlake_report as report


def _write_run(root, name, prompts, steps, evals, rollout=None, spent=()):
  d = os.path.join(root, name)
  os.makedirs(d)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({"rollout": {"prompts_per_step": prompts, **(rollout or {})}}, f)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 0, **{k: v for k, v in evals[0].items()}}) + "\n")
    for s, (gen, pre) in enumerate(steps, 1):
      row = {"step": s, "rollout/budget/generated": gen, "rollout/budget/prefilled": pre,
             "rollout/success_rate": 0.1 * s, **evals.get(s, {})}
      if spent:
        row["rollout/cost_per_prompt/generated"] = spent[s - 1]
      f.write(json.dumps(row) + "\n")
  with open(os.path.join(d, "summary.json"), "w") as f:
    json.dump({}, f)


def _evals(before, after):
  return {0: {"eval/greedy_success": before, "eval/sampled_success": before},
          2: {"eval/greedy_success": after, "eval/sampled_success": after}}


def test_budget_is_cumulative_tokens_per_prompt(tmp_path):
  _write_run(str(tmp_path), "grpo_seed0", 4, [(40, 360), (40, 160)], _evals(0.1, 0.3))
  run = report.load_run(os.path.join(str(tmp_path), "grpo_seed0"))
  # step 1: (40 + 360) / 4 = 100 per prompt; step 2: 100 + (40 + 160) / 4 = 150
  assert run["evals"]["eval/greedy_success"] == [(0.0, 0.1), (150.0, 0.3)]
  assert run["budget_per_step"] == 75.0 and run["steps"] == 2


def test_claims_compare_means_at_equal_budget(tmp_path):
  root = str(tmp_path)
  for seed, (b, a) in enumerate([(0.1, 0.5), (0.1, 0.3)]):   # PATR: mean 0.4 at 200 tokens
    _write_run(root, f"patr_seed{seed}", 1, [(50, 50), (50, 50)], _evals(b, a))
  _write_run(root, "tree_random_seed0", 1, [(100, 100), (100, 100)], _evals(0.1, 0.5))  # 0.3 at 200
  _write_run(root, "grpo_seed0", 1, [(100, 100), (100, 100)], _evals(0.1, 0.3))        # 0.2 at 200
  _write_run(root, "tree_grpo_seed0", 1, [(10, 40), (10, 40)], _evals(0.1, 0.4))       # 0.4 at 100
  runs = report.load_sweep(root)
  assert sorted(runs) == ["grpo", "patr", "tree_grpo", "tree_random"] and len(runs["patr"]) == 2
  lines = report.claims(runs, "eval/greedy_success")
  # gains over each seed's warm start (0.1), on the seeds all three share (seed 0): PATR's seed-0
  # run gains 0.4 at 200 tokens, Tree-Random 0.2, GRPO 0.1
  assert "seeds [0]" in lines[0] and "**holds**" in lines[0]
  assert "PATR 0.400, Tree-Random 0.200, GRPO 0.100" in lines[0]
  # a quarter of GRPO's 400 tokens = 100, where Tree-GRPO gained 0.3 >= GRPO's final gain 0.2
  assert "+0.300 vs +0.200" in lines[1] and "**holds**" in lines[1]


def test_table_shows_planned_and_spent_cost_side_by_side(tmp_path):
  root = str(tmp_path)
  base = {"max_turns": 10, "max_tokens_per_turn": 16, "budget_unit": "generated"}
  _write_run(root, "grpo_seed0", 1, [(40, 60), (40, 60)], _evals(0.1, 0.3),
             rollout={**base, "method": "chain", "group_size": 4}, spent=(300.0, 340.0))
  _write_run(root, "patr_seed0", 1, [(40, 60), (40, 60)], _evals(0.1, 0.3),
             rollout={**base, "method": "patr", "initial_branches": 4, "expand_children": 2,
                      "score_every": 5, "expand_top_k": 2, "max_branches": 8}, spent=(200.0, 260.0))
  lines = report.table(report.load_sweep(root))
  assert "planned / prompt / step | spent / prompt / step" in lines[0]
  # chain: 4 chains x 160 tokens; PATR: 4 branches + 2 expansions at turn 5 of 10 = 5 x 160
  assert "| 640 generated | 320 generated |" in lines[2]
  assert "| 800 generated | 230 generated |" in lines[3]
