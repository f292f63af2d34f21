"""Does a FrozenLake testbed run meet the learning bar? Read from its committed summary.

    python -m experiments.rule_baselines --config=configs/frozenlake.py:algo=chain,testbed > rules.jsonl
    python -m experiments.reports.testbed_bar --summaries experiments/reports/frozenlake_runs --method grpo \
        --rules experiments/reports/frozenlake_runs/rules.jsonl

The bar, per run, on the held-out maps:
- the warm start (the step-0 evaluation) reads the state: its greedy success beats the hint rule
  overall, and it is imperfect (below 1);
- chain GRPO raises sampled success by at least `--min_gain` (0.10) over the warm start. The
  gain is the mean of the last `--last` (3) evaluations minus step 0's, not the best evaluation:
  a maximum over ten evaluations of 400 episodes each is biased up by their noise (about 2
  points each);
- at the end (the same last evaluations' mean) sampled success is at or above every rule
  baseline (hint, random, local view: `RULES`) on every map side. A policy that ends below the
  rule that reads only the local view has not learned what the testbed asks for.
`rules` is `experiments.rule_baselines`' JSON lines on the same maps (its `expert` row, the
oracle, is not a baseline). Prints one JSON line per run and a table; exits 1 when some run
misses the bar.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from experiments.reports.summaries import load_summaries

GREEDY, SAMPLED = "eval/greedy_success", "eval/sampled_success"
RULES = ("hint", "random", "local")   # the rule baselines the bar compares against
RULE_LABELS = {"hint": "hint", "random": "random", "local": "local view"}


def load_rules(path: str) -> dict:
  """{rule: {metric suffix ('' or '/side_k'): success}} from rule_baselines' JSON lines."""
  out = {}
  with open(path) as f:
    for line in f:
      line = line.strip()
      if line.startswith("{"):
        row = json.loads(line)
        out[row["rule"]] = {k[len("success"):]: v for k, v in row.items() if k.startswith("success")}
  missing = [r for r in RULES if r not in out]
  if missing:
    raise ValueError(f"{path} has no row for rule(s) {missing}; run experiments.rule_baselines")
  return out


def check(summary: dict, rules: dict, min_gain: float = 0.10, last: int = 3) -> dict:
  """The bar's parts for one run summary (see the module docstring)."""
  evals = sorted(summary["evals"], key=lambda r: r["step"])
  if not evals or evals[0]["step"] != 0 or len(evals) < last + 1:
    raise ValueError(f"{summary['method']} seed {summary['seed']}: needs the step-0 evaluation and "
                     f"{last} more, has steps {[r['step'] for r in evals]}")
  start, tail = evals[0], evals[-last:]
  sides = sorted(k[len(SAMPLED):] for k in start if k.startswith(SAMPLED + "/side_"))
  end = {s: float(np.mean([r[SAMPLED + s] for r in tail])) for s in [""] + sides}
  by_side = {s[1:]: {r: rules[r][s] for r in RULES} for s in sides}
  row = dict(method=summary["method"], seed=summary["seed"], steps=summary["steps"],
             warm_greedy=start[GREEDY], hint=rules["hint"][""],
             warm_sampled=start[SAMPLED], end_sampled=end[""],
             best_rule=max(rules[r][""] for r in RULES),
             gain=end[""] - start[SAMPLED],
             best_gain=max(r[SAMPLED] for r in evals[1:]) - start[SAMPLED],
             end_by_side={s[1:]: end[s] for s in sides}, rules_by_side=by_side)
  row["reads_state"] = bool(rules["hint"][""] < start[GREEDY] < 1.0)
  row["learns"] = bool(row["gain"] >= min_gain)
  row["reaches_rules"] = bool(all(end["/" + s] >= max(r.values()) for s, r in by_side.items()))
  row["meets_bar"] = row["reads_state"] and row["learns"] and row["reaches_rules"]
  return row


def table(rows: list[dict]) -> list[str]:
  sides = sorted({s for r in rows for s in r["end_by_side"]}, key=lambda s: (len(s), s))
  lines = ["| method | seed | warm greedy (hint rule) | sampled: warm -> end (best rule) | "
           f"gain (best) | end sampled {' / '.join(sides)} ({' / '.join(RULES)} rules) | bar |",
           "|---|---:|---|---|---|---|---|"]
  for r in rows:
    by_side = " / ".join(
        f"{r['end_by_side'][s]:.3f} ({' / '.join(f'{v:.3f}' for v in r['rules_by_side'][s].values())})"
        for s in sides)
    lines.append(f"| {r['method']} | {r['seed']} | {r['warm_greedy']:.3f} ({r['hint']:.3f}) | "
                 f"{r['warm_sampled']:.3f} -> {r['end_sampled']:.3f} ({r['best_rule']:.3f}) | "
                 f"{r['gain']:+.3f} ({r['best_gain']:+.3f}) | {by_side} | "
                 f"{'met' if r['meets_bar'] else 'not met'} |")
  return lines


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--summaries", required=True, help="a directory of run summaries (METHOD_seedS.json)")
  ap.add_argument("--rules", required=True, help="experiments.rule_baselines' output on the same maps")
  ap.add_argument("--method", default="", help="only this method's runs")
  ap.add_argument("--min_gain", type=float, default=0.10)
  ap.add_argument("--last", type=int, default=3)
  args = ap.parse_args(argv)
  rules = load_rules(args.rules)
  runs = [s for s in load_summaries(args.summaries) if not args.method or s["method"] == args.method]
  if not runs:
    raise SystemExit(f"no summaries{' of ' + args.method if args.method else ''} in {args.summaries}")
  rows = [check(s, rules, args.min_gain, args.last) for s in runs]
  for r in rows:
    print(json.dumps(r))
  print("\n".join(table(rows)))
  return 0 if all(r["meets_bar"] for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
