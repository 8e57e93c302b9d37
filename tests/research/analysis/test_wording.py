"""Issue 64, items 4 and 5: sentences no stronger than their numbers, each rule on a hand case. Intervals printed with
the digits that keep both ends on their side of 0 and of the margin; two outcomes said to disagree only when they
differ in kind; a claim over conditions naming each condition's own outcome; a fall as a share of where it started;
a margin that cannot be missed marked as such."""
from __future__ import annotations

import math

from research.analysis.rules import Decision, effect_text, interval_text, outcome_of, sides_digits
from research.plots.common import decided_text, decision_table, fmt_ci


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
