"""Markdown of assessed claims (`claims.assess`): the verdict table at the top of a report, one
line per claim, and a section per claim with each comparison's effect, 95% Student-t interval,
bootstrap interval, MDE, seeds and verdict."""

from __future__ import annotations

import math

from experiments.reports import measures, stats

_SCALE = {"points": 100.0, "%": 100.0}
_DIGITS = {"points": 1, "%": 1}


def amount(value: float, unit: str, sign: bool = True) -> str:
  if not math.isfinite(value):
    return "–"
  v = value * _SCALE.get(unit, 1.0)
  text = f"{v:+.{_DIGITS.get(unit, 2)}f}" if sign else f"{v:.{_DIGITS.get(unit, 2)}f}"
  return f"{text}{unit}" if unit in ("%", "x") else f"{text} {unit}"


def _subject(c) -> str:
  a, b = measures.label(c.a), measures.label(c.b)
  return {"diff": f"{a} - {b}", "relative": f"({a} - {b}) / {b}", "ratio": f"{a} / {b}"}[c.form]


def _claimed(c) -> str:
  """The claimed side of the effect, e.g. `> 0.0 points` or `> -5.0 points`."""
  direction, b = stats.bound(c.kind, c.margin, c.at)
  return f"{direction} " + amount(b, c.unit, sign=bool(b) and c.form != "ratio")


def _measure(c) -> str:
  kind, _, key = c.measure.partition(" ")
  text = {"gain": f"gain in {key}", "mean_gain": f"mean gain in {key} over the RL steps",
          "final": f"last {key}", "before": f"warm-start {key}",
          "train": f"last training {key}"}.get(kind, kind.replace("_", " "))
  if kind == "gain":
    text += " at matched spent budget" if c.matched else " at the last eval"
  return text + ("" if c.primary else " (secondary)")


def _interval(r: dict, low: str, high: str) -> str:
  c = r["comparison"]
  sign = c.form != "ratio"
  return f"[{amount(r[low], c.unit, sign)}, {amount(r[high], c.unit, sign)}]"


def _row(r: dict) -> str:
  c = r["comparison"]
  verdict = r["verdict"]
  if r["n"] == 0:
    why = (f"no summaries of {', '.join(r['missing'])}" if r["missing"]
           else r.get("note", ""))
    verdict = f"{verdict}: {why}"
    cells = ["0", "–", "–", "–", "–", "–"]
  else:
    cells = [str(r["n"]), str(r["seeds"]), amount(r["mean"], c.unit, c.form != "ratio"),
             _interval(r, "low", "high"), _interval(r, "boot_low", "boot_high"),
             amount(r["mde"], c.unit, sign=False)]
    if r.get("note"):
      verdict = f"{verdict}: {r['note']}"
  verdict = f"**{verdict}**" if c.primary else f"({verdict})"
  return f"| {_subject(c)} | {_measure(c)} | {_claimed(c)} | " + " | ".join(cells) + f" | {verdict} |"


def budget_note(assessed: dict) -> str:
  checks = assessed["budget"]
  if not checks:
    return ""
  parts = [f"{measures.label(m)} {r:.2f} (meant {e:g}{'' if ok else ', **off by more than 10%**'})"
           for m, r, e, ok in checks]
  return ("Spent budget per prompt per step relative to chain GRPO's: " + ", ".join(parts)
          + ". The primary rows compare equal RL steps at the planned budget, as the papers "
            "do; the matched-spend row reads equal cumulative spent budgets.")


def matched_note(assessed: dict) -> str:
  """Where the matched comparisons read their runs (mean RL steps over seeds)."""
  reads = [f"{measures.label(r['comparison'].a)} reaches it at step {r['read_at'][0]:.0f} "
           f"(read at its eval of step {r['read_at'][1]:.0f}), {measures.label(r['comparison'].b)} "
           f"at step {r['read_at'][2]:.0f} (eval {r['read_at'][3]:.0f})"
           for r in assessed["results"] if r["comparison"].matched and r.get("read_at")]
  return ("Matched spent budget (the smaller of the two runs' totals; mean over seeds): "
          + "; ".join(reads) + ".") if reads else ""


def overview_line(assessed: dict) -> str:
  claim = assessed["claim"]
  off = [measures.label(m) for m, _, _, ok in assessed["budget"] if not ok]
  flag = f" (budget premise not met: {', '.join(off)})" if off else ""
  return f"- {claim.key}. {claim.title}: **{assessed['verdict']}**{flag}"


