"""research/analysis/stats.py: intervals, p-values and the seeds that would settle a difference, against hand values
and simulation."""
from __future__ import annotations

import math

import pytest

import numpy as np

from research.analysis.stats import (mean_ci, mean_ci95, one_sample_p, seeds_to_settle, settle_probability,
                                     spearman_rho, t_critical)


def test_critical_values_of_student_t():
    assert t_critical(2) == pytest.approx(4.302653, abs=1e-6)      # tables: t_{0.975, 2}
    assert t_critical(4) == pytest.approx(2.776445, abs=1e-6)
    assert t_critical(1, 0.90) == pytest.approx(6.313752, abs=1e-6)  # t_{0.95, 1}, the 90% interval
    assert t_critical(1e9) == pytest.approx(1.959964, abs=1e-6)


def test_mean_ci_by_hand():
    mean, half = mean_ci95([1.0, 2.0, 3.0])  # s = 1, n = 3
    assert mean == 2.0 and half == pytest.approx(4.302653 / math.sqrt(3), abs=1e-6)
    assert mean_ci([1.0, 2.0, 3.0, None, math.nan], 0.90)[1] == pytest.approx(2.919986 / math.sqrt(3), abs=1e-6)
    assert mean_ci95([5.0])[0] == 5.0 and math.isnan(mean_ci95([5.0])[1])
    assert all(math.isnan(v) for v in mean_ci95([None]))


def test_one_sample_p():
    assert one_sample_p([1.0, -1.0]) == pytest.approx(1.0)
    # t = 2 / (1 / sqrt(3)) = 3.464 with 2 dof: two-sided p = 0.07418
    assert one_sample_p([1.0, 2.0, 3.0]) == pytest.approx(0.07418, abs=1e-5)
    assert one_sample_p([0.5, 0.5]) == 0.0 and one_sample_p([0.0, 0.0]) == 1.0  # no spread
    assert math.isnan(one_sample_p([1.0]))


def _simulated_settle_rate(diff, sd, margin, n, level, reps=40_000, seed=0):
    """How often the level-`level` t interval of n normal differences lies inside (-margin, margin) or wholly
    beyond it: the quantity settle_probability integrates."""
    x = np.random.default_rng(seed).normal(diff, sd, (reps, n))
    mean, half = x.mean(1), t_critical(n - 1, level) * x.std(1, ddof=1) / np.sqrt(n)
    lo, hi = mean - half, mean + half
    return float((((lo > -margin) & (hi < margin)) | (lo >= margin) | (hi <= -margin)).mean())


@pytest.mark.parametrize("diff,sd,margin,n,level", [(0.0, 1.0, 0.5, 30, 0.95), (2.0, 1.0, 3.0, 6, 1 - 0.05 / 3),
                                                     (1.0, 1.0, 0.5, 8, 0.95), (-4.0, 1.0, 3.0, 5, 0.975)])
def test_settle_probability_matches_simulation(diff, sd, margin, n, level):
    # 40,000 draws: the simulated rate has a standard error below 0.0025
    assert settle_probability(diff, sd, margin, [n], level)[0] == pytest.approx(
        _simulated_settle_rate(diff, sd, margin, n, level), abs=0.01)


def test_seeds_to_settle_gives_80_percent_and_no_fewer():
    """The count it names settles the size 80% of the time if the observed mean and spread were exact; one
    seed fewer does not. (The earlier rule, the first n whose interval would settle it at the observed values
    exactly, decided only 57-92% of the time.)"""
    level = 1 - 0.05 / 3
    for diff, sd, margin in ((0.0, 1.0, 0.5), (2.0, 1.0, 3.0), (1.0, 2.0, 0.3)):
        n = seeds_to_settle(diff, sd, margin, level)
        assert settle_probability(diff, sd, margin, [n], level)[0] >= 0.8
        assert settle_probability(diff, sd, margin, [n - 1], level)[0] < 0.8
        assert _simulated_settle_rate(diff, sd, margin, n, level) == pytest.approx(0.8, abs=0.05)
    assert seeds_to_settle(2.0, 0.0, 3.0, level) == 2  # no spread: any two seeds settle it
    assert seeds_to_settle(1.0, 1.0, 1.0, level) is None  # exactly at the margin: never
    assert seeds_to_settle(math.nan, 1.0, 1.0, level) is None


def test_spearman():
    assert spearman_rho([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman_rho([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman_rho([1, 1, 1], [1, 2, 3])) and math.isnan(spearman_rho([1], [2]))
    assert spearman_rho([1, 2, None, 3], [3, 1, 5, 2]) == pytest.approx(-0.5)
