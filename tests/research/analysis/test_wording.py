"""Issue 64, items 4 and 5: sentences no stronger than their numbers, each rule on a hand case. Intervals printed with
the digits that keep both ends on their side of 0 and of the margin; two outcomes said to disagree only when they
differ in kind; a claim over conditions naming each condition's own outcome; a fall as a share of where it started;
a margin that cannot be missed marked as such."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from research.analysis import qk_norm
from research.analysis.dips import course_text, fall_rise_text
from research.analysis.rules import Decision, outcome_of
from research.analysis.wording import conflict, effect_text, interval_text, rule_text, settles_text, sides_digits
from research.plots.common import decided_text, decision_table, fmt_ci
from research.plots.qk_norm_report import _pr_agreement
from tests.research.synthetic import qk_runs


def hand(diff: float, lo: float, hi: float, margin: float, scale: float = 1.0, n: int = 4) -> Decision:
    """A Decision with this difference and interval against +-margin (in the quantity's units), as a family of one
    with values near `scale`."""
    return Decision(n, scale + diff, scale, diff, 1.0, (lo, hi), 0.95, math.nan, math.nan, margin, scale,
                    outcome_of(lo, hi, margin), margin / scale)


def test_an_interval_is_printed_with_the_digits_that_keep_its_ends_on_their_side_of_the_margin():
    """The audit's '+0.5% [+0.5%, +0.6%] size unresolved': a lower end of 0.45% against a margin of 0.5% printed at
    one decimal sits on the margin. It takes two decimals, the estimate with them; an interval that needs no more
    keeps one."""
    d = hand(0.005, 0.00452, 0.0056, margin=0.005)
    assert d.outcome == "different, size unresolved"
    assert effect_text(d) == "+0.50% [+0.45%, +0.56%]"
    assert effect_text(hand(-0.049, -0.078, -0.021, margin=0.03)) == "-4.9% [-7.8%, -2.1%]"  # needs no more
    # an end a hair above 0 never prints as 0 (its interval excludes 0), nor one a hair inside the margin on it
    assert effect_text(hand(0.01, 0.0003, 0.0197, margin=0.03)) == "+1.00% [+0.03%, +1.97%]"
    assert effect_text(hand(0.01, 0.0002, 0.029996, margin=0.03)) == "+1.0000% [+0.0200%, +2.9996%]"
    # in the quantity's units: ends of +0.2831 against a margin of 0.2829 (3% of 9.43) take four decimals
    u = hand(0.5, 0.2831, 0.7169, margin=0.2829, scale=9.43)
    assert interval_text(u, 3) == ("+0.5000", "[+0.2831, +0.7169]") and u.outcome == "different, beyond the margin"
    assert fmt_ci(u, 3) == "[+0.2831, +0.7169] (95.0%)"
    assert decided_text(u, 3).startswith("+0.5000 [+0.2831, +0.7169] (95.0%), ")
    row = decision_table({"x": d}, 4)[2].split(" | ")
    assert row[2:6] == ["+0.0050", "[+0.0045, +0.0056] (95.0%)", "+0.50%", "[+0.45%, +0.56%]"]
    # the rule itself: the fewest decimals at which every value lies on its own side of every threshold
    assert sides_digits([0.451, 0.549], [0.0, 0.5, -0.5], 1) == 2
    assert sides_digits([0.4], [0.0, 0.5], 1) == 1 and sides_digits([0.5], [0.5], 1) == 1  # equal prints equal


def test_two_outcomes_disagree_only_when_they_differ_in_kind():
    """The audit's pr_sv -4.9% [-7.8, -2.1] (real, size unresolved) against pr_var -5.6% [-11.4, +0.2]
    (inconclusive): overlapping intervals, one real and the other open; no disagreement. One beyond the margin and
    the other inside it, or opposite signs both real, is one."""
    sv, var = hand(-0.049, -0.078, -0.021, 0.03), hand(-0.056, -0.114, 0.002, 0.03)
    assert (sv.outcome, var.outcome) == ("different, size unresolved", "inconclusive")
    assert conflict(sv, var) == "" and settles_text(sv) == "real (negative), its size unresolved"
    beyond, inside = hand(-0.05, -0.07, -0.035, 0.03), hand(-0.01, -0.02, 0.005, 0.03)
    assert conflict(beyond, inside) == "one lies beyond the margin, the other inside it" == conflict(inside, beyond)
    assert conflict(beyond, hand(0.05, 0.035, 0.07, 0.03)) == "both are real, with opposite signs"
    assert conflict(hand(0.01, 0.005, 0.02, 0.03), hand(-0.01, -0.02, -0.005, 0.03)) != ""  # both real, inside
    assert conflict(inside, hand(-0.01, -0.015, -0.005, 0.03)) == ""  # equal and real-within: both inside
    assert conflict(beyond, hand(-0.04, -0.06, -0.01, 0.03)) == ""  # beyond, and real of unresolved size


def test_the_report_says_disagree_only_for_a_difference_in_kind():
    a = qk_norm.analyze(qk_runs((50, 40, 40), (3.6, 3.6, 3.6)))
    ab, bc, ac = qk_norm.PAIRS

    def with_pr(sv: dict, var: dict):
        d = dict(a.decisions)
        d["mean_pr"], d["mean_pr_var"] = {**a.decisions["mean_pr"], **sv}, {**a.decisions["mean_pr_var"], **var}
        return dataclasses.replace(a, decisions=d)
    same = a.decisions["mean_pr"]
    audit = with_pr({ab: hand(-0.049, -0.078, -0.021, 0.03)}, {**same, ab: hand(-0.056, -0.114, 0.002, 0.03)})
    text = _pr_agreement(audit)
    assert "They disagree" not in text and audit.pr_disagreements == [] and audit.pr_differences == [ab]
    assert ("Their outcomes differ without disagreeing, one settling what the other leaves open, on A \u2212 B: "
            "pr_sv -4.9% [-7.8%, -2.1%] is real (negative), its size unresolved; pr_var -5.6% [-11.4%, +0.2%] is "
            "open: neither its sign nor its size is settled.") in text
    one_open = with_pr({ab: hand(-0.05, -0.07, -0.035, 0.03)}, {**same, ab: hand(-0.056, -0.114, 0.002, 0.03)})
    assert "A \u2212 B: pr_sv is decided and pr_var is open (pr_sv -5.0% [-7.0%, -3.5%] is beyond the margin " \
           "(negative); pr_var" in _pr_agreement(one_open)
    kinds = with_pr({ab: hand(-0.05, -0.07, -0.035, 0.03)}, {**same, ab: hand(-0.01, -0.02, 0.005, 0.03)})
    assert kinds.pr_disagreements == [ab]
    assert ("They disagree (their outcomes differ in kind) on A \u2212 B (pr_sv -5.0% [-7.0%, -3.5%] is beyond the "
            "margin (negative); pr_var -1.0% [-2.0%, +0.5%] is inside the margin: one lies beyond the margin, the "
            "other inside it).") in _pr_agreement(kinds)
    agree = with_pr({}, dict(same))
    assert _pr_agreement(agree).endswith("Here the two reach the same outcome on every pair tested in both.")


def test_a_claim_over_conditions_names_each_conditions_own_outcome():
    """Claim (d) fails when one condition is not U-shaped; its line says which did what, never one word for all:
    QK still falls at the end, QK_frozen and NoQK fall and recover."""
    runs = qk_runs((50, 40, 40), (3.6, 3.6, 3.6))
    runs["QK"] = qk_runs((50, 40, 40), (3.6, 3.6, 3.6), shape="mono")["QK"]
    d = qk_norm.analyze(runs).claims["d"]
    assert d.status == "fails"
    assert d.text.startswith(
        "QK: falls; still falls at the end, below the chosen probe (tested on 2 seeds; the rise measured over the last "
        "142,858 tokens); QK_frozen: falls and recovers (tested on 2 seeds; the rise measured over 714,286 tokens); "
        "NoQK: falls and recovers (")
    flat = hand(0.1, -2.0, 2.2, 1.0)
    assert course_text(flat, flat) == "open (neither its fall nor its recovery is settled)"
    assert course_text(hand(10.0, 8.0, 12.0, 1.0), flat) == "falls; its recovery is open"
    assert course_text(hand(0.2, -0.5, 0.6, 1.0), hand(5.0, 4.0, 6.0, 1.0)) == \
        "does not fall beyond the margin; recovers"


def test_a_fall_is_a_share_of_where_it_started_and_a_rise_of_the_low():
    """PR halving from 50 to 25 and back to 30: the fall, 25, is +50% of the start (the old text: +100%, a share
    of the low it fell to); the rise, 5, is +20% of the low it rises from."""
    fall = hand(25.0, 24.0, 26.0, 0.75, scale=25.0)  # the margin a share of the low (3% of 25), as dips decides it
    rise = hand(5.0, 4.0, 6.0, 0.75, scale=25.0)
    assert effect_text(fall) == "+100.0% [+96.0%, +104.0%]"  # the share of the low, no longer printed for a fall
    assert fall_rise_text(fall, rise, 50.0) == ("+50.0% [+48.0%, +52.0%] of the start",
                                                "+20.0% [+16.0%, +24.0%] of the low")
    text = qk_norm.analyze(qk_runs((50, 40, 40), (3.6, 3.6, 3.6))).claims["d"].text
    assert "80.0 \u2192 32.4 at 0.286M tokens" in text and "fall +47.6 (+59.5% [" in text  # 47.6 of 80, not of 32.4


def test_a_margin_of_more_than_ten_times_the_values_is_marked_as_one_that_cannot_be_missed():
    """Shaped like the key-cache study's 4-bit costs: each condition's loss change a share of 0.0001-0.0002 of the
    loss, against the old margin of +-0.005 (--loss_margin as an absolute share), 25 times the larger value: "equal"
    was all it could say. The report line and the table mark it; at the key cache's own margin, 0.001 (5 times the
    values), nothing is marked. A margin that is a share of the compared values' mean never is."""
    from research.analysis.conditions import ConditionRuns, analyze
    from research.analysis.wording import unmissable, unmissable_text
    from research.plots.conditions import in_short, report
    from tests.research.analysis.test_kv_quantities import kv_run
    costs = {"QK": (0.0001, 0.00015, 0.0002), "NoQK": (0.0002, 0.00008, 0.00012)}
    runs = {c: [kv_run(c, s, loss_4bit=4.0 * (1 + x)) for s, x in enumerate(xs)] for c, xs in costs.items()}
    old = analyze(ConditionRuns(runs, "QK", ("kv_loss_4bit",), kv_loss_margin=0.005), 0.03, 0.005)
    d = old.decisions["kv_loss_4bit"][("NoQK", "QK")]
    assert d.outcome == "equal" and unmissable(d)
    assert unmissable_text(d) == ("a margin that cannot be missed: \u00b10.0050 is over 10 times the larger value "
                                  "compared (0.0002)")
    text = "\n".join([*in_short(old), report(old)])
    line = next(x for x in text.splitlines() if x.startswith("- NoQK \u2212 QK: "))
    assert "(a margin that cannot be missed: \u00b10.0050 is over 10 times" in line
    assert text.count("a margin that cannot be missed") == 2  # the "In short" line and the table's margin cell
    new = analyze(ConditionRuns(runs, "QK", ("kv_loss_4bit",)), 0.03, 0.005)
    assert not unmissable(new.decisions["kv_loss_4bit"][("NoQK", "QK")])
    assert "cannot be missed" not in report(new)
    assert not unmissable(hand(0.0001, -0.0004, 0.0006, margin=0.03 * 0.0002, scale=0.0002))  # a share: never
    table = decision_table({"x": dataclasses.replace(d, share=None)}, 4)[2]
    # then the per-seed column: NoQK - QK per seed, +0.0001, -0.00007 and -0.00008
    assert table.endswith("| equal (a margin that cannot be missed: \u00b10.0050 is over 10 times the larger value "
                          "compared (0.0002)) | +0.0001, -0.0001, -0.0001 |")


