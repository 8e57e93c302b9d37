"""research/analysis/rules.py: the decision procedure on seed sets whose answer is known."""
from __future__ import annotations

import math

import numpy as np
import pytest

from research.analysis.rules import (DESCRIPTIVE, DIFFERENT, EQUAL, INCONCLUSIVE, NO_DATA, NO_SPREAD, UNRESOLVED,
                                     WITHIN, Margin, Paired, decide, finals, outcome_of, k_of)
from research.analysis.wording import OPEN, needed_text, settle_line, untested_text
from research.analysis.stats import t_critical
from tests.research.synthetic import qk_run


def one(a: dict, b: dict, margin: float = 0.03):
    return decide({"x": Paired.of(a, b)}, margin)["x"]


def test_a_wide_spread_is_inconclusive_never_equal():
    """A = {20, 40} vs B = {29, 31}: same mean, but two seeds this far apart decide nothing."""
    d = one({0: 20.0, 1: 40.0}, {0: 29.0, 1: 31.0})
    assert d.outcome == INCONCLUSIVE and d.diff == 0.0 and d.n == 2


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
    """Per-seed differences remove what each seed shares between conditions: here all of the spread but 0.01."""
    a = {0: 10.0, 1: 20.0, 2: 30.0}
    b = {2: 29.01, 0: 9.0, 1: 18.99, 7: 99.0}  # seed 7 has no partner and is left out
    d = one(a, b, margin=0.01)
    assert d.n == 3 and d.diff == pytest.approx(1.0) and d.sd == pytest.approx(0.01)
    assert d.outcome == DIFFERENT  # 1 +- 0.025 (t(2, 0.975) 4.303 x 0.01 / sqrt 3) is far outside +-1% of ~20


def test_bonferroni_over_the_testable_members_of_the_family():
    rng = np.random.default_rng(0)
    base = rng.normal(0, 1, 5)
    wobble = rng.normal(0, 0.1, 5)
    family = {k: Paired.of({s: base[s] + shift + wobble[s] for s in range(5)}, {s: base[s] for s in range(5)})
              for k, shift in (("clear", 5.0), ("none", 0.0))}
    family["noisy"] = Paired.of({s: base[s] + rng.normal(0.3, 1) for s in range(5)}, {s: base[s] for s in range(5)})
    family["one seed"] = Paired.of({0: 1.0}, {0: 2.0})  # not testable: not counted in k
    dec = decide(family, margin=0.03)
    assert all(dec[k].ci_level == pytest.approx(1 - 0.05 / 3) for k in ("clear", "none", "noisy"))
    assert all(dec[k].p_adj == pytest.approx(min(1.0, 3 * dec[k].p)) for k in ("clear", "none", "noisy"))


def test_a_difference_with_no_spread_is_said_as_such_not_decided_and_not_counted():
    """Integer values 5, 7, 9 against 3, 5, 7: every seed differs by exactly 2. The old rule read the zero-width
    interval [2, 2] as "different, beyond the margin"; now no interval is read, and the family's k counts only the
    comparison that has one (so the noisy one is at 95%, not 97.5%)."""
    family = {"flat": Paired.of({0: 5, 1: 7, 2: 9}, {0: 3, 1: 5, 2: 7}),
              "noisy": Paired.of({0: 1.0, 1: 2.0, 2: 3.5}, {0: 0.0, 1: 0.0, 2: 0.0})}
    assert k_of(family) == 1
    dec = decide(family, margin=0.03)
    flat = dec["flat"]
    assert (flat.outcome, flat.n, flat.diff, flat.sd) == (NO_SPREAD, 3, 2.0, 0.0)
    assert not (flat.tested or flat.decided or flat.differs or flat.same) and all(map(math.isnan, flat.ci))
    assert untested_text(flat, 0) == "no spread: every seed differs by exactly +2"
    assert dec["noisy"].ci_level == 0.95 and dec["noisy"].p_adj == dec["noisy"].p
    # 0.3 - 0.1 and 1.3 - 1.1 differ in their last bits: rounding is no spread either
    rounded = decide({"x": Paired.of({0: 0.3, 1: 1.3, 2: 2.3}, {0: 0.1, 1: 1.1, 2: 2.1})})["x"]
    assert rounded.outcome == NO_SPREAD and rounded.diff == pytest.approx(0.2)
    assert untested_text(one({0: 1.0}, {0: 0.0})) == "one seed (descriptive, no test)"
    assert untested_text(one({0: 1.0}, {1: 0.0})) == "no paired values (no seed with both values)"


def test_an_absolute_margin_for_values_near_zero():
    """A largest logit going from -0.05 to +0.05 (differences 0.10, 0.11, 0.09: mean 0.1, sd 0.01; t(2, 0.975) =
    4.303, so [0.075, 0.125]). As a share of the mean of |values| (0.05) the 3% margin is 0.0015 and the interval
    lies "beyond" it (the review's "+200% beyond the margin"); against 0.25 logits it is a real difference inside
    the margin."""
    a, b = {0: 0.05, 1: 0.06, 2: 0.04}, {0: -0.05, 1: -0.05, 2: -0.05}
    share = one(a, b)
    assert share.margin == pytest.approx(0.0015) and share.outcome == DIFFERENT and share.share == 0.03
    logits = decide({"x": Paired.of(a, b)}, Margin(0.25, absolute=True))["x"]
    assert logits.ci == pytest.approx((0.1 - 0.02484, 0.1 + 0.02484), abs=1e-5)
    assert (logits.margin, logits.share, logits.outcome) == (0.25, None, WITHIN)


def test_a_family_part_of_a_larger_one_takes_its_size():
    """Two quantities read as one family of 6 comparisons: each interval at 1 - 0.05/6, p times 6."""
    d = decide({"x": Paired.of({0: 1.0, 1: 2.0, 2: 3.5}, dict.fromkeys(range(3), 0.0))}, k=6)["x"]
    assert d.ci_level == pytest.approx(1 - 0.05 / 6) and d.p_adj == pytest.approx(min(1.0, 6 * d.p))
    assert d.ci[1] - d.diff == pytest.approx(t_critical(2, 1 - 0.05 / 6) * d.sd / math.sqrt(3))


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


def test_an_undecided_outcome_names_what_would_settle_it_with_no_number():
    """More seeds added to a finished study are a look nobody planned: the one line a report gives under In short names
    a new study on new seeds only, and the error a reader of both reports then faces (the two levels added); every
    open outcome carries its mark."""
    open_ = one({0: 20.0, 1: 40.0}, {0: 29.0, 1: 31.0})
    assert needed_text(open_) == OPEN == "\u2021"
    assert settle_line() == ("\u2021 open at these seeds; to settle it: a new study on new seeds (no run of this one "
                             "trained again), decided on its own or planned with --until_decided from its start; read "
                             "with this one, some outcome of the two is wrong with probability at most 10%, their "
                             "levels added (docs/decisions.md#sequential-studies).")
    assert settle_line("batch") == ("\u2021 open at these batches; to settle it: a replication on new batches "
                                    "decided on its own; read with this one, some outcome of the two is wrong with "
                                    "probability at most 10%, their levels added "
                                    "(docs/decisions.md#sequential-studies).")
    settled = one({s: 110.0 + 0.01 * s for s in range(4)}, {s: 100.0 for s in range(4)})
    assert settled.outcome == DIFFERENT and needed_text(settled) == ""
