"""Per-run summaries: the small JSON files the reports are built from (committed, so a report can
be rebuilt and audited without the runs' checkpoints).

    python -m experiments.reports.summaries --runs runs/sweeps/frozenlake_methods \
        --out experiments/reports/frozenlake_runs

A finished run directory `ENTRY_seedS` (its `summary.json` not stopped early) holding
`config.json` and `metrics.jsonl` becomes `METHOD_seedS.json` (METHOD = `--prefix` + ENTRY,
or `--rename ENTRY=METHOD`) with:
- method, seed, env (`config.env.name`), steps (the last logged step), stopped_early;
- config: the env, rollout, learner, warmstart and train sections and model.preset (long
  values left out);
- budget_unit (`config.rollout.budget_unit`); planned_budget: the planned rollout cost per
  prompt per step (`tree_rl.rollout.budget.planned_cost`; null when the config cannot tell, e.g.
  the computed unit); spent_budget: `rollout/cost_per_prompt` in that unit, mean over steps;
- evals: one row per evaluation (step 0 is the warm start) with `step`, `spent` (the cost per
  prompt summed over the steps up to it; 0 at step 0) and every `eval/*` metric of that row;
- train: one row per RL step with `step`, rollout/success_rate, rollout/mean_turns,
  rollout/trajectories, rollout/cost_per_prompt/<unit>, learner/entropy and
  rollout/response_tokens_per_trajectory (rollout/budget/generated / rollout/trajectories);
- wall_s: the sum of time/step_s over the steps, when logged;
- warm_start_digest: a fingerprint of the step-0 params (the warm start) recomputed from the
  run's step-0 checkpoint, when it has one: runs of one seed are paired only when theirs agree (a
  warm start recomputed on another machine can differ in its last bits, and its step-0 evals can
  still agree).
Floats keep 6 significant digits; non-finite values are null. Rows logged twice for one step
(a resumed run) are merged, the later values winning.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import types

from tree_rl.metrics import read_jsonl

SECTIONS = ("env", "rollout", "learner", "warmstart", "train")
TRAIN_KEYS = ("rollout/success_rate", "rollout/mean_turns", "rollout/trajectories",
              "learner/entropy")
RESPONSE = "rollout/response_tokens_per_trajectory"
MAX_VALUE_CHARS = 200
_RUN = re.compile(r"^(?P<entry>.+)_seed(?P<seed>\d+)$")


def _num(value) -> float | None:
  """A logged value as a finite float, or None (the log writes non-finite values as strings)."""
  if isinstance(value, bool) or value is None:
    return None
  try:
    value = float(value)
  except (TypeError, ValueError):
    return None
  return value if math.isfinite(value) else None


def rounded(value):
  """6 significant digits for floats, None for non-finite ones; ints and others unchanged."""
  if isinstance(value, float):
    return float(f"{value:.6g}") if math.isfinite(value) else None
  if isinstance(value, dict):
    return {k: rounded(v) for k, v in value.items()}
  if isinstance(value, list):
    return [rounded(v) for v in value]
  return value


def compact_config(config: dict) -> dict:
  """The config sections a report needs, without values longer than MAX_VALUE_CHARS as JSON."""
  out = {}
  for name in SECTIONS:
    section = config.get(name, {})
    out[name] = {k: v for k, v in section.items() if len(json.dumps(v)) <= MAX_VALUE_CHARS}
  out["model"] = {"preset": config.get("model", {}).get("preset")}
  return out


def planned_budget(config: dict) -> float | None:
  """Planned rollout cost per prompt per step in `rollout.budget_unit`, or None when the logged
  config lacks the fields or the unit needs the engine's capacities (computed)."""
  from tree_rl.rollout.budget import planned_cost
  rollout, env = config.get("rollout", {}), config.get("env", {})
  unit = rollout.get("budget_unit", "generated")
  caps = {}
  if unit == "tool_calls" and "max_calls" in env:
    from tree_rl import envs
    try:
      fields = envs.entry(env.get("name", "")).config_fields
    except KeyError:
      fields = ()
    if "max_calls" in fields:
      caps["max_calls"] = int(env["max_calls"])
  try:
    cost = planned_cost(types.SimpleNamespace(**rollout), unit, **caps)
  except (AttributeError, KeyError, TypeError, ValueError):
    return None
  return None if cost is None else float(cost)


def _merged_rows(path: str) -> list[dict]:
  by_step = {}
  for row in read_jsonl(path):
    by_step.setdefault(int(row["step"]), {}).update(row)
  return [by_step[s] for s in sorted(by_step)]


def _train_row(row: dict, cost_key: str) -> dict:
  out = {"step": int(row["step"])}
  for key in (*TRAIN_KEYS, cost_key):
    if _num(row.get(key)) is not None:
      out[key] = _num(row[key])
  generated, n = _num(row.get("rollout/budget/generated")), _num(row.get("rollout/trajectories"))
  if generated is not None and n:
    out[RESPONSE] = generated / n
  return out


