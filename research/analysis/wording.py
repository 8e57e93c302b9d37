"""How a decision is said in words (docs/decisions.md): the digits an interval needs against 0 and its margin, what an
outcome settles and when two outcomes disagree, a margin that cannot be missed, what would settle an open question
(and the error a reader of both reports faces), and the procedure in one paragraph for reports. research.analysis.rules
decides; this module only says what it decided, so every report words the same decision the same way.

A study read at several looks (research.analysis.sequential) speaks of its looks through a Reading (reading_with):
its intervals in the procedure's paragraph and its route to settle an open question.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from research.analysis.rules import (ALPHA, DESCRIPTIVE, DIFFERENT, EQUAL, INCONCLUSIVE, MARGIN, NO_DATA, NO_SPREAD,
                                     RATIOS, SEQUENTIAL, UNRESOLVED, WITHIN, Decision)


@dataclass(frozen=True)
class Reading:
    """How a study that looked at its seeds more than once reads its decisions in words
    (research.analysis.sequential.reading): its intervals in the procedure's paragraph (rule_text), and what would
    settle an open question (needed_text, settle_line)."""

    settle: str
    intervals: str | None = None  # None: one Bonferroni interval per comparison, as rule_text says without looks


_READING: contextvars.ContextVar[Reading | None] = contextvars.ContextVar("reading", default=None)


@contextlib.contextmanager
def reading_with(reading: Reading) -> Iterator[None]:
    """Within the block rule_text and needed_text speak of the looks as `reading` says."""
    token = _READING.set(reading)
    try:
        yield
    finally:
        _READING.reset(token)


def untested_text(d: Decision, decimals: int = 3, unit: str = "seed") -> str:
    """Why a comparison has no interval, in words: 'one seed (descriptive, no test)', 'no paired values' or 'no
    spread: every seed differs by exactly +2.000'; '' for a tested one."""
    same = f"has the same ratio, {d.rel:+.{max(decimals - 2, 1)}%}" if d.ratio else \
        f"differs by exactly {d.diff:+.{decimals}f}"
    return {NO_DATA: f"{NO_DATA} (no {unit} with both values)", DESCRIPTIVE: f"one {unit} (descriptive, no test)",
            NO_SPREAD: f"{NO_SPREAD}: every {unit} {same}"}.get(d.outcome, "")


def sides_digits(values, thresholds, decimals: int, percent: bool = False, most: int = 5) -> int:
    """The fewest decimals, at least `decimals`, at which every finite value prints on the side of every finite
    threshold it lies on, the threshold printed at the same decimals (a value equal to one prints equal to it): an
    interval's ends against 0 and the margin. A lower end of 0.45% against a margin of 0.5% prints '+0.5%' at one
    decimal, on the margin; at two, '+0.45%'. `percent`: values and thresholds are shares, printed as percentages.
    At most decimals + most (values a hair from a threshold). A threshold printed at more decimals than these keeps
    every value on its side too (a value printed below it at n decimals is below it at n' > n)."""
    def shown(x: float, n: int) -> float:
        return float(f"{x * 100 if percent else x:.{n}f}")
    pairs = [(float(v), float(t)) for v in values for t in thresholds if math.isfinite(v) and math.isfinite(t)]
    for n in range(decimals, decimals + most):
        if all(np.sign(shown(v, n) - shown(t, n)) == np.sign(v - t) for v, t in pairs):
            return n
    return decimals + most


# The fewest decimals of a ratio minus 1 printed in %: a comparison decided on log ratios has no interval in units,
# so the units' decimals a report passes say nothing about it
RATIO_DECIMALS = 1