def test_the_spike_studys_excess_over_chance_is_printed_on_its_side_of_the_bound():
    """"does not warn" says the hit rate's excess over chance is shown below 0.25; a t bound of 0.2496 printed at
    two decimals read "0.25". It prints as 0.2496, and an interval's ends keep their side of 0 and of 0.25."""
    from research.analysis.spikes import Interval, ci_text, near_bound
    assert (near_bound(0.2496), near_bound(0.2), near_bound(math.nan)) == ("0.2496", "0.20", "n/a")
    assert ci_text(Interval(0.1, -0.0004, 0.2501, 3), near=True) == "0.1000 [-0.0004, 0.2501]"
    assert ci_text(Interval(0.1, -0.0004, 0.2501, 3)) == "0.10 [-0.00, 0.25]"  # other intervals read no bound
    assert "\u00b12.5% of the compared values' mean" in rule_text(0.025)  # a margin printed as it is, never "3%"


# ---------------------------------------------------------------------------------- merged with the log ratios (i64)

def ratio_hand(lo: float, hi: float, diff: float = 0.05, share: float = 0.03, n: int = 4) -> Decision:
    """A Decision taken on log ratios whose ratio minus 1 has the interval [lo, hi] (the log interval [ln(1 + lo),
    ln(1 + hi)], its estimate the midpoint of the logs) against +-share of the pair's mean (rules.log_margin), with
    the mean difference `diff` in units: the scale the decision was taken on is not the one it is printed on."""
    from research.analysis.rules import RATIO, log_margin
    a, b, m = math.log1p(lo), math.log1p(hi), log_margin(share)
    return Decision(n, 1.0 + diff, 1.0, diff, 0.01, (a, b), 0.95, 0.01, 0.01, m, 1.0 + diff / 2, outcome_of(a, b, m),
                    share, on=RATIO, log_mean=(a + b) / 2)


