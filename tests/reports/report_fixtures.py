"""Hand-made run directories and run summaries for the report tests."""

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAIN = {"method": "chain", "group_size": 4, "max_turns": 10, "max_tokens_per_turn": 16,
         "prompts_per_step": 2, "budget_unit": "generated"}


def write_run(root, name, rows, rollout=None, env="frozenlake", finished=True):
  """A run directory as `experiments.train` leaves it: config.json, metrics.jsonl, summary.json."""
  d = os.path.join(root, name)
  os.makedirs(d)
  config = {"env": {"name": env, "max_calls": 4, "eval_maps": "x" * 300},
            "rollout": dict(rollout or CHAIN), "learner": {"advantage": "grpo"},
            "warmstart": {"steps": 300}, "train": {"eval_every": 2},
            "model": {"preset": "tiny", "hf_path": ""}, "sampler": {"num_pages": 8192}}
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(config, f)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  if finished:
    with open(os.path.join(d, "summary.json"), "w") as f:
      json.dump({"step": rows[-1]["step"], "stopped_early": False}, f)
  return d


def summary(method, seed, before, after, spent=100.0, trajectories=8, turns=3.0, tokens=40.0,
            env="frozenlake", sides=True, tool_calls=None, steps=4):
  """A summary as `summaries.summarize` writes it: a step-0 and a last eval (sampled and greedy
  success `before` / `after`), `steps` training rows spending `spent` per prompt each."""
  def evals(step, success, turns_now):
    row = {"step": step, "spent": spent * step, "eval/sampled_success": success,
           "eval/greedy_success": success, "eval/sampled_mean_turns": turns_now,
           "eval/sampled_tokens_per_episode": tokens}
    if sides:
      row["eval/sampled_success/side_2"] = min(1.0, success + 0.1)
    if tool_calls is not None:
      row["eval/sampled_tool_calls"] = tool_calls
    return row
  train = [{"step": s, "rollout/success_rate": 0.5, "rollout/trajectories": trajectories,
            "rollout/cost_per_prompt/generated": spent, "learner/entropy": 1.25}
           for s in range(1, steps + 1)]
  return {"method": method, "seed": seed, "env": env, "steps": steps, "budget_unit": "generated",
          "planned_budget": 2 * spent, "spent_budget": spent, "stopped_early": False,
          "config": {"rollout": {"prompts_per_step": 2}},
          "evals": [evals(0, before, 3.0), evals(steps, after, turns)], "train": train}


def write_summaries(directory, summaries):
  os.makedirs(directory, exist_ok=True)
  for s in summaries:
    with open(os.path.join(directory, f"{s['method']}_seed{s['seed']}.json"), "w") as f:
      json.dump(s, f)