def printed(d: Decision, of: float | None = None, first: bool = False) -> tuple[Callable[[float], float], bool]:
    """How a Decision's values on the scale it was decided on (its estimate, its interval's ends, 0 and +-margin) are
    printed: (f, percent), f(0) = 0 and f increasing (for a positive `of`), so an end and a bound keep their order;
    interval_digits then reads the sides on the printed values themselves. Decided on differences: in the quantity's
    units, or with `of` as shares of `of` (percent). Decided on log ratios (Decision.ratio): the ratio minus 1,
    exp(x) - 1, a share of the second value compared (B); with `first` 1 - exp(-x), a share of the first (A: a fall
    ln(y0 / y*) as a share of where it started, 1 - y* / y0); `of` does not apply, a ratio's share being of one of its
    own sides. The margin +-m prints as exp(+-m) - 1, asymmetric (-2.96% to +3.05% for 3% of the pair's mean)."""
    if d.ratio:
        return ((lambda x: -math.expm1(-x)) if first else math.expm1), True
    if of is None:
        return (lambda x: x), False
    return (lambda x: x / of if of else math.nan), True


def interval_digits(d: Decision, decimals: int, of: float | None = None, first: bool = False) -> int:
    """The decimals an interval of d needs (sides_digits: both printed ends on their side of 0 and of both printed
    bounds of the margin; the estimate is printed at the same decimals), on the scale `printed` gives: `decimals`
    counts the units' decimals, or with `of` the percentage's; a ratio's percentage takes at least RATIO_DECIMALS
    unless `of` or `first` asks for a share at `decimals`."""
    f, percent = printed(d, of, first)
    least = RATIO_DECIMALS if d.ratio and of is None and not first else decimals
    points = [f(x) if math.isfinite(x) else math.nan for x in (*d.ci, 0.0, -d.margin, d.margin)]
    return sides_digits(points[:2], points[2:], least, percent=percent)


def signed(x: float, decimals: int, percent: bool = False) -> str:
    """'+1.25' or, as a share, '+1.25%'."""
    return f"{x:+.{decimals}%}" if percent else f"{x:+.{decimals}f}"


def interval_text(d: Decision, decimals: int, of: float | None = None, first: bool = False) -> tuple[str, str]:
    """(estimate, '[lo, hi]') of a tested Decision as printed (`printed`: in the quantity's units, as percentages of
    `of`, or for one decided on log ratios its ratio minus 1 in %), with the decimals its interval needs against 0
    and the margin's printed bounds (interval_digits). The one formatter of an interval read against a margin: every
    report prints its intervals with it or with effect_text, which uses it, whichever scale the decision was taken
    on."""
    f, percent = printed(d, of, first)
    n = interval_digits(d, decimals, of, first)
    lo, hi = (f(x) if math.isfinite(x) else math.nan for x in d.ci)
    return signed(f(d.est), n, percent), f"[{signed(lo, n, percent)}, {signed(hi, n, percent)}]"


def margin_bounds(d: Decision, of: float | None = None, first: bool = False) -> tuple[float, float]:
    """The margin's bounds as `printed` prints them (shares, not yet times 100): (-m, +m) in units, or a ratio's
    (exp(-m) - 1, exp(m) - 1)."""
    f, _ = printed(d, of, first)
    return f(-d.margin), f(d.margin)


def effect_text(d: Decision, unit: str = "seed", of: float | None = None, first: bool = False) -> str:
    """A Decision in a sentence: '-4.9% [-8.1%, -1.6%]', shares of the compared values' mean, or of `of` (a fall as a
    share of where it started); decided on log ratios, the ratio minus 1 (Decision.rel, ci_rel), or with `first` a
    share of the first value compared (1 - B/A); with the digits its interval needs (interval_text), or why not."""
    f, _ = printed(d, d.scale if of is None else of, first)
    rel = f(d.est) if math.isfinite(d.est) else math.nan
    if not d.tested:
        return {NO_DATA: f"(no {unit} with both values)", DESCRIPTIVE: f"{rel:+.1%} (one {unit})"}.get(
            d.outcome, f"{rel:+.1%} (every {unit} the same: no spread, no test)")
    est, ci = interval_text(d, 1, d.scale if of is None else of, first)
    return f"{est} {ci}"


def settled(d: Decision) -> tuple[int, str]:
    """What an outcome settles: the sign (+1 or -1 where the interval excludes 0, else 0), read off the estimate the
    interval is about (Decision.est: on log ratios the mean log ratio, whose sign the mean difference in units need
    not share), and the size ('inside' the margin, 'beyond' it, or '' where neither)."""
    sign = int(np.sign(d.est)) if d.significant else 0
    return sign, "inside" if d.same else "beyond" if d.differs else ""