def test_a_ratio_interval_is_printed_on_its_side_of_the_margins_printed_bounds():
    """A ratio decision prints its ratio minus 1, exp(lo) - 1 to exp(hi) - 1, against the margin's printed bounds
    exp(-+m) - 1 with m = ln(1.015 / 0.985): -2.956% and +3.046%, not +-3%. A lower end of +2.95% lies inside the
    upper bound +3.05%: it prints below it (at one decimal '+2.9%' against '+3.0%'). One of +3.0454% lies inside too
    (the bound is +3.04569%): at two decimals both read '+3.05%', so it takes three, '+3.045%' against '+3.046%' (a
    rule reading the margin as a symmetric +-3% would stop at two). An upper end of -2.960% lies beyond the lower
    bound -2.9557%: at two decimals both read '-2.96%', at three '-2.960%' against '-2.956%'."""
    from research.analysis.wording import interval_digits, margin_bounds
    lo, hi = margin_bounds(ratio_hand(0.0295, 0.08))
    assert (lo, hi) == (math.expm1(-ratio_hand(0.0295, 0.08).margin), math.expm1(ratio_hand(0.0295, 0.08).margin))
    assert (f"{lo:.3%}", f"{hi:.3%}") == ("-2.956%", "3.046%")
    brief = ratio_hand(0.0295, 0.08)
    assert brief.outcome == "different, size unresolved"
    est, ci = interval_text(brief, 3)  # the units' decimals say nothing of a ratio: at least one percent decimal
    assert ci == "[+2.9%, +8.0%]" and float(ci[1:5]) < float(f"{hi * 100:.1f}")
    hair = ratio_hand(0.030454, 0.08)
    assert hair.outcome == "different, size unresolved" and interval_digits(hair, 1) == 3
    # the estimate sqrt(1.030454 x 1.08) - 1 = +5.4936%, at the interval's decimals
    assert effect_text(hair) == "+5.494% [+3.045%, +8.000%]" and f"{hi:.3%}" == "3.046%"
    below = ratio_hand(-0.08, -0.0296)
    assert below.outcome == "different, beyond the margin"
    assert effect_text(below) == "-5.514% [-8.000%, -2.960%]"
    # the table and the sentences print the same ends, whatever the units' decimals
    assert fmt_ci(hair, 2) == "ratio [+3.045%, +8.000%] (95.0%)"
    row = decision_table({"x": hair}, 2)[2].split(" | ")
    assert row[2:5] == ["+0.05", "+5.494%", "[+3.045%, +8.000%] (95.0%)"]  # mean difference | ratio - 1 | its CI
    assert decided_text(below, 3).startswith("+0.050 mean difference; ratio -5.514% [-8.000%, -2.960%] (95.0%)")
    # every end near a bound, on both sides: printed at the chosen decimals, on its side of 0 and of both bounds
    for end in np.linspace(0.0300, 0.0310, 41):
        for d, x in ((ratio_hand(end, 0.08), end), (ratio_hand(-0.08, -end), -end)):
            n = interval_digits(d, 1)
            shown = float(f"{x * 100:.{n}f}")
            for t in (0.0, lo, hi):
                assert np.sign(shown - float(f"{t * 100:.{n}f}")) == np.sign(x - t), (x, t, n)


