"""Positive ratio quantities decided on per-seed log ratios (research/analysis/rules.py,
docs/decisions.md#ratio-quantities): hand cases whose numbers are known, the margin's equivalence with the old rule,
the refusal of a value of 0 or below, and the outlier mark."""
from __future__ import annotations

import math

import numpy as np
import pytest

from research.analysis import qk_norm
from research.analysis.rules import (DIFFERENCE, DIFFERENT, INCONCLUSIVE, RATIO, RATIO_WHERE_POSITIVE, UNRESOLVED,
                                     WITHIN, NotPositive, Paired, compared_on, decide, log_margin, outliers)
from research.analysis.sequential import Look, decide_at
from research.analysis.stats import t_critical
from research.plots.common import decision_table, per_seed_text
from tests.research.synthetic import qk_runs


def test_a_ratio_comparison_is_the_t_interval_of_the_log_ratios_mapped_back():
    """A / B = 1.1, 1.21, 1 over three seeds: log ratios a, 2a, 0 with a = ln 1.1, mean a, sd a, so the 95% interval is
    a (1 -+ t_2 / sqrt 3) = a (1 -+ 2.4841) and the ratio's 1.1^-1.4841 - 1 = -13.19% to 1.1^3.4841 - 1 = +39.39%."""
    d = decide({"x": Paired.of({0: 110.0, 1: 121.0, 2: 100.0}, {0: 100.0, 1: 100.0, 2: 100.0}, RATIO)}, 0.03)["x"]
    a, half = math.log(1.1), t_critical(2, 0.95) / math.sqrt(3)
    assert half == pytest.approx(2.484138, abs=1e-6)
    assert d.ratio and d.on == RATIO and d.n == 3
    assert d.log_mean == pytest.approx(a) and d.est == d.log_mean and d.sd == pytest.approx(a)
    assert d.ci == pytest.approx((a * (1 - half), a * (1 + half)))
    assert d.rel == pytest.approx(0.1) and d.ci_rel == pytest.approx((math.exp(d.ci[0]) - 1, math.exp(d.ci[1]) - 1))
    assert d.ci_rel == pytest.approx((-0.13190, 0.39386), abs=1e-5)
    assert d.diff == pytest.approx(31 / 3)  # the mean difference stays in units: (10 + 21 + 0) / 3
    assert d.margin == pytest.approx(math.log(1.015 / 0.985)) and d.outcome == INCONCLUSIVE
    assert d.per_seed == pytest.approx((0.1, 0.21, 0.0))


def test_the_log_margin_is_the_old_margin_of_the_pairs_mean_for_exact_ratios():
    """|a - b| <= m (a + b) / 2 exactly when |ln(a / b)| <= ln((1 + m/2) / (1 - m/2)), at, inside and outside it."""
    for m in (0.005, 0.03, 0.1):
        edge = (1 + m / 2) / (1 - m / 2)
        assert log_margin(m) == pytest.approx(2 * math.atanh(m / 2), rel=1e-12) and log_margin(m) == pytest.approx(
            m, rel=m ** 2 / 10)
        for b in (0.3, 98.5, 4e3):
            for r in (edge * (1 - 1e-9), edge * (1 + 1e-9), 1 / edge * (1 + 1e-9), 1 / edge * (1 - 1e-9)):
                a = r * b
                assert (abs(a - b) <= m * (a + b) / 2) == (abs(math.log(a / b)) <= log_margin(m))
    assert abs(101.5 - 98.5) == pytest.approx(0.03 * (101.5 + 98.5) / 2)  # the pair at the 3% margin
    assert math.log(101.5 / 98.5) == pytest.approx(log_margin(0.03), rel=1e-12)


@pytest.mark.parametrize("shift,outcome", [(1 + 1e-4, DIFFERENT), (1.0, UNRESOLVED), (1 - 1e-4, WITHIN)])
def test_a_pair_at_the_margin_reads_the_same_under_the_old_rule_and_the_new(shift, outcome):
    """Three seeds whose A / B is the 3% margin's ratio (times shift), with a spread of 1e-7: just outside the margin
    both rules say beyond it, just inside both say within it, at it both leave the size unresolved."""
    ratio = 1.015 / 0.985 * shift
    b = {s: 100.0 for s in range(3)}
    a = {s: 100.0 * ratio * math.exp(1e-7 * (s - 1)) for s in range(3)}
    old = decide({"x": Paired.of(a, b)}, 0.03)["x"]
    new = decide({"x": Paired.of(a, b, RATIO)}, 0.03)["x"]
    assert not old.ratio and new.ratio
    assert old.outcome == new.outcome == outcome


def test_a_value_of_zero_or_below_is_one_line_naming_the_run_and_the_value():
    with pytest.raises(NotPositive, match=r"^QK's final mean_pr \(seed 1\) is -1, not positive: the quantity is "
                                          r"compared on per-seed log ratios") as e:
        Paired.of({0: 10.0, 1: -1.0}, {0: 5.0, 1: 5.0}, RATIO, ("QK's final mean_pr", "NoQK's final mean_pr"))
    assert "\n" not in str(e.value) and "docs/decisions.md#ratio-quantities" in str(e.value)
    with pytest.raises(NotPositive, match=r"NoQK's final mean_pr \(seed 0\) is 0"):
        Paired.of({0: 10.0, 1: 12.0}, {0: 0.0, 1: 5.0}, RATIO, ("QK's final mean_pr", "NoQK's final mean_pr"))
    runs = qk_runs((50, 45, 40), (3.6, 3.6, 3.6), seeds=3)
    runs["NoQK"][2]["mean_pr"][-1] = 0.0
    with pytest.raises(NotPositive, match=r"^NoQK's final mean_pr \(seed 2\) is 0, not positive"):
        qk_norm.analyze(runs)
    # a value not measured (NaN) leaves its seed out, as it always did: it is not a value of 0 or below
    assert Paired.of({0: 10.0, 1: math.nan, 2: 11.0}, {0: 5.0, 1: 5.0, 2: 5.0}, RATIO).seeds == (0, 2)


