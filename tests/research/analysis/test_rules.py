"""research/analysis/rules.py: the decision procedure on seed sets whose answer is known."""
from __future__ import annotations

import math

import numpy as np
import pytest

from research.analysis.rules import (DESCRIPTIVE, DIFFERENT, EQUAL, INCONCLUSIVE, WITHIN, Paired, decide, finals)
from tests.research.synthetic import qk_run


def one(a: dict, b: dict, margin: float = 0.03):
    return decide({"x": Paired.of(a, b)}, margin)["x"]


def test_a_wide_spread_is_inconclusive_never_equal():
    """A = {20, 40} vs B = {29, 31}: same mean, but two seeds this far apart decide nothing."""
    d = one({0: 20.0, 1: 40.0}, {0: 29.0, 1: 31.0})
    assert d.outcome == INCONCLUSIVE and d.diff == 0.0 and d.n == 2
    assert d.seeds_needed is not None and d.seeds_needed > 2


def test_a_small_real_difference_is_different_but_within_the_margin():
    """2.6% apart with a tight spread: significant, and its 90% CI inside +-3% of the mean."""
    a = {s: 102.6 + 0.01 * (s - 1) for s in range(3)}
    b = {s: 100.0 - 0.01 * (s - 1) for s in range(3)}
    d = one(a, b)
    assert d.outcome == WITHIN and d.rel == pytest.approx(2.6 / 101.3, rel=1e-6) and d.p < 1e-4
    assert d.same and not d.differs


def test_equal_values_with_tiny_spread_are_equal():
    d = one({s: 50.0 + 1e-3 * s for s in range(4)}, {s: 50.0 for s in range(4)})
    assert d.outcome == EQUAL and abs(d.diff) < 0.01 and d.ci90[0] > -1.5 and d.ci90[1] < 1.5


def test_a_large_clear_difference_is_different_and_one_seed_is_descriptive():
    d = one({s: 60.0 + 0.1 * s for s in range(3)}, {s: 50.0 for s in range(3)})
    assert d.outcome == DIFFERENT and d.differs and d.diff == pytest.approx(10.1)
    lo, hi = d.ci
    assert lo < d.diff < hi and lo > 0
    single = one({0: 60.0}, {0: 50.0})
    assert single.outcome == DESCRIPTIVE and single.diff == 10.0 and math.isnan(single.p)


def test_pairs_are_matched_by_seed_not_by_position():
    """Per-seed differences remove what each seed shares between conditions: here all of the spread."""
    a = {0: 10.0, 1: 20.0, 2: 30.0}
    b = {2: 29.0, 0: 9.0, 1: 19.0, 7: 99.0}  # seed 7 has no partner and is left out
    d = one(a, b, margin=0.01)
    assert d.n == 3 and d.diff == pytest.approx(1.0) and d.sd == pytest.approx(0.0)
    assert d.outcome == DIFFERENT  # a constant difference of 1 is far outside +-1% of ~20


def test_holm_runs_over_the_family():
    rng = np.random.default_rng(0)
    base = rng.normal(0, 1, 5)
    family = {k: Paired.of({s: base[s] + shift for s in range(5)}, {s: base[s] for s in range(5)})
              for k, shift in (("clear", 5.0), ("none", 0.0))}
    family["noisy"] = Paired.of({s: base[s] + rng.normal(0.3, 1) for s in range(5)}, {s: base[s] for s in range(5)})
    dec = decide(family, margin=0.03)
    assert dec["clear"].p_holm == pytest.approx(min(1.0, 3 * dec["clear"].p))  # the smallest p times 3
    assert dec["clear"].ci_level == pytest.approx(1 - 0.05 / 3)
    assert all(dec[k].p_holm >= dec[k].p for k in dec)


def test_finals_are_keyed_by_seed():
    runs = {"QK": [qk_run("QK", 3, 50, 3.6), qk_run("QK", 1, 50, 3.6)]}
    assert list(finals(runs, "QK", "mean_pr")) == [3, 1]
