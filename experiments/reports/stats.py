"""Seed statistics of the reports: a Student-t interval on the per-seed paired effects, the
minimal detectable effect, and the verdict a claim gets from its interval.

The unit of replication is the seed: methods compared on one seed share that seed's warm start,
so a claim is measured on the per-seed paired effects d_s = A_s - B_s (or a per-seed ratio).
`t_interval` gives mean(d) -+ t_{0.975, n-1} x sd(d) / sqrt(n), the standard interval at these
seed counts. `paired_bootstrap` (the percentile bootstrap over seeds) is kept as a secondary
reading: with normal data its 95% interval covers the true mean about 75% of the time at n=3
and 85% at n=5 (at n=3 it is exactly [min(d), max(d)]). `min_detectable_effect` is the smallest
true effect a two-sided 5% t-test finds with 80% power at this many seeds: an effect below it
cannot be told from noise.

A comparison over fewer than `MIN_SEEDS` (3) seeds is inconclusive whatever its interval.

Verdicts (`verdict(low, high, kind, margin, at)`) read the interval [low, high] against the
claimed bound b: **holds** when every effect in the interval satisfies the claim, **does not
hold** when none does, inconclusive otherwise (and whenever a bound is NaN: one seed, no data).
- greater (effect > b, b = at): holds if low > b; does not hold if high <= b.
- not_less (effect > b, b = at - margin: non-inferiority): the same rule, so with a 5-point
  margin [-5.4, -1.9] is inconclusive (it holds values above -5 and values below).
- less (effect < b, b = at) and not_greater (effect < b, b = at + margin): holds if high < b;
  does not hold if low >= b.
- at_least (effect >= b, b = at, e.g. a ratio of at least 1.35): holds if low >= b; does not
  hold if high < b.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _scipy_stats

HOLDS, FAILS, UNSURE, NOT_RUN = "holds", "does not hold", "inconclusive", "not run yet"
# Fewest seeds for a verdict other than inconclusive: with 2, t_{0.975,1} = 12.7 makes any
# interval uninformative, and the bootstrap's is the range of two values.
MIN_SEEDS = 3
# The seeds a reproduction plans (`experiments.sweeps.report.REPRODUCTION_SEEDS`): a report
# projects each MDE to this many seeds at the sd its seeds show.
PLANNED_SEEDS = 5
LEVEL = 0.95
# (direction, offset of the bound from `at` in units of `margin`)
KINDS = {"greater": (">", 0), "not_less": (">", -1), "less": ("<", 0),
         "not_greater": ("<", 1), "at_least": (">=", 0)}


def _finite(values) -> np.ndarray:
  x = np.asarray(values, dtype=float).reshape(-1)
  return x[np.isfinite(x)]


def t_quantile(p: float, df: int) -> float:
  """The p-quantile of Student's t with `df` degrees of freedom."""
  return float(_scipy_stats.t.ppf(p, df))


def _too_few(x) -> tuple[float, float, float] | None:
  """(mean or nan, nan, nan) when `x` holds fewer than two values (no interval), else None."""
  if x.size >= 2:
    return None
  return (float(x.mean()) if x.size else math.nan), math.nan, math.nan


def t_interval(values, level: float = LEVEL) -> tuple[float, float, float]:
  """(mean, low, high): the mean of the per-seed values and its Student-t interval,
  mean -+ t_{(1+level)/2, n-1} x sd(ddof=1) / sqrt(n). Non-finite values (a seed without a
  measurement) are left out; with one seed the interval is (nan, nan), with none the mean too."""
  x = _finite(values)
  if (few := _too_few(x)) is not None:
    return few
  mean = float(x.mean())
  half = t_quantile((1 + level) / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
  return mean, float(mean - half), float(mean + half)


def paired_bootstrap(values, n: int = 10000, seed: int = 0, level: float = LEVEL):
  """(mean, low, high): the mean of the per-seed values and its percentile bootstrap interval
  over seeds resampled with replacement (generator seed fixed: reproducible). Secondary: it
  under-covers at few seeds (module docstring). NaN as in `t_interval`."""
  x = _finite(values)
  if (few := _too_few(x)) is not None:
    return few
  mean = float(x.mean())
  rng = np.random.default_rng(seed)
  means = x[rng.integers(0, x.size, size=(n, x.size))].mean(axis=1)
  tail = 100 * (1 - level) / 2
  low, high = np.percentile(means, [tail, 100 - tail])
  return mean, float(low), float(high)


def mde_multiplier(n: int, alpha: float = 0.05, power: float = 0.8) -> float:
  """t_{1-alpha/2, n-1} + t_{power, n-1}: 3.72 at n=5, 5.36 at n=3 (2.80 is the large-n z)."""
  return t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)


def min_detectable_effect(values, alpha: float = 0.05, power: float = 0.8,
                          seeds: int | None = None) -> float:
  """mde_multiplier(n) x sd(values, ddof=1) / sqrt(n): the smallest true mean effect a
  two-sided t-test at `alpha` detects with probability `power`; nan for fewer than two seeds.
  `seeds` projects it to that many seeds at the sd these values show (n = seeds)."""
  x = _finite(values)
  if x.size < 2:
    return math.nan
  n = x.size if seeds is None else seeds
  return float(mde_multiplier(n, alpha, power) * x.std(ddof=1) / math.sqrt(n))


def bound(kind: str, margin: float = 0.05, at: float = 0.0) -> tuple[str, float]:
  """The claim as (direction, bound b): `effect > b`, `< b` or `>= b`."""
  if kind not in KINDS:
    raise ValueError(f"verdict kind {kind!r}; known: {tuple(KINDS)}")
  direction, k = KINDS[kind]
  return direction, at + k * margin


def verdict(low: float, high: float, kind: str, margin: float = 0.05, at: float = 0.0) -> str:
  """The claim's verdict from its interval [low, high] (rules in the module docstring)."""
  direction, b = bound(kind, margin, at)
  if not (math.isfinite(low) and math.isfinite(high)):
    return UNSURE
  holds, fails = {">": (low > b, high <= b), "<": (high < b, low >= b),
                  ">=": (low >= b, high < b)}[direction]
  return HOLDS if holds else FAILS if fails else UNSURE


def combine(verdicts) -> str:
  """One verdict for a claim made of several comparisons: does not hold if any does not hold,
  holds if all hold, not run yet if any part has not run, else inconclusive."""
  verdicts = list(verdicts)
  if FAILS in verdicts:
    return FAILS
  if verdicts and all(v == HOLDS for v in verdicts):
    return HOLDS
  return NOT_RUN if NOT_RUN in verdicts or not verdicts else UNSURE
