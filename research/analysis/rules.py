"""The decision procedure every claim of the studies goes through (docs/decisions.md).

Conditions trained with the same seed share their initial hidden weights and their data order, so
they are compared by per-seed (paired) differences d_s = a_s - b_s. A family of k comparisons (the
three pairs of conditions, the layers of a model, ...) is decided from ONE interval per comparison:
the Student-t confidence interval of mean(d) at level 1 - 0.05 / k (Bonferroni). With probability at
least 95% every interval of the family covers its true difference at once, so every outcome below is
right at once with that probability. With the margin m (a share of the compared values' mean):

    equal                          the interval lies inside (-m, +m) and contains 0
    different, within the margin   inside (-m, +m), excludes 0: real, and smaller than the margin
    different, size unresolved     excludes 0 but reaches past +-m: real, size not pinned down
    different, beyond the margin   lies wholly beyond +m or wholly below -m
    inconclusive                   contains 0 and reaches past +-m

Excluding 0 is the paired t-test at 0.05 / k (p times k below 0.05); lying inside the margin is two
one-sided tests at 0.05 / (2k). One seed: "descriptive" (no test); no seed with a value on both sides:
"no paired values"; every seed differing by the same amount (an integer quantity can): "no spread", since an
interval of width 0 is not evidence of anything beyond those seeds. None of the three is decided or counts in k.
Undecided outcomes say what would settle them, with no number (needed_text): more seeds added to a finished study
are a look nobody planned, so the route named is a new study on new seeds (no run of this one trained again), decided
on its own or planned with --until_decided from its start, with the error a reader of both reports then faces: the
two studies' levels added (settle_text, docs/decisions.md#sequential-studies).

The margin is a share of each comparison's scale (Margin(0.03)), or, for a quantity that can sit near zero (a
logit), an absolute one in its units (Margin(0.25, absolute=True)): a share of a mean near zero is no margin.

Absence of evidence is never called equality.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from research.analysis.stats import one_sample_p, t_critical
from research.results.checks import check_margin  # noqa: F401  (defined with the other checks; imported from here too)
from research.results.read import final_site_mean, last, pair_key
from research.results.values import present
from research.results.vocabulary import MAIN_SITE, QK_CONDITIONS

ALPHA = 0.05
SEQUENTIAL = "docs/decisions.md#sequential-studies"
MARGIN = 0.03  # default equivalence margin of key metrics: 3% of the mean of the compared values
LOSS_MARGIN = 0.005  # losses of the conditions sit within ~2% of each other; 0.5% is ~0.02 nats at 3.6
EQUAL, WITHIN, UNRESOLVED, DIFFERENT = ("equal", "different, within the margin", "different, size unresolved",
                                        "different, beyond the margin")
INCONCLUSIVE, DESCRIPTIVE, NO_DATA, NO_SPREAD = "inconclusive", "descriptive", "no paired values", "no spread"
UNTESTED = (DESCRIPTIVE, NO_DATA, NO_SPREAD)  # no interval to read: never decided, never counted in a family's k
# Differences that agree to 9 significant digits are one number: a spread that small is the rounding of a - b
SPREAD_TOL = 1e-9
FINAL_FIELDS = ("mean_pr", "mean_pr_var", "loss", "val_loss")


def conditions(runs: dict) -> list[str]:
    """Conditions with at least one run: the study's three in A, B, C order, then any others."""
    known = [c for c in QK_CONDITIONS if runs.get(c)]
    return known + [c for c in runs if c not in QK_CONDITIONS and runs.get(c)]


def runs_of(runs: dict, cond: str) -> list[dict]:
    r = runs.get(cond) or []
    return [r] if isinstance(r, dict) else list(r)


def by_seed(runs: list[dict], get) -> dict:
    """{seed: get(run)} over a condition's runs that have a seed (research.results.read.pair_key). A run without
    one is left out: runs are paired by identity, never by their position in a list."""
    return {key: get(r) for r in runs if (key := pair_key(r)) is not None}


def final_value(res: dict, field: str) -> float:
    """The last value of a per-probe field; "mean_pr_var": the mean over layers of the last probe's centered PR
    (pr_var) at the write-ups' site, as mean_pr is that of the uncentered pr_sv."""
    return final_site_mean(res, MAIN_SITE, "pr_var") if field == "mean_pr_var" else last(res, field)


def finals(runs: dict, cond: str, field: str) -> dict:
    """{seed: final value of `field`} of a condition."""
    return by_seed(runs_of(runs, cond), lambda r: final_value(r, field))