def test_a_ratio_fall_prints_as_a_share_of_its_start_from_the_interval_that_decided_it():
    """A fall decided on ln(y0 / y*) prints as 1 - y*/y0, a share of the start, each end mapped from the log interval:
    log ratios [ln 2, ln 4] read [+50.0%, +75.0%] of the start (a ratio y0/y* - 1 of +100% to +300%); the margin's
    bounds on that scale are 1 - exp(+-m), -3.05% and +2.96%. The rise ln(y_end / y*) prints as y_end/y* - 1."""
    from research.analysis.rules import RATIO, log_margin
    from research.analysis.wording import margin_bounds
    m = log_margin(0.03)
    fall = Decision(2, 80.0, 30.0, 50.0, 0.1, (math.log(2), math.log(4)), 0.99, 0.01, 0.01, m, 55.0,
                    outcome_of(math.log(2), math.log(4), m), 0.03, on=RATIO, log_mean=math.log(8) / 2)
    rise = ratio_hand(0.2, 0.6)
    assert fall_rise_text(fall, rise, 80.0) == ("+64.6% [+50.0%, +75.0%] of the start",
                                                "+38.6% [+20.0%, +60.0%] of the low")
    assert effect_text(fall) == "+182.8% [+100.0%, +300.0%]"  # the same decision as a ratio minus 1
    assert [f"{x:.2%}" for x in margin_bounds(fall, first=True)] == ["-3.05%", "2.96%"]


