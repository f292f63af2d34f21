"""Seed statistics against hand computations: t quantiles and intervals, bootstrap intervals,
MDE, verdict rules."""

import math

import pytest

from experiments.reports.stats import (FAILS, HOLDS, NOT_RUN, PLANNED_SEEDS, UNSURE, combine,
                                       mde_multiplier, min_detectable_effect, paired_bootstrap,
                                       t_interval, t_quantile, verdict)
from experiments.sweeps import report

# Per-seed effects -0.02 .. -0.06: mean -0.04, sd sqrt(0.001 / 4) = 0.0158114, n = 5;
# half-width t_{0.975,4} x sd / sqrt(5) = 2.776445 x 0.00707107 = 0.0196324.
WORSE = [-0.02, -0.03, -0.04, -0.05, -0.06]
HALF = 2.776445 * math.sqrt(0.001 / 4) / math.sqrt(5)


def test_t_quantiles_against_closed_forms_and_tables():
  # df 1 (Cauchy): tan(pi (p - 1/2)); df 2: (2p - 1) / sqrt(2 p (1 - p))
  for p in (0.8, 0.9, 0.975):
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
  # printed tables: t_{0.975,4} = 2.7764, t_{0.80,4} = 0.9410, t_{0.975,9} = 2.2622
  assert t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)
  assert t_quantile(0.8, 4) == pytest.approx(0.940965, abs=1e-6)
  assert t_quantile(0.975, 9) == pytest.approx(2.262157, abs=1e-6)


def test_t_interval_by_hand():
  # [1, 2, 3]: mean 2, sd 1, half-width t_{0.975,2} / sqrt(3) = 4.302653 / 1.732051 = 2.484138
  assert t_interval([1.0, 2.0, 3.0]) == pytest.approx((2.0, 2.0 - 2.484138, 2.0 + 2.484138))
  mean, low, high = t_interval(WORSE)
  assert (mean, low, high) == pytest.approx((-0.04, -0.04 - HALF, -0.04 + HALF))
  assert (low, high) == pytest.approx((-0.0596324, -0.0203676), abs=1e-7)
  mean, low, high = t_interval([0.2, math.nan])   # a seed without a measurement is left out
  assert mean == 0.2 and math.isnan(low) and math.isnan(high)
  assert all(math.isnan(v) for v in t_interval([]))


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
  # t_{0.975,n-1} + t_{0.80,n-1}: 4.302653 + 1.060660 at n = 3, 2.776445 + 0.940965 at n = 5
  assert mde_multiplier(3) == pytest.approx(5.363313, abs=1e-6)
  assert mde_multiplier(5) == pytest.approx(3.717410, abs=1e-6)
  # sd([1, 2, 3], ddof=1) = 1, n = 3
  assert min_detectable_effect([1.0, 2.0, 3.0]) == pytest.approx(5.363313 / math.sqrt(3))
  assert min_detectable_effect(WORSE) == pytest.approx(3.717410 * HALF / 2.776445)
  assert math.isnan(min_detectable_effect([0.5]))
  # projected to 5 seeds at the sd of 3: 3.717410 x 1 / sqrt(5)
  assert min_detectable_effect([1.0, 2.0, 3.0], seeds=5) == pytest.approx(3.717410 / math.sqrt(5))
  assert math.isnan(min_detectable_effect([0.5], seeds=5))


def test_the_projection_plans_the_reproductions_seeds():
  assert PLANNED_SEEDS == len(report.REPRODUCTION_SEEDS)


@pytest.mark.parametrize("shift, kind, want", [
    (0.08, "greater", HOLDS),       # [+0.020, +0.060]: every effect > 0
    (0.0, "greater", FAILS),        # [-0.060, -0.020]: none > 0
    (0.04, "greater", UNSURE),      # [-0.020, +0.020]
    (0.01, "not_less", HOLDS),      # [-0.050, -0.010]: low -0.0496 > -0.05
    (0.0, "not_less", UNSURE),      # [-0.060, -0.020]: straddles -0.05 (worse than 0 throughout)
    (-0.04, "not_less", FAILS),     # [-0.100, -0.060]: none > -0.05
])
def test_verdicts_of_hand_computed_t_intervals(shift, kind, want):
  _, low, high = t_interval([d + shift for d in WORSE])
  assert (low, high) == pytest.approx((-0.04 + shift - HALF, -0.04 + shift + HALF))
  assert verdict(low, high, kind) == want


def test_non_inferiority_is_symmetric():
  # "> -5 points" with [-5.4, -1.9]: values above -5 and below it, so inconclusive (the
  # interval lying below 0 does not make the claim fail); shifted by 0.5 it holds
  assert verdict(-0.054, -0.019, "not_less") == UNSURE
  assert verdict(-0.049, -0.014, "not_less") == HOLDS
  assert verdict(-0.09, -0.051, "not_less") == FAILS
  # "< +5 points" mirrors it
  assert verdict(0.019, 0.054, "not_greater") == UNSURE
  assert verdict(0.051, 0.09, "not_greater") == FAILS


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
    (-0.2, -0.06, FAILS),     # worse by more than the margin throughout
    (-0.2, -0.01, UNSURE),    # worse, by more or by less than the margin
    (-0.2, 0.1, UNSURE), (-0.05, 0.1, UNSURE), (-0.2, -0.05, FAILS),
    (math.nan, math.nan, UNSURE)])
def test_not_less(low, high, want):
  assert verdict(low, high, "not_less") == want


@pytest.mark.parametrize("low, high, want", [
    (-0.1, 0.04, HOLDS), (0.01, 0.03, HOLDS), (0.06, 0.2, FAILS), (0.01, 0.2, UNSURE),
    (-0.1, 0.2, UNSURE), (math.nan, 0.0, UNSURE)])
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
