"""Markdown of assessed claims (`claims.assess`): one line per claim for the overview, and a
section per claim with each comparison's effect, 95% interval, MDE, seeds and verdict."""

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
  """The claimed side of the effect, e.g. `> 0` or `> -5.0 points`."""
  bound = {"greater": ("> ", c.at), "less": ("< ", c.at), "not_less": ("> ", c.at - c.margin),
           "not_greater": ("< ", c.at + c.margin), "at_least": (">= ", c.at)}[c.kind]
  return bound[0] + amount(bound[1], c.unit, sign=bool(bound[1]) and c.form != "ratio")


def _measure(c) -> str:
  kind, _, key = c.measure.partition(" ")
  text = {"gain": f"gain in {key}", "final": f"last {key}", "before": f"warm-start {key}",
          "train": f"last training {key}"}.get(kind, kind.replace("_", " "))
  if kind == "gain":
    text += " at matched spent budget" if c.matched else " at the last eval"
  return text + ("" if c.primary else " (secondary)")


def _row(r: dict) -> str:
  c = r["comparison"]
  verdict = r["verdict"]
  if r["n"] == 0:
    why = (f"no summaries of {', '.join(r['missing'])}" if r["missing"]
           else r.get("note", ""))
    verdict = f"{verdict}: {why}"
    cells = ["0", "–", "–", "–", "–"]
  else:
    low, high = amount(r["low"], c.unit, c.form != "ratio"), amount(r["high"], c.unit, c.form != "ratio")
    cells = [str(r["n"]), str(r["seeds"]), amount(r["mean"], c.unit, c.form != "ratio"), f"[{low}, {high}]",
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
  text = "Spent budget per prompt per step relative to chain GRPO's: " + ", ".join(parts) + "."
  if _all_matched(assessed):
    text += (" The primary rows read each seed's runs at one cumulative spent budget (the "
             "smaller total, in chain GRPO's units), so they compare equal spent budgets.")
  return text


def _all_matched(assessed: dict) -> bool:
  return all(r["comparison"].matched for r in assessed["results"] if r["comparison"].primary)


def matched_note(assessed: dict) -> str:
  """Where the primary matched comparisons read their runs (mean RL step over seeds)."""
  reads = [f"{measures.label(r['comparison'].a)} at step {r['read_at'][0]:.0f} and "
           f"{measures.label(r['comparison'].b)} at step {r['read_at'][1]:.0f}"
           for r in assessed["results"]
           if r["comparison"].primary and r["comparison"].matched and r.get("read_at")]
  return ("Read at matched spent budget (mean over seeds): " + "; ".join(reads) + ".") if reads else ""


def overview_line(assessed: dict) -> str:
  claim = assessed["claim"]
  off = [measures.label(m) for m, _, _, ok in assessed["budget"] if not ok]
  flag = (f" (budget premise not met: {', '.join(off)})"
          if off and not _all_matched(assessed) else "")
  return f"- {claim.key}. {claim.title}: **{assessed['verdict']}**{flag}"


def section(assessed: dict) -> list[str]:
  claim = assessed["claim"]
  lines = [f"### {claim.key}. {claim.title}: **{assessed['verdict']}**", ""]
  if claim.paper:
    lines += [claim.paper, ""]
  if budget_note(assessed):
    lines += [budget_note(assessed), ""]
  lines += ["| comparison | measure | claimed | n | seeds | effect (mean) | 95% CI | MDE | verdict |",
            "|---|---|---|---:|---|---:|---:|---:|---|", *[_row(r) for r in assessed["results"]]]
  if matched_note(assessed):
    lines += ["", matched_note(assessed)]
  mismatched = [(r, r["mismatch"]) for r in assessed["results"] if r.get("mismatch")]
  for r, seeds in mismatched:
    if r["comparison"].primary:
      lines.append(f"\nSeeds {seeds} of {_subject(r['comparison'])} started from different "
                   "warm starts (step-0 parameters, or step-0 evals where a summary has no "
                   "digest): their pairing is loose.")
  return lines + [""]


VERDICT_RULES = (
    f"Verdicts come from the 95% percentile bootstrap interval of the mean per-seed paired effect "
    f"(seeds resampled with replacement, 10,000 draws, generator seed 0): `> x` **{stats.HOLDS}** "
    f"when the whole interval is above x and **{stats.FAILS}** when it lies at or below x (`< x` "
    f"mirrors it); the non-inferiority forms (`> -margin`, `< +margin`) hold when the interval "
    f"clears the margin and do not hold when it lies wholly on the wrong side of 0; anything "
    f"else (and fewer than {stats.MIN_SEEDS} seeds: with 2 the interval is the range of two "
    f"values, which contains the true median effect half the time) is **{stats.UNSURE}**. A "
    f"claim holds when all its primary comparisons hold. MDE: the smallest true effect a "
    f"two-sided test at 5% finds with 80% power at this many seeds, (1.96 + 0.84) x sd / "
    f"sqrt(n). With 3 seeds the bootstrap interval is exactly "
    f"the range of the per-seed effects (it under-covers; a `> 0` claim holds only when every "
    f"seed agrees): read it with the MDE.")