def section(assessed: dict) -> list[str]:
  claim = assessed["claim"]
  lines = [f"### {claim.key}. {claim.title}: **{assessed['verdict']}**", ""]
  if claim.paper:
    lines += [claim.paper, ""]
  if budget_note(assessed):
    lines += [budget_note(assessed), ""]
  lines += ["| comparison | measure | claimed | n | seeds | effect (mean) | 95% t-interval "
            "| bootstrap 95% (under-covers) | MDE | verdict |",
            "|---|---|---|---:|---|---:|---:|---:|---:|---|",
            *[_row(r) for r in assessed["results"]]]
  if matched_note(assessed):
    lines += ["", matched_note(assessed)]
  mismatched = {_subject(r["comparison"]): r["mismatch"] for r in assessed["results"]
                if r.get("mismatch") and r["comparison"].primary}   # one line per pair of arms
  for subject, seeds in mismatched.items():
    lines.append(f"\nSeeds {seeds} of {subject} started from different warm starts (step-0 "
                 "parameters, or step-0 evals where a summary has no digest): their pairing "
                 "is loose.")
  return lines + [""]


def _effect_cell(r: dict) -> str:
  """`mean [low, high] unit`, e.g. `-1.1 [-3.8, +1.6] points`."""
  c = r["comparison"]
  if r["n"] == 0:
    return "–"
  parts = [amount(r[k], c.unit, c.form != "ratio").removesuffix(f" {c.unit}")
           for k in ("mean", "low", "high")]
  return f"{parts[0]} [{parts[1]}, {parts[2]}]" + ("" if c.unit in ("%", "x") else f" {c.unit}")


def verdict_table(assessed: list[dict]) -> list[str]:
  """One row per claim's primary comparison: the effect, its 95% t-interval, its MDE at n
  seeds (and projected to `stats.PLANNED_SEEDS`), the comparison's verdict, and the claim's
  verdict on the claim's first row."""
  lines = ["| claim | verdict | comparison | measure | claimed | effect [95% t-interval] | "
           f"MDE (n seeds; projected to {stats.PLANNED_SEEDS}) | comparison's verdict |",
           "|---|---|---|---|---|---|---|---|"]
  for a in assessed:
    first = f"{a['claim'].key}. {a['claim'].title}", f"**{a['verdict']}**"
    for r in (r for r in a["results"] if r["comparison"].primary):
      c = r["comparison"]
      mde = "–" if r["n"] == 0 else f"{amount(r['mde'], c.unit, sign=False)} ({r['n']})"
      if r["n"] and r["n"] != stats.PLANNED_SEEDS:
        mde += f"; {amount(r['mde_planned'], c.unit, sign=False)} ({stats.PLANNED_SEEDS})"
      lines.append(f"| {first[0]} | {first[1]} | {_subject(c)} | {_measure(c)} | {_claimed(c)} | "
                   f"{_effect_cell(r)} | {mde} | {r['verdict']} |")
      first = "", ""
  return lines


VERDICT_RULES = (
    f"How verdicts are read. Each comparison is a per-seed paired effect (the methods of a seed "
    f"share its warm start); its 95% interval is Student's t on those effects, mean -+ "
    f"t_(0.975, n-1) x sd / sqrt(n). A claim `> b` (or `< b`, `>= b`) **{stats.HOLDS}** when "
    f"every effect in the interval satisfies it and **{stats.FAILS}** when none does; otherwise, "
    f"or with fewer than {stats.MIN_SEEDS} seeds, it is **{stats.UNSURE}**. Non-inferiority "
    f"claims (`> -5.0 points`) follow the same rule against their margin: [-5.4, -1.9] is "
    f"inconclusive. A claim holds when all its primary comparisons hold and does not hold when "
    f"one does not. Primary success readings are at equal RL steps, as the papers compare: the "
    f"held-out sampled success gained over the warm start, averaged over the RL steps (the area "
    f"under the gain curve) and at the last eval; greedy success and the reading at matched "
    f"cumulative spent budget are secondary (in parentheses). MDE: the smallest true effect a "
    f"two-sided 5% t-test finds with 80% power at this many seeds, (t_(0.975, n-1) + "
    f"t_(0.80, n-1)) x sd / sqrt(n): {stats.mde_multiplier(3):.2f} x sd / sqrt(3), "
    f"{stats.mde_multiplier(5):.2f} x sd / sqrt(5); with fewer than {stats.PLANNED_SEEDS} "
    f"seeds the verdict table also projects it to {stats.PLANNED_SEEDS} at the sd they show. "
    f"The percentile bootstrap interval over seeds is shown beside for reference only: with "
    f"normal data it covers the mean about 75% of the time at 3 seeds and 85% at 5.")