@dataclass(frozen=True)
class Paired:
    """What one comparison tests: per-seed differences and the values they came from."""

    diffs: np.ndarray  # a_s - b_s for the seeds both sides have (finite only)
    mean_a: float
    mean_b: float  # 0 for a one-sample comparison
    scale: float  # the margin and the relative size are shares of this
    seeds: tuple | None = None  # the seed of each difference, where known: a look at fewer seeds keeps its own

    @staticmethod
    def of(a: dict, b: dict) -> "Paired":
        """Pair two {seed: value} maps on their common seeds."""
        seeds = [s for s in a if s in b and math.isfinite(a[s]) and math.isfinite(b[s])]
        xa, xb = np.array([a[s] for s in seeds], float), np.array([b[s] for s in seeds], float)
        ma, mb = (float(xa.mean()), float(xb.mean())) if seeds else (math.nan, math.nan)
        return Paired(xa - xb, ma, mb, (abs(ma) + abs(mb)) / 2, tuple(seeds))

    @staticmethod
    def one_sample(values, scale: float) -> "Paired":
        """Values tested against 0 (e.g. per-seed falls of a trajectory)."""
        x = present(values)
        return Paired(x, float(x.mean()) if x.size else math.nan, 0.0, scale)


@dataclass(frozen=True)
class Margin:
    """An equivalence margin: a share of each comparison's scale (the compared values' mean), or, with `absolute`, a
    size in the quantity's own units, for a quantity that can sit near zero (a logit going from -0.05 to +0.05 is
    +200% of its mean, and 3% of that mean is no margin at all)."""

    value: float
    absolute: bool = False

    def of(self, scale: float) -> float:
        """The margin in the quantity's units for a comparison of this scale."""
        return self.value if self.absolute else self.value * scale


@dataclass(frozen=True)
class Decision:
    n: int  # seeds compared
    mean_a: float
    mean_b: float
    diff: float  # mean of the per-seed differences
    sd: float  # their standard deviation (ddof=1)
    ci: tuple[float, float]  # two-sided CI of diff at ci_level: every outcome is read off it
    ci_level: float  # 1 - 0.05 / k for a family of k testable comparisons
    p: float  # two-sided paired t-test of mean(d) = 0
    p_adj: float  # Bonferroni: min(1, k p); below 0.05 exactly when the CI excludes 0
    margin: float  # absolute
    scale: float
    outcome: str  # EQUAL, WITHIN, UNRESOLVED, DIFFERENT, INCONCLUSIVE, or one of UNTESTED
    share: float | None = None  # the margin as a share of `scale`; None: an absolute margin in the quantity's units

    @property
    def rel(self) -> float:
        """The difference as a share of the compared values' mean."""
        return self.diff / self.scale if self.scale else math.nan

    @property
    def ci_rel(self) -> tuple[float, float]:
        return tuple(v / self.scale if self.scale else math.nan for v in self.ci)

    @property
    def differs(self) -> bool:
        """The whole interval lies beyond the margin: a difference at least the margin's size."""
        return self.outcome == DIFFERENT

    @property
    def significant(self) -> bool:
        """The interval excludes 0, whatever the size."""
        return self.outcome in (WITHIN, UNRESOLVED, DIFFERENT)

    @property
    def same(self) -> bool:
        """The whole interval lies inside the margin: equal, or a real difference smaller than the margin."""
        return self.outcome in (EQUAL, WITHIN)

    @property
    def decided(self) -> bool:
        """The size is settled: inside or beyond the margin."""
        return self.outcome in (EQUAL, WITHIN, DIFFERENT)

    @property
    def tested(self) -> bool:
        """An interval was read: not one seed, not unpaired, not a difference with no spread."""
        return self.outcome not in UNTESTED


def outcome_of(lo: float, hi: float, margin: float) -> str:
    """Where an interval [lo, hi] lies against 0 and +-margin."""
    excludes0, inside = lo > 0 or hi < 0, -margin < lo and hi < margin
    if inside:
        return WITHIN if excludes0 else EQUAL
    if lo >= margin or hi <= -margin:
        return DIFFERENT
    return UNRESOLVED if excludes0 else INCONCLUSIVE


def no_spread(c: Paired) -> bool:
    """Two or more differences, all the same (to SPREAD_TOL of the largest value compared): no interval to read."""
    if c.diffs.size < 2:
        return False
    size = max(abs(c.mean_a), abs(c.mean_b), float(np.abs(c.diffs).max()))
    return float(np.ptp(c.diffs)) <= SPREAD_TOL * size


def k_of(family: dict) -> int:
    """How many comparisons of a family {key: Paired} have an interval: two or more paired values with a spread."""
    return sum(1 for c in family.values() if c.diffs.size >= 2 and not no_spread(c))


# How decide decides while a study's looks are in force (research.analysis.sequential.at_looks); None: at one look
_DECIDER: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("decider", default=None)


