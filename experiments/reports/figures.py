"""The reports' plots (bare matplotlib Figures, PNG at dpi 100): held-out sampled success against
the RL step, a panel per success claim, with the rule baselines when known (the figure at the
top of a report); held-out success gain over the warm start against the cumulative spent
budget; mean turns per method. Curves are the mean over seeds at the evaluations every seed
has, shaded min..max over seeds."""

from __future__ import annotations

import os
import textwrap

import numpy as np

from experiments.reports import claims, measures
from experiments.reports.claims import GREEDY, SAMPLED

DPI = 100


def gain_curve(runs: dict, key: str, x: str, gain: bool = True):
  """(x, mean, min, max) over seeds of KEY's gain over the step-0 eval (of KEY itself when
  `gain` is False) at the first n evals, n the fewest any seed logged; x is "step" or "spent"
  (cumulative cost per prompt), averaged over seeds. None if no data."""
  curves = []
  for s in runs.values():
    rows = [r for r in s["evals"] if r.get(key) is not None]
    if rows and rows[0]["step"] == 0:
      curves.append([(r[x], r[key] - rows[0][key] * gain) for r in rows])
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


def _curves(ax, runs: dict, key: str, x: str, gain: bool) -> None:
  for method, rs in runs.items():
    curve = gain_curve(rs, key, x, gain)
    if curve is None:
      continue
    line, = ax.plot(curve[0], curve[1], marker="o", markersize=3,
                    label=f"{measures.label(method)} ({len(rs)} seeds)")
    ax.fill_between(curve[0], curve[2], curve[3], color=line.get_color(), alpha=0.15)


def panels(runs: dict, env: str) -> list[tuple[str, list[str]]]:
  """[(title, methods)]: one panel per claim on held-out success, holding the methods that
  claim compares (those with runs, two at least), in `measures.ordered` order; repeated sets
  once."""
  out, seen = [], set()
  for claim in claims.claims_for(env):
    methods = measures.ordered({m for c in claim.comparisons if SAMPLED in c.measure
                                for m in (c.a, c.b) if m in runs})
    if len(methods) > 1 and tuple(methods) not in seen:
      seen.add(tuple(methods))
      out.append((f"{claim.key}. {claim.title}", methods))
  return out


def success_figure(runs: dict, env: str, title: str, rules: dict | None = None):
  """Held-out sampled success vs RL step, one panel per success claim (`panels`), a line per
  method over the seeds the panel's methods share (the paired seeds; all when none is shared);
  the rule baselines' success on the same maps (`rules`: {rule: success}) dashed."""
  from matplotlib.figure import Figure
  shown = panels(runs, env) or [("", list(runs))]
  cols = min(2, len(shown))
  rows = -(-len(shown) // cols)
  fig = Figure(figsize=(6 * cols, 3.8 * rows))
  axes = np.atleast_1d(fig.subplots(rows, cols)).reshape(-1)
  for ax, (name, methods) in zip(axes, shown):
    common = set.intersection(*(set(runs[m]) for m in methods)) or None
    _curves(ax, {m: {s: r for s, r in runs[m].items() if common is None or s in common}
                 for m in methods}, SAMPLED, "step", gain=False)
    for i, (rule, success) in enumerate(sorted((rules or {}).items())):
      ax.axhline(success, color="grey", linestyle=(0, (2 + 2 * i, 2)), linewidth=0.8,
                 label=f"{rule} rule")
    ax.set_title(textwrap.fill(name, 60), fontsize=9)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out sampled success")
    ax.legend(fontsize=7)
  for ax in axes[len(shown):]:
    ax.set_visible(False)
  fig.suptitle(title + " (mean over seeds, band: min to max)")
  return fig


def gain_figure(runs: dict, title: str):
  """Held-out sampled and greedy success gain over the warm start vs cumulative spent budget."""
  from matplotlib.figure import Figure
  fig = Figure(figsize=(10, 4))
  for ax, key in zip(fig.subplots(1, 2), (SAMPLED, GREEDY)):
    _curves(ax, runs, key, "spent", gain=True)
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_xlabel("spent rollout budget per prompt, cumulative")
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


def write_figures(runs: dict, out_dir: str, env: str, rules: dict | None = None,
                  prefix: str | None = None) -> list[str]:
  """Write the PNGs `PREFIX_success_vs_step.png` (the report's top figure, with the rule
  baselines `rules` when given), `PREFIX_success_vs_budget.png`, `PREFIX_mean_turns.png` into
  out_dir (PREFIX: the env's name unless given); returns their names."""
  name = measures.ENVS.get(env, env)
  prefix = prefix or env
  return [
      _save(success_figure(runs, env, f"{name}: held-out success vs RL step", rules), out_dir,
            f"{prefix}_success_vs_step.png"),
      _save(gain_figure(runs, f"{name}: held-out success gain vs spent budget"),
            out_dir, f"{prefix}_success_vs_budget.png"),
      _save(turns_figure(runs, f"{name}: mean turns per episode (bars: mean; dots: seeds)"),
            out_dir, f"{prefix}_mean_turns.png"),
  ]
