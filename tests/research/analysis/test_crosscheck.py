"""research/analysis/rules.py (decide) against independent implementations, on random families: scipy's paired
t-test and its confidence interval at the Bonferroni level, and statsmodels' two one-sided tests for "inside
the margin" (skipped without statsmodels; it is not a requirement of the project).

The correspondence: a family of k comparisons reads each outcome off the t interval at level 1 - 0.05/k. Its
lower end lies above -m exactly when the one-sided test of "mean <= -m" rejects at 0.05/(2k) (the interval's
half width is the one-sided critical value at 0.05/(2k) times the standard error), and its upper end below +m
exactly when that of "mean >= +m" does. So "equal" or "different, within the margin" (the interval inside
(-m, +m)) is exactly TOST's p = max(p_lower, p_upper) below 0.05/(2k)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from research.analysis.rules import ALPHA, Paired, decide


def random_families(seed: int, count: int = 200):
    """(family {key: Paired}, {key: (a values, b values)}, relative margin) with 1-5 comparisons of 2-9 seeds
    each; true differences spread around the margin so that every outcome occurs."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        k, n, margin = int(rng.integers(1, 6)), int(rng.integers(2, 10)), float(rng.choice([0.005, 0.03, 0.1]))
        values = {}
        for key in range(k):
            base = rng.normal(100, 10, n)
            shift = rng.uniform(-2, 2) * margin * 100
            values[key] = (base + shift + rng.normal(0, rng.choice([0.1, 1.0, 3.0]) * margin * 100, n), base)
        family = {key: Paired.of(dict(enumerate(a)), dict(enumerate(b))) for key, (a, b) in values.items()}
        yield family, values, margin


def test_decide_agrees_with_scipys_paired_t_test_and_its_bonferroni_interval():
    for family, values, margin in random_families(380):
        k = len(family)
        for key, d in decide(family, margin).items():
            a, b = values[key]
            t = stats.ttest_rel(a, b)
            lo, hi = t.confidence_interval(confidence_level=1 - ALPHA / k)
            assert d.diff == pytest.approx(np.mean(a - b), rel=1e-12, abs=1e-12)
            assert d.ci_level == pytest.approx(1 - ALPHA / k)
            assert d.ci == pytest.approx((lo, hi), rel=1e-9, abs=1e-9)
            assert d.p == pytest.approx(t.pvalue, rel=1e-9, abs=1e-12)
            assert d.p_adj == pytest.approx(min(1.0, k * t.pvalue), rel=1e-9, abs=1e-12)
            assert d.significant == (lo > 0 or hi < 0)


def test_inside_the_margin_is_tost_at_alpha_over_2k():
    weightstats = pytest.importorskip("statsmodels.stats.weightstats")
    inside = outside = 0
    for family, values, margin in random_families(381):
        k = len(family)
        for key, d in decide(family, margin).items():
            a, b = values[key]
            p = weightstats.ttost_paired(a, b, -d.margin, d.margin)[0]
            assert d.same == (p < ALPHA / (2 * k)), (d, p)
            inside, outside = inside + d.same, outside + (not d.same)
    assert inside > 50 and outside > 50  # both answers were put to the test
