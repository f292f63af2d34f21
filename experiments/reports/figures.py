"""The reports' plots (bare matplotlib Figures, PNG at dpi 100): held-out success gain over the
warm start against the RL step and against the cumulative spent budget, and mean turns per
method. Curves are the mean over seeds at the evaluations every seed has, shaded min..max."""

from __future__ import annotations

import os

import numpy as np

from experiments.reports import measures
from experiments.reports.claims import GREEDY, SAMPLED

DPI = 100


def gain_curve(runs: dict, key: str, x: str):
  """(x, mean gain, min, max) over seeds at the first n evals, n the fewest any seed logged;
  x is "step" or "spent" (cumulative cost per prompt), averaged over seeds. None if no data."""
  curves = []
  for s in runs.values():
    rows = [r for r in s["evals"] if r.get(key) is not None]
    if rows and rows[0]["step"] == 0:
      curves.append([(r[x], r[key] - rows[0][key]) for r in rows])
  if not curves:
    return None
  n = min(len(c) for c in curves)
  xs = np.array([[p[0] for p in c[:n]] for c in curves], dtype=float)
  ys = np.array([[p[1] for p in c[:n]] for c in curves], dtype=float)
  return xs.mean(0), ys.mean(0), ys.min(0), ys.max(0)


def _save(fig, out_dir: str, name: str) -> str:
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, name), dpi=DPI)
  return name


def success_figure(runs: dict, x: str, title: str):
  from matplotlib.figure import Figure
  fig = Figure(figsize=(10, 4))
  axes = fig.subplots(1, 2)
  for ax, key in zip(axes, (SAMPLED, GREEDY)):
    for method, rs in runs.items():
      curve = gain_curve(rs, key, x)
      if curve is None:
        continue
      line, = ax.plot(curve[0], curve[1], marker="o",
                      label=f"{measures.label(method)} ({len(rs)} seeds)")
      ax.fill_between(curve[0], curve[2], curve[3], color=line.get_color(), alpha=0.15)
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_xlabel("RL step" if x == "step" else "spent rollout budget per prompt, cumulative")
    ax.set_ylabel(f"{key.split('/')[1]} minus the warm start's")
    ax.legend(fontsize=7)
  fig.suptitle(title)
  return fig


def turns_figure(runs: dict, title: str):
  from matplotlib.figure import Figure
  fig = Figure(figsize=(max(4, 1 + 0.8 * len(runs)), 3.5))
  ax = fig.subplots()
  key = "final eval/sampled_mean_turns"
  for i, rs in enumerate(runs.values()):
    values = [v for v in (measures.value(s, key) for s in rs.values()) if np.isfinite(v)]
    if values:
      ax.bar(i, np.mean(values), color="C0", alpha=0.5)
      ax.plot([i] * len(values), values, "k.", markersize=5)
  ax.set_xticks(range(len(runs)), [measures.label(m) for m in runs], rotation=30, ha="right",
                fontsize=8)
  ax.set_ylabel("turns per episode (sampled), last eval")
  ax.set_title(title, fontsize=10)
  return fig


def write_figures(runs: dict, out_dir: str, env: str) -> list[str]:
  """Write the PNGs `ENV_success_vs_step.png`, `ENV_success_vs_budget.png`, `ENV_mean_turns.png`
  into out_dir; returns their names."""
  name = measures.ENVS.get(env, env)
  return [
      _save(success_figure(runs, "step", f"{name}: held-out success gain vs RL step"), out_dir,
            f"{env}_success_vs_step.png"),
      _save(success_figure(runs, "spent", f"{name}: held-out success gain vs spent budget"),
            out_dir, f"{env}_success_vs_budget.png"),
      _save(turns_figure(runs, f"{name}: mean turns per episode (bars: mean; dots: seeds)"),
            out_dir, f"{env}_mean_turns.png"),
  ]
