"""research/analysis/stats.py: intervals, p-values and rank correlations, against hand values."""
from __future__ import annotations

import math

import pytest


from research.analysis.stats import (mean_ci, mean_ci95, one_sample_p,
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


def test_spearman():
    assert spearman_rho([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman_rho([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman_rho([1, 1, 1], [1, 2, 3])) and math.isnan(spearman_rho([1], [2]))
    assert spearman_rho([1, 2, None, 3], [3, 1, 5, 2]) == pytest.approx(-0.5)
