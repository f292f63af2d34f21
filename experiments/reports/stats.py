"""Seed statistics of the reports: a paired bootstrap interval, the minimal detectable effect, and
the verdict a claim gets from its interval.

The unit of replication is the seed: methods compared on one seed share that seed's warm start,
so a claim is measured on the per-seed paired differences d_s = A_s - B_s (or a per-seed ratio).
`paired_bootstrap` resamples the seeds with replacement (a fixed generator seed: the report is
reproducible) and takes the 2.5% and 97.5% percentiles of the resampled means. The percentile
interval lies within min(d)..max(d) and covers less than its level with few seeds: with 3 seeds it
is exactly [min(d), max(d)] (the resample "one seed three times" has probability 1/27 > 2.5%),
so a claim of a positive effect holds only when every seed agrees. Read it together with the
minimal detectable effect (`min_detectable_effect`): an effect smaller than the MDE cannot be
told from noise at this seed count.

A comparison over fewer than `MIN_SEEDS` (3) seeds is inconclusive whatever its interval.

Verdicts (`verdict(low, high, kind, margin, at)`), on the 95% interval [low, high] of the effect
against a reference `at` (0 for a difference); the rules are checked in the order written, and a
NaN bound (one seed, or no data) is always inconclusive:
- greater (claim: effect > at): holds if low > at; does not hold if high <= at (the interval
  excludes every positive effect); else inconclusive.
- less (claim: effect < at): holds if high < at; does not hold if low >= at; else inconclusive.
- not_less (claim: A >= B up to a margin, non-inferiority): holds if low > at - margin (any
  shortfall is smaller than the margin); does not hold if high < at (A is worse, and by possibly
  more than the margin); else inconclusive.
- not_greater (claim: A <= B up to a margin): holds if high < at + margin; does not hold if
  low > at; else inconclusive.
- at_least (claim: effect >= at, e.g. a ratio of at least 1.35): holds if low >= at; does not
  hold if high < at; else inconclusive.
"""

from __future__ import annotations

import math

import numpy as np

HOLDS, FAILS, UNSURE, NOT_RUN = "holds", "does not hold", "inconclusive", "not run yet"
# Fewest seeds for a verdict other than inconclusive: with 2, the percentile interval is the range
# of two values, which contains the true median effect half the time (with 3, 75% of the time).
MIN_SEEDS = 3
KINDS = ("greater", "less", "not_less", "not_greater", "at_least")
Z_ALPHA, Z_POWER = 1.959964, 0.841621   # z of 1 - 0.05/2 and of 0.8


def _finite(values) -> np.ndarray:
  x = np.asarray(values, dtype=float).reshape(-1)
  return x[np.isfinite(x)]


def paired_bootstrap(diffs, n: int = 10000, seed: int = 0, level: float = 0.95):
  """(mean, low, high): the mean of the per-seed values and its percentile bootstrap interval
  over seeds resampled with replacement. Non-finite values (a seed without a measurement) are
  left out; with one seed the interval is (nan, nan), with none the mean is nan too."""
  x = _finite(diffs)
  if x.size == 0:
    return math.nan, math.nan, math.nan
  mean = float(x.mean())
  if x.size < 2:
    return mean, math.nan, math.nan
  rng = np.random.default_rng(seed)
  means = x[rng.integers(0, x.size, size=(n, x.size))].mean(axis=1)
  tail = 100 * (1 - level) / 2
  low, high = np.percentile(means, [tail, 100 - tail])
  return mean, float(low), float(high)


def min_detectable_effect(diffs, alpha: float = 0.05, power: float = 0.8) -> float:
  """(z_{1-alpha/2} + z_power) * sd(diffs, ddof=1) / sqrt(n): the smallest true mean difference
  a two-sided test at `alpha` detects with probability `power` (normal approximation); nan for
  fewer than two seeds. Only alpha 0.05 and power 0.8 are tabulated."""
  if (alpha, power) != (0.05, 0.8):
    raise ValueError("min_detectable_effect knows z for alpha=0.05 and power=0.8 only")
  x = _finite(diffs)
  if x.size < 2:
    return math.nan
  return float((Z_ALPHA + Z_POWER) * x.std(ddof=1) / math.sqrt(x.size))


def verdict(low: float, high: float, kind: str, margin: float = 0.05, at: float = 0.0) -> str:
  """The claim's verdict from its interval [low, high] (rules in the module docstring)."""
  if kind not in KINDS:
    raise ValueError(f"verdict kind {kind!r}; known: {KINDS}")
  if not (math.isfinite(low) and math.isfinite(high)):
    return UNSURE
  rules = {"greater": (low > at, high <= at),
           "less": (high < at, low >= at),
           "not_less": (low > at - margin, high < at),
           "not_greater": (high < at + margin, low > at),
           "at_least": (low >= at, high < at)}
  holds, fails = rules[kind]
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
