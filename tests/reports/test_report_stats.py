"""Seed statistics against hand computations: bootstrap intervals, MDE, verdict rules."""

import math

import pytest

from experiments.reports.stats import (FAILS, HOLDS, NOT_RUN, UNSURE, combine,
                                       min_detectable_effect, paired_bootstrap, verdict)


def test_equal_differences_collapse_the_interval():
  mean, low, high = paired_bootstrap([0.1, 0.1, 0.1, 0.1])
  assert mean == pytest.approx(0.1) and low == pytest.approx(0.1) and high == pytest.approx(0.1)


def test_three_seeds_give_the_range_of_the_differences():
  # Of the 27 equally likely resamples, "seed 2 three times" (mean 0.02) alone has probability
  # 1/27 = 3.7% > 2.5%, so the 2.5% percentile is 0.02; likewise the 97.5% one is 0.05.
  mean, low, high = paired_bootstrap([0.04, 0.05, 0.02])
  assert mean == pytest.approx(0.11 / 3)
  assert (low, high) == (pytest.approx(0.02), pytest.approx(0.05))


def test_two_seeds_interval_and_reproducibility():
  # resamples of (0, 1): means 0, 0.5, 0.5, 1 with probability 1/4 each
  assert paired_bootstrap([0.0, 1.0]) == (0.5, 0.0, 1.0)
  assert paired_bootstrap([0.3, -0.1, 0.2, 0.05]) == paired_bootstrap([0.3, -0.1, 0.2, 0.05])


def test_one_seed_or_none_is_inconclusive():
  mean, low, high = paired_bootstrap([0.2])
  assert mean == 0.2 and math.isnan(low) and math.isnan(high)
  assert all(math.isnan(v) for v in paired_bootstrap([]))
  # a seed without a measurement (NaN) is left out
  assert paired_bootstrap([0.2, math.nan])[0] == 0.2


def test_minimal_detectable_effect_by_hand():
  # sd([1, 2, 3], ddof=1) = 1, n = 3: (1.959964 + 0.841621) / sqrt(3)
  assert min_detectable_effect([1.0, 2.0, 3.0]) == pytest.approx(2.801585 / math.sqrt(3))
  assert math.isnan(min_detectable_effect([0.5]))
  with pytest.raises(ValueError):
    min_detectable_effect([1.0, 2.0], alpha=0.1)


@pytest.mark.parametrize("low, high, want", [
    (0.01, 0.2, HOLDS), (-0.2, 0.0, FAILS), (-0.2, -0.01, FAILS), (-0.1, 0.1, UNSURE),
    (0.0, 0.1, UNSURE), (math.nan, 0.1, UNSURE)])
def test_greater(low, high, want):
  assert verdict(low, high, "greater") == want


@pytest.mark.parametrize("low, high, want", [
    (-0.2, -0.01, HOLDS), (0.0, 0.2, FAILS), (-0.1, 0.1, UNSURE), (-0.1, math.nan, UNSURE)])
def test_less(low, high, want):
  assert verdict(low, high, "less") == want


@pytest.mark.parametrize("low, high, want", [
    (-0.04, 0.1, HOLDS),      # any shortfall is within the 5-point margin
    (-0.03, -0.01, HOLDS),    # worse, but by less than the margin: non-inferior
    (-0.2, -0.01, FAILS),     # worse, possibly by more than the margin
    (-0.2, 0.1, UNSURE), (-0.05, 0.1, UNSURE), (math.nan, math.nan, UNSURE)])
def test_not_less(low, high, want):
  assert verdict(low, high, "not_less") == want


@pytest.mark.parametrize("low, high, want", [
    (-0.1, 0.04, HOLDS), (0.01, 0.03, HOLDS), (0.01, 0.2, FAILS), (-0.1, 0.2, UNSURE),
    (math.nan, 0.0, UNSURE)])
def test_not_greater(low, high, want):
  assert verdict(low, high, "not_greater") == want


@pytest.mark.parametrize("low, high, want", [
    (1.35, 1.6, HOLDS), (1.4, 1.5, HOLDS), (1.0, 1.34, FAILS), (1.2, 1.5, UNSURE),
    (math.nan, 2.0, UNSURE)])
def test_ratio_at_least(low, high, want):
  assert verdict(low, high, "at_least", at=1.35) == want


def test_margin_and_unknown_kind():
  assert verdict(-0.08, 0.1, "not_less", margin=0.1) == HOLDS
  with pytest.raises(ValueError):
    verdict(0.0, 1.0, "bigger")


def test_combined_verdicts():
  assert combine([HOLDS, HOLDS]) == HOLDS
  assert combine([HOLDS, FAILS, NOT_RUN]) == FAILS
  assert combine([HOLDS, UNSURE]) == UNSURE
  assert combine([HOLDS, NOT_RUN]) == NOT_RUN
  assert combine([]) == NOT_RUN