def summarize(run_dir: str, method: str | None = None, seed: int | None = None) -> dict:
  """The summary of one run directory (fields in the module docstring); method and seed default
  from the directory name `ENTRY_seedS`."""
  name = _RUN.match(os.path.basename(os.path.normpath(run_dir)))
  if (method is None or seed is None) and not name:
    raise ValueError(f"{run_dir}: name is not ENTRY_seedS; pass method and seed")
  method = name["entry"] if method is None else method
  seed = int(name["seed"]) if seed is None else int(seed)
  with open(os.path.join(run_dir, "config.json")) as f:
    config = json.load(f)
  end = {}
  if os.path.exists(os.path.join(run_dir, "summary.json")):
    with open(os.path.join(run_dir, "summary.json")) as f:
      end = json.load(f)
  unit = config.get("rollout", {}).get("budget_unit", "generated")
  cost_key = f"rollout/cost_per_prompt/{unit}"
  rows = _merged_rows(os.path.join(run_dir, "metrics.jsonl"))
  spent, evals, train, wall = 0.0, [], [], []
  for row in rows:
    step = int(row["step"])
    cost = _num(row.get(cost_key, row.get("rollout/cost_per_prompt")))
    if step >= 1:
      train.append(_train_row(row, cost_key))
      if cost is not None:
        train[-1][cost_key] = cost
        spent += cost
      if _num(row.get("time/step_s")) is not None:
        wall.append(_num(row["time/step_s"]))
    metrics = {k: _num(v) for k, v in row.items() if k.startswith("eval/")}
    if metrics:
      evals.append({"step": step, "spent": spent, **metrics})
  costs = [r[cost_key] for r in train if cost_key in r]
  out = {"method": method, "seed": seed, "env": config.get("env", {}).get("name"),
         "steps": int(rows[-1]["step"]) if rows else 0,
         "stopped_early": end.get("stopped_early"),
         "budget_unit": unit, "planned_budget": planned_budget(config),
         "spent_budget": sum(costs) / len(costs) if costs else None,
         "config": compact_config(config), "evals": evals, "train": train}
  if wall:
    out["wall_s"] = sum(wall)
  digest = warm_start_digest(run_dir)
  if digest:
    out["warm_start_digest"] = digest
  return rounded(out)


def warm_start_digest(run_dir: str) -> str | None:
  """16 hex digits of a hash of the step-0 checkpoint's params, each array's digest
  (`tree_rl.digest`) recomputed from the saved values; None when the run kept no step 0."""
  path = os.path.join(run_dir, "checkpoints")
  if not os.path.isdir(os.path.join(path, "0")):
    return None
  from tree_rl.checkpointing import Checkpointer
  from tree_rl.digest import tree_digest
  ckpt = Checkpointer(path)
  try:
    params = ckpt.read(0)[0]["train"]["params"]
  finally:
    ckpt.close()
  text = json.dumps(sorted(tree_digest(params).items()))
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def finished(run_dir: str, num_steps: int | None = None) -> bool:
  """Whether the run in `run_dir` ran all its steps: its summary.json does not say it stopped
  early (a run stopped by a signal writes one too, and resumes when started again) and, given
  `num_steps`, its last step reached it (a finished run whose config now plans more resumes)."""
  path = os.path.join(run_dir, "summary.json")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    end = json.load(f)
  if end.get("stopped_early", False):
    return False
  return num_steps is None or end.get("step", 0) >= num_steps


def summary_steps(path: str) -> int:
  """The steps of the summary file at `path` (as `summarize` wrote it); 0 where there is none."""
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    return json.load(f).get("steps", 0)


def finished_runs(root: str) -> list[str]:
  """The run directories `ENTRY_seedS` under `root` that finished (`finished`), sorted."""
  return [os.path.join(root, n) for n in sorted(os.listdir(root))
          if _RUN.match(n) and finished(os.path.join(root, n))]


def write_summaries(root: str, out: str, prefix: str = "", rename: dict | None = None) -> list[str]:
  """Summarize every finished run under `root` into `out`; returns the files written. A summary
  already in `out` of more steps (a run extended elsewhere) is kept, with a line saying so."""
  os.makedirs(out, exist_ok=True)
  written = []
  for run_dir in finished_runs(root):
    entry = _RUN.match(os.path.basename(run_dir))["entry"]
    method = (rename or {}).get(entry, prefix + entry)
    summary = summarize(run_dir, method=method)
    path = os.path.join(out, f"{method}_seed{summary['seed']}.json")
    kept = summary_steps(path)
    if kept > summary["steps"]:
      print(f"{path}: kept ({kept} steps; {run_dir} ran {summary['steps']})")
      continue
    with open(path, "w") as f:
      json.dump(summary, f, indent=1, allow_nan=False)
      f.write("\n")
    written.append(path)
  return written


def load_summaries(directory: str) -> list[dict]:
  """Every `*.json` summary in `directory` (sorted by file name)."""
  out = []
  for name in sorted(os.listdir(directory)):
    if name.endswith(".json"):
      with open(os.path.join(directory, name)) as f:
        out.append(json.load(f))
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--runs", required=True, help="a sweep's directory of ENTRY_seedS runs")
  ap.add_argument("--out", default="experiments/reports/frozenlake_runs")
  ap.add_argument("--prefix", default="", help="method name = PREFIX + entry")
  ap.add_argument("--rename", action="append", default=[], metavar="ENTRY=METHOD",
                  help="method name of one entry (repeatable; takes precedence over --prefix)")
  args = ap.parse_args(argv)
  rename = dict(r.split("=", 1) for r in args.rename)
  written = write_summaries(args.runs, args.out, args.prefix, rename)
  if not written:
    raise SystemExit(f"no finished runs (ENTRY_seedS whose summary.json did not stop early) under {args.runs}")
  print(f"{len(written)} summaries in {args.out}")


if __name__ == "__main__":
  main()
