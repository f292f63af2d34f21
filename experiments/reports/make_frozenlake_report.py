"""Build `experiments/reports/frozenlake.md` and its plots from the runs of a methods sweep.

    python launch/sweep.py frozenlake_methods                  # the runs (runs/sweeps/frozenlake_methods)
    python -m experiments.reports.make_frozenlake_report       # this report from their logs

Each run directory `METHOD_seedS` holds `config.json`, `metrics.jsonl` and `summary.json`. The
rollout budget of a step is the tokens its rollout computed per prompt (generated + prefilled);
the x axis of the budget plots is that budget summed over the steps so far (the warm start is
not counted). Curves are the mean over seeds, shaded by min..max; the paper's claims are checked
on those means by linear interpolation at equal budget. The table also shows each method's
planned rollout cost per prompt (from its config, `tree_rl.rollout.budget.planned_cost`) beside
the cost it spent (`rollout/cost_per_prompt/<unit>`, mean over steps), in the run's
`rollout.budget_unit`; the report also reads a `budget_curve` sweep (runs `METHOD_bK_seedS`).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re

import numpy as np

from tree_rl.metrics import read_jsonl

LABELS = {"grpo": "chain GRPO", "tree_grpo": "Tree-GRPO", "tree_random": "Tree-Random",
          "patr": "PATR", "tree_grpo_intra": "Tree-GRPO intra-only"}
EVALS = ("eval/greedy_success", "eval/sampled_success")
_RUN = re.compile(r"^(?P<method>.+)_seed(?P<seed>\d+)$")


def load_run(directory: str, seed: int = 0) -> dict:
  """Per-step budget, the eval curves against cumulative budget, and the summary of one run."""
  with open(os.path.join(directory, "config.json")) as f:
    config = json.load(f)
  prompts = int(config["rollout"]["prompts_per_step"])
  rows = read_jsonl(os.path.join(directory, "metrics.jsonl"))
  spent, step_budget = {0: 0.0}, {}
  for r in sorted((r for r in rows if "rollout/budget/generated" in r), key=lambda r: r["step"]):
    step_budget[r["step"]] = (r["rollout/budget/generated"] + r["rollout/budget/prefilled"]) / prompts
    spent[r["step"]] = spent[max(spent)] + step_budget[r["step"]]
  evals = {k: [(spent[r["step"]], r[k]) for r in rows if k in r and r["step"] in spent] for k in EVALS}
  train = [(r["step"], r["rollout/success_rate"]) for r in rows if "rollout/success_rate" in r]
  unit = config["rollout"].get("budget_unit", "generated")
  per_prompt = [r[f"rollout/cost_per_prompt/{unit}"] for r in rows
                if f"rollout/cost_per_prompt/{unit}" in r]
  return dict(evals=evals, train=train, budget_per_step=float(np.mean(list(step_budget.values()))),
              steps=max(spent), seed=seed, unit=unit, planned=planned(config, unit),
              spent=float(np.mean(per_prompt)) if per_prompt else float("nan"))


def planned(config: dict, unit: str) -> float:
  """The run's planned rollout cost per prompt (`tree_rl.rollout.budget.planned_cost`); NaN when
  the logged config lacks the fields (or the unit needs the engine's capacities)."""
  import types
  from tree_rl.rollout.budget import planned_cost
  r = config["rollout"]
  caps = {"max_calls": config["env"]["max_calls"]} if "max_calls" in config.get("env", {}) else {}
  try:
    cost = planned_cost(types.SimpleNamespace(**r), unit, **caps)
  except (AttributeError, KeyError, ValueError):
    return float("nan")
  return float("nan") if cost is None else float(cost)


def load_sweep(root: str) -> dict:
  """{method: [run, ...]} for every finished run (one with a summary.json) under `root`."""
  runs = collections.defaultdict(list)
  for name in sorted(os.listdir(root)):
    m = _RUN.match(name)
    if m and os.path.exists(os.path.join(root, name, "summary.json")):
      runs[m["method"]].append(load_run(os.path.join(root, name), int(m["seed"])))
  return dict(runs)


def mean_curve(runs: list, key: str, gain: bool = False):
  """(budget, mean, low, high) at each eval point shared by all seeds; `gain`: each run's value
  minus its own warm-start (step 0) value, so seeds with different warm starts compare fairly."""
  n = min(len(r["evals"][key]) for r in runs)
  xs = np.array([[p[0] for p in r["evals"][key][:n]] for r in runs])
  ys = np.array([[p[1] for p in r["evals"][key][:n]] for r in runs])
  if gain:
    ys = ys - ys[:, :1]
  return xs.mean(0), ys.mean(0), ys.min(0), ys.max(0)


def at_budget(curve, budget: float) -> float:
  x, y = curve[0], curve[1]
  return float(np.interp(budget, x, y)) if x[0] <= budget <= x[-1] else float("nan")


def plot(runs: dict, out_dir: str) -> list[str]:
  from matplotlib.figure import Figure
  files = []
  for key in EVALS:
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for method, rs in runs.items():
      x, y, lo, hi = mean_curve(rs, key, gain=True)
      ax.plot(x, y, marker="o", label=f"{LABELS.get(method, method)} ({len(rs)} seeds)")
      ax.fill_between(x, lo, hi, alpha=0.15)
    ax.set_xlabel("rollout tokens computed per prompt (generated + prefilled), cumulative")
    ax.set_ylabel(f"{key} minus the warm start's")
    ax.set_title(f"FrozenLake: {key.split('/')[1]} gain vs rollout budget")
    ax.legend(fontsize=8)
    fig.tight_layout()
    name = f"frozenlake_{key.split('/')[1]}_gain_vs_budget.png"
    fig.savefig(os.path.join(out_dir, name), dpi=100)
    files.append(name)
  fig = Figure(figsize=(6, 4))
  ax = fig.subplots()
  for method, rs in runs.items():
    n = min(len(r["train"]) for r in rs)
    y = np.array([[p[1] for p in r["train"][:n]] for r in rs]).mean(0)
    ax.plot([p[0] for p in rs[0]["train"][:n]], y, label=LABELS.get(method, method))
  ax.set_xlabel("RL step")
  ax.set_ylabel("rollout success rate (mean over seeds)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "frozenlake_train_success.png"), dpi=100)
  return files + ["frozenlake_train_success.png"]


def _paired(runs: dict, methods: tuple, key: str):
  """Gain curves of `methods` over the seeds they all have (paired by warm start), and those seeds."""
  seeds = sorted(set.intersection(*({r["seed"] for r in runs[m]} for m in methods)))
  if not seeds:
    return None, seeds
  return {m: mean_curve([r for r in runs[m] if r["seed"] in seeds], key, gain=True)
          for m in methods}, seeds


def claims(runs: dict, key: str) -> list[str]:
  """The papers' claims checked on the measured gains over each seed's warm start, averaged over
  the seeds every compared method has, at equal cumulative budget (linear interpolation)."""
  out = []
  trio = ("patr", "tree_random", "grpo")
  curves, seeds = _paired(runs, trio, key) if set(trio) <= set(runs) else (None, [])
  if curves:
    b = min(c[0][-1] for c in curves.values())
    v = {m: at_budget(curves[m], b) for m in trio}
    holds = v["patr"] > v["tree_random"] > v["grpo"]
    out.append(f"- PATR > Tree-Random > GRPO at equal budget ({b:,.0f} tokens per prompt; gain over "
               f"the warm start, seeds {seeds}): "
               f"PATR {v['patr']:.3f}, Tree-Random {v['tree_random']:.3f}, GRPO {v['grpo']:.3f} -> "
               f"**{'holds' if holds else 'does not hold'}** (PATR - GRPO = "
               f"{100 * (v['patr'] - v['grpo']):+.1f} points; the PATR paper reports +9.3).")
  curves, seeds = _paired(runs, ("tree_grpo", "grpo"), key) if {"tree_grpo", "grpo"} <= set(runs) \
      else (None, [])
  if curves:
    full = curves["grpo"][0][-1]
    tree_q, chain_full = at_budget(curves["tree_grpo"], full / 4), curves["grpo"][1][-1]
    holds = tree_q >= chain_full
    out.append(f"- Tree-GRPO at a quarter of the budget ({full / 4:,.0f}) >= chain GRPO at full "
               f"budget ({full:,.0f}) (gain over the warm start, seeds {seeds}): {tree_q:+.3f} vs "
               f"{chain_full:+.3f} -> **{'holds' if holds else 'does not hold'}**.")
  if "tree_grpo_intra" in runs:
    spread = [float(np.std([p[1] for p in r["evals"][key]])) for r in runs["tree_grpo_intra"]]
    both = [float(np.std([p[1] for p in r["evals"][key]])) for r in runs.get("tree_grpo", [])]
    out.append(f"- Intra-only advantages with N=2: eval std over a run {np.mean(spread):.3f} vs "
               f"{np.mean(both) if both else float('nan'):.3f} for intra+inter.")
  return out


def table(runs: dict) -> list[str]:
  lines = ["| method | seeds | steps | tokens / prompt / step | planned / prompt / step | "
           "spent / prompt / step | greedy before | greedy after | "
           "greedy gain | sampled before | sampled after | sampled gain |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for method, rs in runs.items():
    cells = []
    for key in EVALS:
      before = [r["evals"][key][0][1] for r in rs]
      after = [r["evals"][key][-1][1] for r in rs]
      gain = np.subtract(after, before)
      cells += [f"{np.mean(before):.3f} ± {np.std(before):.3f}", f"{np.mean(after):.3f} ± {np.std(after):.3f}",
                f"{np.mean(gain):+.3f} ± {np.std(gain):.3f}"]
    lines.append(f"| {LABELS.get(method, method)} | {sorted(r['seed'] for r in rs)} | {rs[0]['steps']} | "
                 f"{np.mean([r['budget_per_step'] for r in rs]):,.0f} | "
                 f"{np.mean([r['planned'] for r in rs]):,.0f} {rs[0]['unit']} | "
                 f"{np.mean([r['spent'] for r in rs]):,.0f} {rs[0]['unit']} | " + " | ".join(cells) + " |")
  return lines


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--root", default="runs/sweeps/frozenlake_methods")
  ap.add_argument("--out_dir", default="experiments/reports")
  ap.add_argument("--notes", default="experiments/reports/frozenlake_notes.md",
                  help="hand-written setup and conclusions appended to the report")
  args = ap.parse_args(argv)
  runs = load_sweep(args.root)
  if not runs:
    raise SystemExit(f"no finished runs under {args.root}")
  runs = {m: runs[m] for m in sorted(runs, key=lambda m: list(LABELS).index(m) if m in LABELS else 99)}
  os.makedirs(args.out_dir, exist_ok=True)
  files = plot(runs, args.out_dir)
  text = ["# FrozenLake reproduction report", "",
          f"Generated by `python -m experiments.reports.make_frozenlake_report` from the runs under "
          f"`{args.root}` (`python launch/sweep.py frozenlake_methods`). Mean ± std over seeds; "
          "`before` is the warm-start policy, `after` the last evaluation.", "", *table(runs), ""]
  for key in EVALS:
    text += [f"## Claims on {key}", "", *claims(runs, key), ""]
  text += ["## Plots", "", *[f"![{f}]({f})" for f in files], ""]
  if os.path.exists(args.notes):
    with open(args.notes) as f:
      text += [f.read()]
  path = os.path.join(args.out_dir, "frozenlake.md")
  with open(path, "w") as f:
    f.write("\n".join(text))
  print("\n".join(table(runs)))
  print(json.dumps({m: [r["evals"]["eval/greedy_success"][-1][1] for r in rs] for m, rs in runs.items()}))


if __name__ == "__main__":
  main()