@contextlib.contextmanager
def deciding_with(decider: Callable) -> Iterator[None]:
    """Within the block, decide(family, margin, alpha, k) is decider(family, margin, alpha, k): how a study decided
    over several looks (research.analysis.sequential.at_looks) has every family of its analysis decided at its looks,
    whichever analysis builds the family."""
    token = _DECIDER.set(decider)
    try:
        yield
    finally:
        _DECIDER.reset(token)


@dataclass(frozen=True)
class Reading:
    """How a study that looked at its seeds more than once reads its decisions in words
    (research.analysis.sequential.reading): its intervals in the procedure's paragraph (rule_text), and what would
    settle an open question (needed_text)."""

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


def decide(family: dict, margin: float | Margin = MARGIN, alpha: float = ALPHA, k: int | None = None) -> dict:
    """Decide every comparison of a family {key: Paired} at the Bonferroni level over its testable members, or over
    `k` comparisons where the family is part of a larger one (several quantities read as one family). `margin`: a
    share of each comparison's scale, or a Margin. Within deciding_with, its decider decides instead."""
    decider = _DECIDER.get()
    if decider is not None:
        return decider(family, margin, alpha, k)
    return decide_once(family, margin, alpha, k)


def decide_once(family: dict, margin: float | Margin = MARGIN, alpha: float = ALPHA, k: int | None = None) -> dict:
    """decide at one look: every comparison from its t interval at 1 - alpha / k."""
    margin = margin if isinstance(margin, Margin) else Margin(margin)
    share = None if margin.absolute else margin.value
    k = k_of(family) if k is None else k
    level = 1 - alpha / max(k, 1)
    out = {}
    for key, c in family.items():
        n = int(c.diffs.size)
        m = margin.of(c.scale)
        if n < 2 or no_spread(c):
            outcome = NO_SPREAD if n >= 2 else DESCRIPTIVE if n else NO_DATA
            d, sd = (float(c.diffs.mean()), 0.0) if n else (math.nan, math.nan)
            out[key] = Decision(n, c.mean_a, c.mean_b, d, sd if n >= 2 else math.nan, (math.nan, math.nan), math.nan,
                                math.nan, math.nan, m, c.scale, outcome, share)
            continue
        d, sd = float(c.diffs.mean()), float(c.diffs.std(ddof=1))
        half = t_critical(n - 1, level) * sd / math.sqrt(n)
        p = one_sample_p(c.diffs)
        out[key] = Decision(n, c.mean_a, c.mean_b, d, sd, (d - half, d + half), level, p, min(1.0, k * p), m,
                            c.scale, outcome_of(d - half, d + half, m), share)
    return out


def untested_text(d: Decision, decimals: int = 3, unit: str = "seed") -> str:
    """Why a comparison has no interval, in words: 'one seed (descriptive, no test)', 'no paired values' or 'no
    spread: every seed differs by exactly +2.000'; '' for a tested one."""
    return {NO_DATA: f"{NO_DATA} (no {unit} with both values)", DESCRIPTIVE: f"one {unit} (descriptive, no test)",
            NO_SPREAD: f"{NO_SPREAD}: every {unit} differs by exactly {d.diff:+.{decimals}f}"}.get(d.outcome, "")


def effect_text(d: Decision, unit: str = "seed") -> str:
    """A Decision in a sentence: '-4.9% [-8.1%, -1.6%]' (shares of the compared values' mean), or why not."""
    if not d.tested:
        return {NO_DATA: f"(no {unit} with both values)", DESCRIPTIVE: f"{d.rel:+.1%} (one {unit})"}.get(
            d.outcome, f"{d.rel:+.1%} (every {unit} the same: no spread, no test)")
    lo, hi = d.ci_rel
    return f"{d.rel:+.1%} [{lo:+.1%}, {hi:+.1%}]"


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


def needed_text(d: Decision, unit: str = "seed") -> str:
    """What would settle an undecided outcome ('' otherwise), with no number: more seeds added to this study would be
    a look nobody planned, so the route named is a new study on new seeds, with the error a reader of both reports
    then faces (settle_text; a study read at several looks says it as its Reading does)."""
    if d.outcome not in (INCONCLUSIVE, UNRESOLVED):
        return ""
    reading = _READING.get() if unit == "seed" else None
    return f"to settle it: {reading.settle if reading is not None else settle_text(unit)} ({SEQUENTIAL})"


def rule_text(margin: float = MARGIN, loss_margin: float | None = None, unit: str = "seed", family: str | None = None,
              absolute: str = "") -> str:
    """The procedure in one paragraph, for reports. `family`: what one family is, where it is not one table;
    `absolute`: the absolute margins, e.g. '\u00b10.25 logits for the largest attention logit'."""
    within = f"\u00b1{margin:.0%} of the compared values' mean" + (
        f" (\u00b1{loss_margin:.1%} for losses)" if loss_margin else "") + (f"; {absolute}" if absolute else "")
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