def test_a_ratio_decisions_sign_is_its_log_means_and_its_margin_is_never_unmissable():
    """Seeds with A = 1 and 100, B = 2 and 90: log ratios ln 0.5 and ln(100/90), mean -0.29, while the mean
    difference in units is +4.5. The sign that settles (settled, conflict, settles_text) is the log mean's, the one
    the interval is about: against a real positive difference it conflicts; against a real negative one it does not.
    A ratio's margin is a share, on the log ratio: never one that cannot be missed, however small the values."""
    from research.analysis.rules import RATIO, log_margin
    from research.analysis.wording import settled, unmissable
    m = log_margin(0.03)
    neg = Decision(2, 50.5, 46.0, 4.5, 0.5, (-0.5, -0.1), 0.95, 0.01, 0.01, m, 48.25, outcome_of(-0.5, -0.1, m), 0.03,
                   on=RATIO, log_mean=-0.29)
    assert (neg.diff > 0, neg.est < 0, settled(neg)) == (True, True, (-1, "beyond"))
    assert settles_text(neg) == "beyond the margin (negative)"
    assert conflict(neg, hand(0.05, 0.035, 0.07, 0.03)) == "both are real, with opposite signs"
    assert conflict(neg, hand(-0.05, -0.07, -0.035, 0.03)) == ""
    inside = ratio_hand(-0.01, 0.01)
    assert inside.outcome == "equal" and conflict(neg, inside) == "one lies beyond the margin, the other inside it"
    assert conflict(ratio_hand(0.04, 0.08), ratio_hand(0.01, 0.06)) == ""  # beyond, and real of unresolved size
    assert conflict(ratio_hand(0.04, 0.08), ratio_hand(-0.08, -0.04)) == "both are real, with opposite signs"
    tiny = dataclasses.replace(ratio_hand(-0.01, 0.01), mean_a=1e-6, mean_b=1e-6, share=None)
    assert not unmissable(tiny) and not unmissable(ratio_hand(-0.01, 0.01))


def test_a_pretrained_verdict_on_a_ratio_gives_no_size_in_units_against_its_side():
    """Batches with A = 1 (five times) and 100, B = 2 (five times) and 90: the log ratios say A is shorter (mean
    -0.56, beyond the margin), while the mean difference in units is +0.83. The phrase's side is the ratio's, so its
    size must be the ratio's too: 'shorter than ... by 0.83' would read a positive difference as a shortfall."""
    from research.analysis.rules import RATIO, Paired, decide
    from research.plots.pretrained_report import _against
    a, b = {i: 1.0 for i in range(5)} | {5: 100.0}, {i: 2.0 for i in range(5)} | {5: 90.0}
    d = decide({"x": Paired.of(a, b, on=RATIO)}, 0.03)["x"]
    assert d.outcome == "different, beyond the margin" and d.est < 0 < d.diff
    text = _against(d, "sqrt(d_head)", "longer than", "shorter than", 0.03)
    assert text.startswith("shorter than sqrt(d_head), beyond") and "0.83" not in text and "ratio -42.9%" in text