def test_attention_entropy_falls_back_to_differences_where_a_value_is_not_positive_and_says_so():
    assert compared_on("entropy") == RATIO_WHERE_POSITIVE
    assert compared_on("pr_sv") == compared_on("mean_pr") == compared_on("norm_mean") == RATIO
    assert compared_on("val_loss") == compared_on("logit_max") == compared_on("sink_mass") == DIFFERENCE
    c = Paired.of({0: 1.2, 1: 0.0, 2: 1.1}, {0: 1.0, 1: 1.0, 2: 1.0}, RATIO_WHERE_POSITIVE, ("up's entropy", "base's"))
    assert c.on == DIFFERENCE and list(c.diffs) == pytest.approx([0.2, -1.0, 0.1])
    assert c.note == "compared by differences, not log ratios: up's entropy (seed 1) is 0"
    d = decide({"x": c}, 0.03)["x"]
    assert not d.ratio and d.note == c.note
    assert c.note + "." in decision_table({"x": d}, 3)
    ok = Paired.of({0: 1.2, 1: 1.3}, {0: 1.0, 1: 1.0}, RATIO_WHERE_POSITIVE)
    assert ok.on == RATIO and ok.note == ""


def test_an_outlier_lies_outside_the_others_prediction_interval():
    """Others -1, 0, 1 (mean 0, sd 1): the bound is t_2(0.99) sqrt(1 + 1/3) = 9.9248 x 1.1547 = 11.460 of their sd."""
    assert t_critical(2, 0.99) * math.sqrt(4 / 3) == pytest.approx(11.4602, abs=1e-4)
    assert outliers([-1.0, 0.0, 1.0, 11.4]) == (False,) * 4
    assert outliers([-1.0, 0.0, 1.0, 11.5]) == (False, False, False, True)
    assert outliers([-1.0, 0.0, 1.0, -11.5]) == (False, False, False, True)
    assert outliers([0.0, 100.0, 0.1]) == (False,) * 3  # three values: no others' spread to judge by
    # five seeds: others 1.0, 1.1, 0.9, 1.0 (mean 1, sd 0.0816); t_3(0.99) sqrt(5/4) = 6.530: 5.0 lies 49 sd off
    assert outliers([1.0, 1.1, 0.9, 1.0, 5.0]) == (False, False, False, False, True)
    rng = np.random.default_rng(0)  # under normal values each is marked with probability exactly 1%
    marked = np.mean([outliers(rng.normal(size=6))[0] for _ in range(20000)])
    assert marked == pytest.approx(0.01, abs=3 * math.sqrt(0.01 * 0.99 / 20000))


def test_the_per_seed_column_marks_the_outlier_and_the_table_says_what_the_mark_means():
    b = {s: 100.0 for s in range(5)}
    a = {s: 100.0 * v for s, v in enumerate((0.95, 0.96, 0.94, 0.95, 0.75))}
    d = decide({("A", "B"): Paired.of(a, b, RATIO)}, 0.03)[("A", "B")]
    assert d.outliers == (False, False, False, False, True)
    assert per_seed_text(d, 2) == "-5.0%, -4.0%, -6.0%, -5.0%, -25.0%\u2020"
    rows = decision_table({("A", "B"): d}, 2, lambda k: f"{k[0]} \u2212 {k[1]}")
    assert rows[0].startswith("| comparison | n | mean difference | ratio \u2212 1 | CI of ratio \u2212 1 (level) |")
    assert rows[2].endswith("| -5.0%, -4.0%, -6.0%, -5.0%, -25.0%\u2020 |")
    note = "\u2020 outlier: a seed whose value lies outside the 99% prediction interval"
    assert any(r.startswith(note) for r in rows)
    same = decide({"x": Paired.of(a, b)}, 0.03)["x"]  # differences: the column is in units
    assert per_seed_text(same, 2) == "-5.00, -4.00, -6.00, -5.00, -25.00\u2020"


def test_a_look_at_fewer_seeds_keeps_the_log_ratios_and_the_differences_of_its_seeds():
    """A study decided over two looks: the first look's ratio comparison is on its own seeds, in both scales."""
    a = {s: 100.0 * (1.1 + 0.01 * s) for s in range(6)}
    b = {s: 100.0 for s in range(6)}
    c = Paired.of(a, b, RATIO)
    early = c.keep(np.array([s < 4 for s in range(6)]))
    assert early.seeds == (0, 1, 2, 3) and early.raw == pytest.approx([10.0, 11.0, 12.0, 13.0])
    assert early.diffs == pytest.approx(np.log([1.1, 1.11, 1.12, 1.13]))
    d = decide_at({"x": c}, [Look((0, 1, 2, 3), 0.02), Look(tuple(range(6)), 0.03)])["x"]
    assert d.ratio and d.diff == pytest.approx(12.5) and d.outcome == DIFFERENT
