"""research/analysis/stats.py: Student t from the incomplete beta function, CIs, Welch's test, the equality rule."""
from __future__ import annotations

import math

import numpy as np
import pytest

from research.analysis.stats import (betainc, diff_ci95, mean_ci95, roughly_equal, spearman_rho, t_cdf, t_critical,
                                     t_sf2, welch_t_test)


def _t_pdf(x, dof):
    logc = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    return np.exp(logc - (dof + 1) / 2 * np.log1p(x * x / dof))


def _two_sided_by_integration(t, dof):
    """Independent check: 1 - integral of the t density over [-|t|, |t|] (Simpson-like fine trapezoid)."""
    x = np.linspace(-abs(t), abs(t), 200_001)
    y = _t_pdf(x, dof)
    return 1.0 - float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2)


@pytest.mark.parametrize("t, dof, p", [(2.0, 10, 0.07339), (1.0, 1, 0.5), (1.96, 1e6, 0.05), (-2.0, 10, 0.07339),
                                       (0.0, 5, 1.0)])
def test_two_sided_p_known_values(t, dof, p):
    assert t_sf2(t, dof) == pytest.approx(p, abs=5e-5)


def test_two_sided_p_matches_numerical_integration():
    for t, dof in [(2.0, 8), (0.7, 3), (3.5, 2.5), (1.2, 30)]:
        assert t_sf2(t, dof) == pytest.approx(_two_sided_by_integration(t, dof), abs=1e-7)


def test_cdf_is_symmetric_and_monotone():
    ts = np.linspace(-6, 6, 61)
    c = np.array([t_cdf(t, 4) for t in ts])
    assert np.all(np.diff(c) > 0)
    assert c == pytest.approx(1 - c[::-1], abs=1e-12)
    assert t_cdf(0.0, 7) == pytest.approx(0.5)
    assert t_cdf(1.96, math.inf) == pytest.approx(0.975, abs=1e-4)


def test_critical_values():
    assert t_critical(2) == pytest.approx(4.3027, abs=1e-4)
    assert t_critical(4) == pytest.approx(2.7764, abs=1e-4)
    assert t_critical(1) == pytest.approx(12.7062, abs=1e-4)
    assert t_critical(1e7) == pytest.approx(1.95996, abs=1e-4)
    assert t_critical(10, confidence=0.99) == pytest.approx(3.1693, abs=1e-4)


def test_betainc_closed_forms():
    # I_x(a, 1) = x^a; I_x(1, b) = 1 - (1 - x)^b; I_0.4(2, 3) = sum_{j=2}^{4} C(4,j) 0.4^j 0.6^(4-j) = 0.5248
    assert betainc(3.0, 1.0, 0.3) == pytest.approx(0.3 ** 3, rel=1e-12)
    assert betainc(1.0, 2.5, 0.7) == pytest.approx(1 - 0.3 ** 2.5, rel=1e-12)
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, rel=1e-12)
    assert betainc(2.0, 3.0, 0.0) == 0.0 and betainc(2.0, 3.0, 1.0) == 1.0
    with pytest.raises(ValueError):
        betainc(-1.0, 1.0, 0.5)


def test_mean_ci95():
    mean, half = mean_ci95([1, 2, 3])
    assert mean == pytest.approx(2.0)
    assert half == pytest.approx(4.3027 * 1.0 / math.sqrt(3), abs=1e-4)
    mean, half = mean_ci95([5.0])
    assert mean == 5.0 and math.isnan(half)          # one run: no interval
    assert all(math.isnan(v) for v in mean_ci95([]))
    assert mean_ci95([1, None, 2, float("nan"), 3]) == pytest.approx(mean_ci95([1, 2, 3]))
    assert mean_ci95([4, 4, 4]) == (4.0, 0.0)


def test_welch_equal_variances_by_hand():
    a, b = [1, 2, 3, 4, 5], [3, 4, 5, 6, 7]
    # both variances 2.5, n = 5: se^2 = 2.5/5 + 2.5/5 = 1, t = (3 - 5) / 1 = -2,
    # dof = 1^2 / ((0.5^2)/4 + (0.5^2)/4) = 8; two-sided p(|T| >= 2, 8) = 0.08052
    t, dof, p = welch_t_test(a, b)
    assert t == pytest.approx(-2.0)
    assert dof == pytest.approx(8.0)
    assert p == pytest.approx(0.08052, abs=5e-5)
    assert p == pytest.approx(_two_sided_by_integration(2.0, 8), abs=1e-7)
    diff, half = diff_ci95(a, b)
    assert diff == pytest.approx(-2.0)
    assert half == pytest.approx(t_critical(8) * 1.0)


def test_welch_unequal_variances_dof():
    a, b = [10.0, 12.0, 14.0], [1.0, 1.5, 2.0, 2.5]
    va, vb = np.var(a, ddof=1) / 3, np.var(b, ddof=1) / 4
    t, dof, p = welch_t_test(a, b)
    assert t == pytest.approx((12.0 - 1.75) / math.sqrt(va + vb))
    assert dof == pytest.approx((va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 3))
    assert 0 < p < 0.01


def test_welch_degenerate_cases():
    assert all(math.isnan(v) for v in welch_t_test([1.0], [1.0, 2.0]))   # one value: no test
    t, _, p = welch_t_test([1, 1, 1], [1, 1, 1])
    assert t == 0.0 and p == 1.0
    t, _, p = welch_t_test([2, 2, 2], [1, 1, 1])
    assert t == math.inf and p == 0.0


def test_roughly_equal():
    assert roughly_equal(100.0, 102.0, 0.03)      # 2/101 < 3%
    assert not roughly_equal(100.0, 104.0, 0.03)  # 4/102 > 3%
    assert roughly_equal(0.0, 0.0, 0.03)
    assert not roughly_equal(float("nan"), 1.0, 0.03)
    assert roughly_equal(3.614, 3.618, 0.005) and not roughly_equal(3.614, 3.683, 0.005)


def test_spearman():
    assert spearman_rho([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman_rho([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman_rho([3, 1, 2], [1, 2, 3]) == pytest.approx(-0.5)
    assert math.isnan(spearman_rho([1, 1, 1], [1, 2, 3]))