def conflict(a: Decision, b: Decision) -> str:
    """Why two outcomes disagree ('' when they do not): they differ in kind, one settled one way and the other the
    other way: one beyond the margin and the other inside it, or both real with opposite signs. Overlapping or
    unequal intervals are no disagreement, nor is one outcome settled where the other is open (docs/decisions.md)."""
    (sa, za), (sb, zb) = settled(a), settled(b)
    if {za, zb} == {"inside", "beyond"}:
        return "one lies beyond the margin, the other inside it"
    return "both are real, with opposite signs" if sa * sb < 0 else ""


def settles_text(d: Decision) -> str:
    """What an outcome settles, in words: 'beyond the margin', 'inside the margin', 'real (negative), its size
    unresolved', 'open: neither its sign nor its size is settled', or its untested outcome."""
    sign = {1: "positive", -1: "negative"}.get(settled(d)[0], "")
    return {DIFFERENT: f"beyond the margin ({sign})", EQUAL: "inside the margin",
            WITHIN: f"real ({sign}) and inside the margin", UNRESOLVED: f"real ({sign}), its size unresolved",
            INCONCLUSIVE: "open: neither its sign nor its size is settled"}.get(d.outcome, d.outcome)


UNMISSABLE = 10  # a margin over this many times the largest value compared cannot be missed


def unmissable(d: Decision) -> bool:
    """Whether d's margin exceeds UNMISSABLE times the largest absolute value of the quantity in either condition (its
    mean over the paired seeds): two values that small differ by at most a fifth of the margin, so the comparison
    could lie beyond it only through a spread of many times the values themselves, and "equal" says little. Only an
    absolute margin can: one that is a share s of the compared values' scale is s times that scale, never 10 times
    the values while s is below 10 (docs/decisions.md#margins), nor one decided on log ratios, whose margin is the
    same share as a log ratio (and in log units, not the values'). The one rule every report that prints a comparison
    against a margin marks it by (unmissable_text)."""
    if d.ratio or d.share is not None or not math.isfinite(d.margin):
        return False
    values = [abs(v) for v in (d.mean_a, d.mean_b) if math.isfinite(v)]
    return bool(values) and d.margin > UNMISSABLE * max(values)


def unmissable_text(d: Decision, decimals: int = 4) -> str:
    """'a margin that cannot be missed: \u00b10.0050 is over 10 times the larger value compared (0.0002)' where
    unmissable(d), '' otherwise."""
    if not unmissable(d):
        return ""
    top = max(abs(v) for v in (d.mean_a, d.mean_b) if math.isfinite(v))
    return (f"a margin that cannot be missed: \u00b1{d.margin:.{decimals}f} is over {UNMISSABLE} times the larger "
            f"value compared ({top:.{sides_digits([top], [0.0], decimals)}f})")


def plural(unit: str) -> str:
    """seed -> seeds, batch -> batches."""
    return unit + ("es" if unit.endswith(("ch", "s")) else "s")


def both_text(bound: float = ALPHA, this: str = "this one") -> str:
    """The error a reader of two reports faces: `this` study's, whose outcomes err with probability at most `bound`
    (one look at the full level: ALPHA), and a new one's on new seeds decided at ALPHA. Bonferroni over the two
    reports: it holds however their errors are related (docs/decisions.md#a-reader-of-both-reports measures it)."""
    return f"read with {this}, some outcome of the two is wrong with probability at most {bound + ALPHA:.0%}, " \
           f"their levels added"


def settle_text(unit: str = "seed", bound: float = ALPHA) -> str:
    """The route that settles an open question of a study whose outcomes err at most `bound`, with no look nobody
    planned, and the error a reader of both reports then faces (both_text): a new study on new seeds, none of its
    runs a run of this one trained again (a replication on new batches for a study of one model)."""
    route = ("a new study on new seeds (no run of this one trained again), decided on its own or planned with "
             "--until_decided from its start" if unit == "seed" else
             f"a replication on new {plural(unit)} decided on its own")
    return f"{route}; {both_text(bound)}"


OPEN = "\u2021"  # \u2021 marks an outcome left open; its report says once, in "In short", what would settle it


