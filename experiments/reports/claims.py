"""The papers' claims as paired comparisons over seeds, and their verdicts.

A `Comparison` measures A against B on each seed both ran (one warm start per seed, shared by
every method: the pairing) as a difference A - B, a relative difference (A - B) / B, or a ratio
A / B of one measure (`measures.value`), then gives the mean, the 95% Student-t interval over
seeds (the percentile bootstrap beside it), the minimal detectable effect and a verdict
(`stats`). A `Claim` holds if all of its primary comparisons hold, does not hold if any does not
hold, is "not run yet" while a compared method has no summary, and is inconclusive otherwise
(`stats.combine`); secondary comparisons are shown without counting. `budget` names the methods
whose spent budget per prompt per step the claim takes as a given multiple of chain GRPO's; a
ratio off by more than 10% is reported beside the verdict.

The papers fix the per-step rollout budget and compare methods at equal training steps, and so
do the primary success readings (`on_success`): held-out sampled success gained over the warm
start, averaged over the RL steps (the area under the gain curve: it uses every eval, so its
paired sd is a fraction of one eval's) and at the last eval, both runs read up to the same step.
Greedy success and a reading at matched cumulative spent budget are secondary: the latter reads
each seed's two runs where each has spent the smaller of their two totals (in chain GRPO's
units, a `*_quarter` run's spending counted four times), the step found from the per-step
costs and the run read at its last eval by then (`measures.step_at_spent`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from experiments.reports import measures, stats

SAMPLED, GREEDY = "eval/sampled_success", "eval/greedy_success"
TOLERANCE = 0.10


@dataclasses.dataclass(frozen=True)
class Comparison:
  a: str
  b: str
  measure: str
  kind: str
  form: str = "diff"        # diff: A - B; relative: (A - B) / B; ratio: A / B
  margin: float = 0.05
  at: float = 0.0
  unit: str = "points"      # how the effect prints: points and % (x100), x (a ratio), turns, calls
  primary: bool = True
  optional: bool = False    # left out of the verdict while its methods have not run
  matched: bool = False     # read both runs at one cumulative spent budget (module docstring)


@dataclasses.dataclass(frozen=True)
class Claim:
  key: str
  title: str
  comparisons: tuple
  paper: str = ""
  budget: tuple = ()        # ((method, expected spent / chain GRPO's spent), ...)


def on_success(a: str, b: str, kind: str = "greater", **kw) -> tuple:
  """The comparisons on held-out success (module docstring): sampled success's mean gain over
  the RL steps and its gain at the last eval (primary); greedy success's mean gain and sampled
  success's gain at matched spent budget (secondary)."""
  return (Comparison(a, b, f"mean_gain {SAMPLED}", kind, **kw),
          Comparison(a, b, f"gain {SAMPLED}", kind, **kw),
          Comparison(a, b, f"mean_gain {GREEDY}", kind, primary=False, **kw),
          Comparison(a, b, f"gain {SAMPLED}", kind, primary=False, matched=True, **kw))


def expected_ratio(method: str) -> float:
  """The spent budget a method is meant to have relative to chain GRPO's."""
  return 0.25 if method.endswith("_quarter") else 1.0


def matched_level(a: dict, b: dict, c: Comparison) -> float:
  """The cumulative spent budget, in chain GRPO's units, at which one seed's runs `a` and `b`
  of comparison `c` are both read: the smaller of their totals (NaN when either lacks one)."""
  key = c.measure.partition(" ")[2]
  totals = (measures.spent_at_end(a, key) / expected_ratio(c.a),
            measures.spent_at_end(b, key) / expected_ratio(c.b))
  return min(totals) if all(math.isfinite(t) for t in totals) else math.nan


def _effect(x: float, y: float, form: str) -> float:
  if form == "diff":
    return x - y
  if not y:
    return math.nan
  return (x - y) / y if form == "relative" else x / y


