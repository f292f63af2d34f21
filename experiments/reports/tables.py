"""The reports' per-method tables (markdown rows): budget, held-out success, final behaviour.
Cells are the mean ± sample sd over a method's seeds."""

from __future__ import annotations

import math

import numpy as np

from experiments.reports import measures
from experiments.reports.claims import GREEDY, SAMPLED, TOLERANCE, expected_ratio


def cell(values, digits: int = 3, sign: bool = False) -> str:
  mean, sd = measures.mean_sd(values)
  if not math.isfinite(mean):
    return "–"
  text = f"{mean:+.{digits}f}" if sign else f"{mean:,.{digits}f}"
  return text if not math.isfinite(sd) else f"{text} ± {sd:.{digits}f}"


def _mean(values) -> float:
  return measures.mean_sd(values)[0]


def _ratio(value: float, ref: float, expected: float) -> str:
  if not (math.isfinite(value) and math.isfinite(ref) and ref):
    return "–"
  r = value / ref
  flag = "" if abs(r / expected - 1) <= TOLERANCE else f" (**not within 10% of {expected:g}**)"
  return f"{r:.2f}{flag}"


def _header(names) -> list[str]:
  return ["| " + " | ".join(names) + " |", "|---|" + "---:|" * (len(names) - 1)]


def _trajectories(s: dict) -> float:
  prompts = s["config"]["rollout"].get("prompts_per_step")
  n = [r["rollout/trajectories"] for r in s["train"] if r.get("rollout/trajectories") is not None]
  return float(np.mean(n)) / prompts if n and prompts else math.nan


def budget_table(runs: dict) -> list[str]:
  """Seeds, steps, planned and spent rollout cost per prompt per step and their ratios to chain
  GRPO's (flagged when more than 10% off what the method is meant to spend), trajectories."""
  ref = runs.get(measures.REFERENCE, {}).values()
  ref_planned = _mean([s["planned_budget"] for s in ref])
  ref_spent = _mean([s["spent_budget"] for s in ref])
  lines = _header(["method", "seeds", "steps", "unit", "planned / prompt / step",
                   "spent / prompt / step", "planned / GRPO's", "spent / GRPO's",
                   "trajectories / prompt / step"])
  for method, rs in runs.items():
    s = list(rs.values())
    planned, spent = _mean([r["planned_budget"] for r in s]), _mean([r["spent_budget"] for r in s])
    units = sorted({r["budget_unit"] for r in s})
    lines.append(f"| {measures.label(method)} | {list(rs)} | {max(r['steps'] for r in s)} | "
                 f"{', '.join(units)} | {cell([r['planned_budget'] for r in s], 0)} | "
                 f"{cell([r['spent_budget'] for r in s], 0)} | "
                 f"{_ratio(planned, ref_planned, expected_ratio(method))} | "
                 f"{_ratio(spent, ref_spent, expected_ratio(method))} | "
                 f"{cell([_trajectories(r) for r in s], 1)} |")
  return lines


def success_table(runs: dict) -> list[str]:
  """Held-out greedy and sampled success of the warm start (before), the last eval (after) and
  each seed's gain."""
  lines = _header(["method", "greedy before", "greedy after", "greedy gain", "sampled before",
                   "sampled after", "sampled gain"])
  for method, rs in runs.items():
    cells = []
    for key in (GREEDY, SAMPLED):
      cells += [cell([measures.before(s, key) for s in rs.values()]),
                cell([measures.final(s, key) for s in rs.values()]),
                cell([measures.gain(s, key) for s in rs.values()], sign=True)]
    lines.append(f"| {measures.label(method)} | " + " | ".join(cells) + " |")
  return lines


def _digits(measure: str) -> int:
  return 1 if "tokens" in measure else 3 if "success" in measure or "entropy" in measure else 2


def behaviour_table(runs: dict) -> list[str]:
  """At the last eval: sampled success per group (when logged), sampled turns, tokens and tool
  calls per episode (when logged); the last training step's policy entropy."""
  sides = measures.groups(runs)
  calls = any(r.get("eval/sampled_tool_calls") is not None
              for rs in runs.values() for s in rs.values() for r in s["evals"])
  keys = ([f"final {SAMPLED}/{g}" for g in sides] + ["final eval/sampled_mean_turns",
          "final eval/sampled_tokens_per_episode"] + (["final eval/sampled_tool_calls"] if calls
          else []) + ["train learner/entropy"])
  names = ([f"sampled {g}" for g in sides] + ["turns / episode", "tokens / episode"]
           + (["tool calls / episode"] if calls else []) + ["train entropy"])
  lines = _header(["method", *names])
  for method, rs in runs.items():
    cells = [cell([measures.value(s, k) for s in rs.values()], _digits(k)) for k in keys]
    lines.append(f"| {measures.label(method)} | " + " | ".join(cells) + " |")
  return lines