def needed_text(d: Decision, unit: str = "seed") -> str:
    """OPEN for an undecided outcome (inconclusive, or real with its size unresolved), '' otherwise: the footnote
    mark of the one line on what would settle it (settle_line), which a report says once, under its "In short"."""
    return OPEN if d.outcome in (INCONCLUSIVE, UNRESOLVED) else ""


def inline_open(text: str, unit: str = "seed") -> str:
    """`text` with each OPEN mark replaced by what would settle it, in brackets: ' (to settle it: ...)', for a file
    read without its report (a combined.json), which has no "In short" to point to."""
    return text.replace(OPEN, f" (to settle it: {_route(unit)} ({SEQUENTIAL}))")


def _route(unit: str) -> str:
    """What settles an open outcome: the looks' Reading where a study of seeds has one, else settle_text's route."""
    reading = _READING.get() if unit == "seed" else None
    return reading.settle if reading is not None else settle_text(unit)


def settle_line(unit: str = "seed") -> str:
    """The one line of a report on what would settle its open outcomes (those marked OPEN), with no number: more
    seeds added to this study would be a look nobody planned, so the route named is a new study on new seeds, with
    the error a reader of both reports then faces (settle_text; a study read at several looks says it as its Reading
    does)."""
    return f"{OPEN} open at these {plural(unit)}; to settle it: {_route(unit)} ({SEQUENTIAL})."


def rule_text(margin: float = MARGIN, loss_margin: float | None = None, unit: str = "seed", family: str | None = None,
              absolute: str = "") -> str:
    """The procedure in one paragraph, for reports. `family`: what one family is, where it is not one table;
    `absolute`: the absolute margins, e.g. '\u00b10.25 logits for the largest attention logit'."""
    within = f"\u00b1{margin * 100:g}% of the compared values' mean" + (  # :g: a margin of 2.5% is not "3%"
        f" (\u00b1{loss_margin * 100:g}% for losses)" if loss_margin else "") + (f"; {absolute}" if absolute else "")
    family = family or "Each table is one family of k comparisons"
    reading = _READING.get() if unit == "seed" else None
    intervals = reading.intervals if reading and reading.intervals else (
        f"every outcome is read off one interval per comparison, the t interval of the mean difference at level "
        f"1 \u2212 {ALPHA}/k (Bonferroni: with at least 95% probability all intervals of the family cover their true "
        f"differences at once)")
    return (f"values are compared by per-{unit} differences"
            + (" (same seed: same initial weights and data order)" if unit == "seed" else "")
            + f". {family}; {intervals}. The "
            f"margin is {within}. Inside the margin and containing 0: \"{EQUAL}\"; inside and excluding 0: "
            f"\"{WITHIN}\"; wholly beyond it: \"{DIFFERENT}\"; excluding 0 but reaching past it: \"{UNRESOLVED}\"; "
            f"containing 0 and reaching past it: \"{INCONCLUSIVE}\"; more {plural(unit)} added to a finished study "
            f"would be a look nobody planned ({SEQUENTIAL}). p (Bonferroni) is k times the "
            f"paired t-test's p, below {ALPHA} exactly when the interval excludes 0. One {unit}: descriptive only; "
            f"every {unit} differing by the same amount: \"{NO_SPREAD}\" (an interval of width 0 is no evidence); "
            f"neither is decided or counted in k")


def ratio_text(what: str, unit: str = "seed") -> str:
    """The ratio rule in one sentence, for a report that compares positive ratio quantities (`what`: which, e.g.
    'key PR (pr_sv, pr_var)')."""
    return (f"Positive ratio quantities ({what}) are compared by per-{unit} log ratios ln(A/B), not differences: the "
            f"t interval of their mean at the same level, mapped back as a ratio (A/B \u2212 1, from exp(lo) \u2212 1 "
            f"to exp(hi) \u2212 1, in %), read against the same relative margin (|A \u2212 B| \u2264 m (A + B)/2 is "
            f"exactly |ln(A/B)| \u2264 ln((1 + m/2)/(1 \u2212 m/2))); beside it the mean difference in units, which "
            f"has no interval ({RATIOS})")