def _read_pair(a: dict, b: dict, c: Comparison) -> tuple[float, float, tuple]:
  """One seed's two readings of `c`, and for a matched comparison where they were taken:
  (A's step reaching the level, A's eval step read, the same for B)."""
  key = c.measure.partition(" ")[2]
  if c.matched:
    level = matched_level(a, b, c)
    spent = [level * expected_ratio(m) for m in (c.a, c.b)]
    steps = [measures.step_at_spent(run, s) for run, s in zip((a, b), spent)]
    reads = [measures.last_eval_step(run, key, t) for run, t in zip((a, b), steps)]
    return (measures.value(a, c.measure, spent=spent[0]),
            measures.value(b, c.measure, spent=spent[1]), (steps[0], reads[0], steps[1], reads[1]))
  if c.measure.partition(" ")[0] in ("gain", "final", "mean_gain"):
    until = min(measures.last_eval_step(a, key), measures.last_eval_step(b, key))
    return measures.value(a, c.measure, until), measures.value(b, c.measure, until), ()
  return measures.value(a, c.measure), measures.value(b, c.measure), ()


def _pairs(runs: dict, c: Comparison) -> list[tuple]:
  """[(seed, effect, where read)] over the seeds both ran, finite effects only."""
  a, b = runs[c.a], runs[c.b]
  out = []
  for s in sorted(set(a) & set(b)):
    x, y, where = _read_pair(a[s], b[s], c)
    effect = _effect(x, y, c.form)
    if math.isfinite(effect):
      out.append((s, effect, where))
  return out


def warm_start_mismatch(runs: dict, a: str, b: str, seeds) -> list:
  """Seeds whose two runs did not start from one warm start: different step-0 param digests
  where both summaries carry one (`summaries.warm_start_digest`), else a step-0 eval metric
  both logged with different finite values (turns and tokens too: two warm starts can agree on
  success alone)."""
  def differ(x: dict, y: dict) -> bool:
    if x.get("warm_start_digest") and y.get("warm_start_digest"):
      return x["warm_start_digest"] != y["warm_start_digest"]
    rx, ry = (next((r for r in s["evals"] if r["step"] == 0), {}) for s in (x, y))
    finite = lambda v: isinstance(v, (int, float)) and math.isfinite(v)  # noqa: E731
    return any(rx[k] != ry[k] for k in rx.keys() & ry.keys()
               if k.startswith("eval/") and finite(rx[k]) and finite(ry[k]))
  return [s for s in seeds if differ(runs[a][s], runs[b][s])]


def evaluate(runs: dict, c: Comparison) -> dict:
  """mean, low, high (Student-t), boot_low, boot_high (bootstrap), mde (at n seeds and,
  `mde_planned`, at `stats.PLANNED_SEEDS`), n, seeds, verdict (and
  `missing` methods, `mismatch` seeds, `read_at` for a matched comparison)."""
  missing = [m for m in (c.a, c.b) if m not in runs]
  if missing:
    return dict(comparison=c, missing=missing, verdict=stats.NOT_RUN, n=0, seeds=[])
  pairs = _pairs(runs, c)
  if not pairs:
    return dict(comparison=c, missing=[], verdict=stats.NOT_RUN, n=0, seeds=[],
                note="no seed in common")
  seeds, values, where = (list(col) for col in zip(*pairs))
  mean, low, high = stats.t_interval(values)
  _, boot_low, boot_high = stats.paired_bootstrap(values)
  few = len(seeds) < stats.MIN_SEEDS
  return dict(comparison=c, missing=[], seeds=seeds, n=len(seeds), mean=mean, low=low,
              high=high, boot_low=boot_low, boot_high=boot_high,
              mde=stats.min_detectable_effect(values), values=values,
              mde_planned=stats.min_detectable_effect(values, seeds=stats.PLANNED_SEEDS),
              verdict=stats.UNSURE if few else stats.verdict(low, high, c.kind, c.margin, c.at),
              note=f"{len(seeds)} seed{'s' * (len(seeds) > 1)}, a verdict needs "
                   f"{stats.MIN_SEEDS}" if few else "",
              mismatch=warm_start_mismatch(runs, c.a, c.b, seeds),
              read_at=tuple(float(v) for v in np.mean(where, axis=0)) if c.matched else None)


def budget_check(runs: dict, claim: Claim) -> list:
  """[(method, measured spent / chain GRPO's, expected, within 10%)] over the seeds both ran."""
  ref = runs.get(measures.REFERENCE, {})
  out = []
  for method, expected in claim.budget:
    seeds = sorted(set(runs.get(method, {})) & set(ref))
    ratios = [runs[method][s]["spent_budget"] / ref[s]["spent_budget"] for s in seeds
              if runs[method][s].get("spent_budget") and ref[s].get("spent_budget")]
    if ratios:
      r = sum(ratios) / len(ratios)
      out.append((method, r, expected, abs(r / expected - 1) <= TOLERANCE))
  return out


