"""research/analysis/rules.py: the decision procedure on seed sets whose answer is known."""
from __future__ import annotations

import math

import numpy as np
import pytest

from research.analysis.rules import (DESCRIPTIVE, DIFFERENT, EQUAL, INCONCLUSIVE, NO_DATA, UNRESOLVED, WITHIN, Paired,
                                    decide, finals, outcome_of)
from research.analysis.stats import t_critical
from tests.research.synthetic import qk_run


def one(a: dict, b: dict, margin: float = 0.03):
    return decide({"x": Paired.of(a, b)}, margin)["x"]


def test_a_wide_spread_is_inconclusive_never_equal():
    """A = {20, 40} vs B = {29, 31}: same mean, but two seeds this far apart decide nothing."""
    d = one({0: 20.0, 1: 40.0}, {0: 29.0, 1: 31.0})
    assert d.outcome == INCONCLUSIVE and d.diff == 0.0 and d.n == 2
    assert d.seeds_needed is not None and d.seeds_needed > 2


def test_the_outcome_is_where_the_interval_lies():
    m = 2.0
    assert outcome_of(-1.0, 1.0, m) == EQUAL
    assert outcome_of(0.5, 1.5, m) == WITHIN and outcome_of(-1.9, -0.1, m) == WITHIN
    assert outcome_of(0.5, 2.5, m) == UNRESOLVED and outcome_of(-2.1, -0.1, m) == UNRESOLVED
    assert outcome_of(2.0, 3.0, m) == DIFFERENT and outcome_of(-5.0, -2.5, m) == DIFFERENT
    assert outcome_of(-1.0, 3.0, m) == INCONCLUSIVE and outcome_of(-3.0, 3.0, m) == INCONCLUSIVE


def test_a_real_difference_whose_size_straddles_the_margin_is_unresolved():
    """+3% of the mean, seeds spread so the interval excludes 0 but reaches below the 3% margin."""
    a = {s: 103.0 + v for s, v in enumerate((-0.5, 0.5, 0.0, -0.3, 0.3))}
    b = {s: 100.0 for s in range(5)}
    d = one(a, b)
    half = t_critical(4, 0.95) * np.std([-0.5, 0.5, 0.0, -0.3, 0.3], ddof=1) / math.sqrt(5)
    assert d.ci == pytest.approx((3.0 - half, 3.0 + half)) and 0 < d.ci[0] < d.margin < d.ci[1]
    assert d.outcome == UNRESOLVED and d.significant and not d.differs and not d.decided
    assert d.seeds_needed is not None and d.seeds_needed > 5


def test_a_small_real_difference_is_different_but_within_the_margin():
    """2.6% apart with a tight spread: significant, and its interval inside +-3% of the mean."""
    a = {s: 102.6 + 0.01 * (s - 1) for s in range(3)}
    b = {s: 100.0 - 0.01 * (s - 1) for s in range(3)}
    d = one(a, b)
    assert d.outcome == WITHIN and d.rel == pytest.approx(2.6 / 101.3, rel=1e-6) and d.p < 1e-4
    assert d.same and not d.differs


def test_equal_values_with_tiny_spread_are_equal():
    d = one({s: 50.0 + 1e-3 * s for s in range(4)}, {s: 50.0 for s in range(4)})
    assert d.outcome == EQUAL and abs(d.diff) < 0.01 and d.ci[0] > -1.5 and d.ci[1] < 1.5 and d.ci_level == 0.95


def test_a_large_clear_difference_is_different_and_one_seed_is_descriptive():
    d = one({s: 60.0 + 0.1 * s for s in range(3)}, {s: 50.0 for s in range(3)})
    assert d.outcome == DIFFERENT and d.differs and d.diff == pytest.approx(10.1)
    lo, hi = d.ci
    assert lo < d.diff < hi and lo > 0
    single = one({0: 60.0}, {0: 50.0})
    assert single.outcome == DESCRIPTIVE and single.diff == 10.0 and math.isnan(single.p)
    none = one({0: 60.0}, {1: 50.0})  # no seed both sides ran: not "one seed"
    assert none.outcome == NO_DATA and none.n == 0 and not none.tested


def test_pairs_are_matched_by_seed_not_by_position():
    """Per-seed differences remove what each seed shares between conditions: here all of the spread."""
    a = {0: 10.0, 1: 20.0, 2: 30.0}
    b = {2: 29.0, 0: 9.0, 1: 19.0, 7: 99.0}  # seed 7 has no partner and is left out
    d = one(a, b, margin=0.01)
    assert d.n == 3 and d.diff == pytest.approx(1.0) and d.sd == pytest.approx(0.0)
    assert d.outcome == DIFFERENT  # a constant difference of 1 is far outside +-1% of ~20


def test_bonferroni_over_the_testable_members_of_the_family():
    rng = np.random.default_rng(0)
    base = rng.normal(0, 1, 5)
    family = {k: Paired.of({s: base[s] + shift for s in range(5)}, {s: base[s] for s in range(5)})
              for k, shift in (("clear", 5.0), ("none", 0.0))}
    family["noisy"] = Paired.of({s: base[s] + rng.normal(0.3, 1) for s in range(5)}, {s: base[s] for s in range(5)})
    family["one seed"] = Paired.of({0: 1.0}, {0: 2.0})  # not testable: not counted in k
    dec = decide(family, margin=0.03)
    assert all(dec[k].ci_level == pytest.approx(1 - 0.05 / 3) for k in ("clear", "none", "noisy"))
    assert all(dec[k].p_adj == pytest.approx(min(1.0, 3 * dec[k].p)) for k in ("clear", "none", "noisy"))


def test_the_interval_shown_agrees_with_the_test_in_every_family():
    """Excluding 0 is exactly p (Bonferroni) < 0.05, on 300 random families of 1-4 comparisons and 2-8 seeds.
    (Holm's step-down, used before, has no intervals that agree with it: a 97.5% CI [-2.93, -0.07] was shown
    beside Holm p 0.06 and "inconclusive".)"""
    rng = np.random.default_rng(1)
    for _ in range(300):
        n, k = int(rng.integers(2, 9)), int(rng.integers(1, 5))
        family = {i: Paired.of({s: v for s, v in enumerate(rng.normal(rng.normal(0, 1), 1, n))}, dict.fromkeys(
            range(n), 0.0)) for i in range(k)}
        for d in decide(family, margin=0.5).values():
            excludes0 = d.ci[0] > 0 or d.ci[1] < 0
            assert excludes0 == (d.p_adj < 0.05)


def test_finals_are_keyed_by_seed():
    runs = {"QK": [qk_run("QK", 3, 50, 3.6), qk_run("QK", 1, 50, 3.6)]}
    assert list(finals(runs, "QK", "mean_pr")) == [3, 1]
