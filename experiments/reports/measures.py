"""What the reports read off one run summary (`summaries.summarize`): warm-start and final eval
values, gains, the mean gain over the RL steps, final training values, trajectories per unit of
budget; and the methods' names (an algorithm's label from `tree_rl.algorithms`).

A measure is named by a string: `gain KEY` (last eval minus the step-0 eval, the warm start),
`mean_gain KEY` (the mean over the RL steps of KEY's gain curve: its area divided by the steps,
linear between evals), `final KEY` (last eval), `before KEY` (step-0 eval), `train KEY` (last
training row having it), `trajectories_per_budget`. Missing values are NaN.
Eval readings are taken at equal steps (`value(..., until=step)`: the last eval at or before
`step`, the curve up to it), or at a cumulative spent budget (`value(..., spent=level)`): the
run reaches `level` at the first RL step whose cumulative cost per prompt (summed over the
training rows, one per step) gets there (`step_at_spent`), and is read at its last eval at or
before that step; no value is interpolated.
"""

from __future__ import annotations

import collections
import math

import numpy as np

from tree_rl import algorithms

# the report sweeps' arms that vary an algorithm (`experiments/sweeps/report.py`)
VARIANTS = {"tree_grpo_quarter": "Tree-GRPO, 1/4 budget",
            "tree_grpo_intra": "Tree-GRPO intra-only", "tree_grpo_inter": "Tree-GRPO inter-only",
            "patr_drop_pruned": "PATR drop pruned", "patr_best_n": "PATR best n"}
ENVS = {"frozenlake": "FrozenLake", "toolcall": "Tool-call QA"}
REFERENCE = "grpo"


def label(method: str) -> str:
  return VARIANTS.get(method) or algorithms.label(method)


def ordered(methods) -> list[str]:
  """The algorithms in `algorithms.display_order()`, then the variants, then the others by
  name."""
  known = algorithms.display_order() + list(VARIANTS)
  return sorted(methods, key=lambda m: (known.index(m) if m in known else len(known), m))


def group(summaries: list[dict]) -> dict:
  """{method: {seed: summary}}, methods in `ordered` order."""
  runs = collections.defaultdict(dict)
  for s in summaries:
    runs[s["method"]][int(s["seed"])] = s
  return {m: dict(sorted(runs[m].items())) for m in ordered(runs)}


def _num(value) -> float:
  return math.nan if value is None else float(value)


def _evals(summary: dict, key: str, until: float | None = None) -> list[dict]:
  """The eval rows logging KEY, up to step `until` when given."""
  return [r for r in summary["evals"] if r.get(key) is not None
          and (until is None or r["step"] <= until)]


def before(summary: dict, key: str) -> float:
  rows = [r for r in summary["evals"] if r["step"] == 0]
  return _num(rows[0].get(key)) if rows else math.nan


def final(summary: dict, key: str, until: float | None = None) -> float:
  rows = _evals(summary, key, until)
  return _num(rows[-1][key]) if rows else math.nan


def gain(summary: dict, key: str, until: float | None = None) -> float:
  return final(summary, key, until) - before(summary, key)


def last_eval_step(summary: dict, key: str, until: float | None = None) -> float:
  """The step of the last eval of KEY (at or before `until` when given); NaN without one."""
  rows = _evals(summary, key, until)
  return float(rows[-1]["step"]) if rows else math.nan


def mean_gain(summary: dict, key: str, until: float | None = None) -> float:
  """The mean over RL steps 0..T of KEY's gain over the warm start, the curve linear between
  evals (trapezoids); T is the last eval at or before `until`. NaN without a step-0 eval and
  a later one."""
  rows = _evals(summary, key, until)
  if len(rows) < 2 or rows[0]["step"] != 0:
    return math.nan
  steps = np.array([r["step"] for r in rows], dtype=float)
  values = np.array([r[key] for r in rows], dtype=float) - rows[0][key]
  area = np.sum((values[1:] + values[:-1]) / 2 * np.diff(steps))
  return float(area / steps[-1])


def cost_key(summary: dict) -> str:
  return f"rollout/cost_per_prompt/{summary['budget_unit']}"


def spent_at_end(summary: dict, key: str) -> float:
  """The cumulative spent budget at the last eval of `key` (NaN without one)."""
  rows = [r for r in _evals(summary, key) if r.get("spent") is not None]
  return float(rows[-1]["spent"]) if rows else math.nan


def step_at_spent(summary: dict, level: float) -> float:
  """The first RL step at which the run's cumulative spent budget (the per-step costs of its
  training rows, summed) reaches `level` (to 1e-4 relative: summaries keep 6 digits); NaN if
  it never does."""
  rows = [r for r in summary["train"] if r.get(cost_key(summary)) is not None]
  spent = np.cumsum([r[cost_key(summary)] for r in rows])
  reached = np.nonzero(spent >= level * (1 - 1e-4))[0]
  return float(rows[reached[0]]["step"]) if reached.size else math.nan


def last_train(summary: dict, key: str) -> float:
  rows = [r for r in summary["train"] if r.get(key) is not None]
  return _num(rows[-1][key]) if rows else math.nan


def trajectories_per_budget(summary: dict) -> float:
  """Trajectories per prompt per unit of spent budget: sum of rollout/trajectories over the
  steps / (prompts per step x the sum of the cost per prompt), over the steps logging both."""
  key = cost_key(summary)
  rows = [r for r in summary["train"]
          if r.get("rollout/trajectories") is not None and r.get(key) is not None]
  prompts = summary["config"]["rollout"].get("prompts_per_step")
  cost = sum(r[key] for r in rows)
  if not rows or not prompts or not cost:
    return math.nan
  return sum(r["rollout/trajectories"] for r in rows) / (prompts * cost)


def value(summary: dict, measure: str, until: float | None = None,
          spent: float | None = None) -> float:
  """The named measure of one run (module docstring). Eval measures are read at step `until`
  when given, or where the run reaches cumulative spent budget `spent` (`step_at_spent`)."""
  kind, _, key = measure.partition(" ")
  if kind == "trajectories_per_budget":
    return trajectories_per_budget(summary)
  if kind == "before":
    return before(summary, key)
  if kind == "train":
    return last_train(summary, key)
  if spent is not None:
    until = step_at_spent(summary, spent)
    if not math.isfinite(until):
      return math.nan
  fn = {"gain": gain, "final": final, "mean_gain": mean_gain}[kind]
  return fn(summary, key, until)


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