def assess(runs: dict, claim: Claim) -> dict:
  """The claim's comparisons evaluated, its verdict and its budget check."""
  results = [evaluate(runs, c) for c in claim.comparisons]
  counted = [r["verdict"] for r in results if r["comparison"].primary
             and not (r["comparison"].optional and r["verdict"] == stats.NOT_RUN)]
  return dict(claim=claim, results=results, verdict=stats.combine(counted),
              budget=budget_check(runs, claim))


PATR_PAPER = "PATR paper: +9.3 points PATR over GRPO (66.5% -> 75.8%)."

FROZENLAKE = (
    Claim("a", "PATR > Tree-Random > GRPO at equal budget",
          (*on_success("patr", "tree_random"), *on_success("tree_random", "grpo")),
          paper=PATR_PAPER, budget=(("patr", 1.0), ("tree_random", 1.0))),
    Claim("b", "Tree-GRPO at a quarter of the budget >= chain GRPO at full budget",
          on_success("tree_grpo_quarter", "grpo", "not_less"),
          paper="Tree-GRPO paper: a tree at a quarter of the rollout budget matches or beats "
                "chain GRPO.", budget=(("tree_grpo_quarter", 0.25),)),
    Claim("b2", "Tree-GRPO gets 1.5x the trajectories per unit of budget",
          (Comparison("tree_grpo", "grpo", "trajectories_per_budget", "at_least", form="ratio",
                      at=1.35, unit="x"),),
          paper="Tree-GRPO paper: about 1.5x the trajectories of chain sampling at one budget "
                "(holds if the ratio's interval lies at or above 1.35, 10% under 1.5)."),
    Claim("c", "Intra-only advantages collapse at N=2; inter-only helps; both best",
          (*on_success("tree_grpo", "tree_grpo_intra"), *on_success("tree_grpo", "tree_grpo_inter"),
           *on_success("tree_grpo_inter", "tree_grpo_intra")),
          paper="Tree-GRPO paper: intra-tree advantages alone are unstable with N=2."),
    Claim("d", "Tree methods change turn counts (Tree-GRPO longer, PATR shorter); PATR "
               "trajectories are not longer",
          (Comparison("tree_grpo", "grpo", "final eval/sampled_mean_turns", "greater",
                      unit="turns"),
           Comparison("patr", "grpo", "final eval/sampled_mean_turns", "less", unit="turns"),
           Comparison("patr", "grpo", "final eval/sampled_tokens_per_episode", "not_greater",
                      form="relative", unit="%")),
          paper="Tokens per episode are compared relative to chain GRPO's, with a 5% margin."),
    Claim("e", "PATR's default group (keep pruned branches) > the other group arms",
          (*on_success("patr", "patr_drop_pruned"),
           *on_success("patr", "patr_best_n", optional=True)),
          paper="PATR paper: keeping the pruned branches in the group (as negatives: `patr`, "
                "the default) beats keeping only the best ones (Best_n)."),
)

TOOLCALL = (
    Claim("a", "Tree-GRPO > chain GRPO at equal budget", on_success("tree_grpo", "grpo"),
          paper="Tree-GRPO paper: at equal per-prompt budget the tree beats chains (at 2 per "
                "prompt, 31.6 vs 14.9).", budget=(("tree_grpo", 1.0),)),
    FROZENLAKE[1], FROZENLAKE[2],
    Claim("c", "Tree-GRPO takes more turns and tool calls than chain GRPO",
          (Comparison("tree_grpo", "grpo", "final eval/sampled_mean_turns", "greater",
                      unit="turns"),
           Comparison("tree_grpo", "grpo", "final eval/sampled_tool_calls", "greater",
                      unit="calls")),
          paper="Tree-GRPO paper: 2.4 -> 3.0 turns per episode."),
)   # the advantage ablation (intra / inter / both) runs on FrozenLake only (its claim c)

CLAIMS = {"frozenlake": FROZENLAKE, "toolcall": TOOLCALL}


def claims_for(env: str) -> tuple:
  """The claims checked for an env (the tool-call set, tree against chain, for other envs)."""
  return CLAIMS.get(env, TOOLCALL)
