"""What the reports read off one run summary (`summaries.summarize`): warm-start and final eval
values, gains, final training values, trajectories per unit of budget; and the methods' names.

A measure is named by a string: `gain KEY` (last eval minus the step-0 eval, the warm start),
`final KEY` (last eval), `before KEY` (step-0 eval), `train KEY` (last training row having it),
`trajectories_per_budget`. Missing values are NaN. `gain` and `final` can instead be read at a
cumulative spent budget (`value(..., spent=level)`): the eval curve of KEY against the eval rows'
`spent` (cost per prompt since the warm start), linear between the two evals around `level`.
"""

from __future__ import annotations

import collections
import math

import numpy as np

LABELS = {"grpo": "chain GRPO", "tree_grpo": "Tree-GRPO", "tree_random": "Tree-Random",
          "patr": "PATR", "tree_grpo_quarter": "Tree-GRPO, 1/4 budget",
          "tree_grpo_intra": "Tree-GRPO intra-only", "tree_grpo_inter": "Tree-GRPO inter-only",
          "patr_drop_pruned": "PATR drop pruned",
          "patr_best_n": "PATR best n", "dapo": "DAPO", "gigpo": "GiGPO", "arpo": "ARPO"}
ENVS = {"frozenlake": "FrozenLake", "toolcall": "Tool-call QA"}
REFERENCE = "grpo"


def label(method: str) -> str:
  return LABELS.get(method, method)


def ordered(methods) -> list[str]:
  """Methods in the order of LABELS, then the others by name."""
  known = list(LABELS)
  return sorted(methods, key=lambda m: (known.index(m) if m in known else len(known), m))


def group(summaries: list[dict]) -> dict:
  """{method: {seed: summary}}, methods in `ordered` order."""
  runs = collections.defaultdict(dict)
  for s in summaries:
    runs[s["method"]][int(s["seed"])] = s
  return {m: dict(sorted(runs[m].items())) for m in ordered(runs)}


def _num(value) -> float:
  return math.nan if value is None else float(value)


def before(summary: dict, key: str) -> float:
  rows = [r for r in summary["evals"] if r["step"] == 0]
  return _num(rows[0].get(key)) if rows else math.nan


def final(summary: dict, key: str) -> float:
  rows = [r for r in summary["evals"] if r.get(key) is not None]
  return _num(rows[-1][key]) if rows else math.nan


def gain(summary: dict, key: str) -> float:
  return final(summary, key) - before(summary, key)


def _curve(summary: dict, key: str, y: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(cumulative spent, y) at the evals logging KEY; y is KEY unless named."""
  rows = [r for r in summary["evals"] if r.get(key) is not None and r.get("spent") is not None]
  return (np.array([r["spent"] for r in rows], dtype=float),
          np.array([r[y or key] for r in rows], dtype=float))


def spent_at_end(summary: dict, key: str) -> float:
  """The cumulative spent budget at the last eval of `key` (NaN without one)."""
  spent, _ = _curve(summary, key)
  return float(spent[-1]) if spent.size else math.nan


def at_spent(summary: dict, key: str, level: float) -> float:
  """KEY's eval curve read at cumulative spent budget `level` (linear between evals; NaN
  beyond the last eval or before the first)."""
  spent, values = _curve(summary, key)
  if not spent.size or not spent[0] <= level <= spent[-1] * (1 + 1e-9):
    return math.nan
  return float(np.interp(min(level, spent[-1]), spent, values))


def step_at_spent(summary: dict, key: str, level: float) -> float:
  """The RL step (interpolated between evals) at which the run had spent `level`."""
  spent, steps = _curve(summary, key, "step")
  return float(np.interp(level, spent, steps)) if spent.size else math.nan


def last_train(summary: dict, key: str) -> float:
  rows = [r for r in summary["train"] if r.get(key) is not None]
  return _num(rows[-1][key]) if rows else math.nan


def trajectories_per_budget(summary: dict) -> float:
  """Trajectories per prompt per unit of spent budget: sum of rollout/trajectories over the
  steps / (prompts per step x the sum of the cost per prompt), over the steps logging both."""
  cost_key = f"rollout/cost_per_prompt/{summary['budget_unit']}"
  rows = [r for r in summary["train"]
          if r.get("rollout/trajectories") is not None and r.get(cost_key) is not None]
  prompts = summary["config"]["rollout"].get("prompts_per_step")
  cost = sum(r[cost_key] for r in rows)
  if not rows or not prompts or not cost:
    return math.nan
  return sum(r["rollout/trajectories"] for r in rows) / (prompts * cost)


def value(summary: dict, measure: str, spent: float | None = None) -> float:
  """The named measure of one run (module docstring); `gain` and `final` at cumulative spent
  budget `spent` when given."""
  kind, _, key = measure.partition(" ")
  if kind == "trajectories_per_budget":
    return trajectories_per_budget(summary)
  if spent is not None and kind in ("gain", "final"):
    read = at_spent(summary, key, spent)
    return read - before(summary, key) if kind == "gain" else read
  fn = {"gain": gain, "final": final, "before": before, "train": last_train}[kind]
  return fn(summary, key)


def mean_sd(values) -> tuple[float, float]:
  """Mean and sample sd (ddof=1; NaN for one value) of the finite values."""
  x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
  if x.size == 0:
    return math.nan, math.nan
  return float(x.mean()), (float(x.std(ddof=1)) if x.size > 1 else math.nan)


def groups(runs: dict, prefix: str = "eval/sampled_success/") -> list[str]:
  """The eval groups (e.g. `side_3`) any run logs under `prefix`, sorted."""
  found = {k[len(prefix):] for rs in runs.values() for s in rs.values() for r in s["evals"]
           for k in r if k.startswith(prefix)}
  return sorted(found, key=lambda g: (len(g), g))
