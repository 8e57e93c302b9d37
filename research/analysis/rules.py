"""The decision procedure every claim of the studies goes through (docs/decisions.md).

Comparisons are paired by seed (or by text batch for one model): a family of k comparisons is decided from ONE
Student-t interval of the mean per-seed difference per comparison, at level 1 - 0.05 / k (Bonferroni), read against
a margin (`Margin`: a share of the compared values' mean, or absolute for a quantity that can sit near zero). The
outcome is equal, different within the margin, different beyond it, different of unresolved size, or inconclusive;
"descriptive", "no paired values" and "no spread" are not decided. Positive ratio quantities (`compared_on`) are
decided on per-seed log ratios. Absence of evidence is never called equality.
The outcomes, margins and ratio quantities in full: docs/decisions.md, from "Paired by seed" to "Ratio quantities".
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from research.analysis.stats import one_sample_p, t_critical
from research.results.checks import check_margin  # noqa: F401  (defined with the other checks; imported from here too)
from research.results.read import final_site_mean, last, pair_key
from research.results.values import present
from research.results.vocabulary import MAIN_SITE, QK_CONDITIONS
from utils.errors import UserError

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
RATIOS = "docs/decisions.md#ratio-quantities"
OUTLIERS = "docs/decisions.md#per-seed-values-and-outliers"
# How a comparison is made: per-seed differences a - b, or per-seed log ratios ln(a / b) of a positive quantity
DIFFERENCE, RATIO = "difference", "ratio"
RATIO_WHERE_POSITIVE = "ratio where positive"  # a log ratio, or differences (said) where a value is 0 or below
# Positive ratio quantities: a PR, a norm, a rank or a largest component is positive by construction, and seeds move it
# by factors, so it is compared on log ratios. The QK-norm study's top-level fields first, then probe metrics.
RATIO_QUANTITIES = frozenset(("mean_pr", "mean_pr_var", "layer_pr", "pr_sv", "pr_var", "erank", "norm_mean",
                              "max_abs", "mean_max_abs", "rank90", "rank99", "rank90_uncentered", "rank99_uncentered"))
# Attention entropy is positive unless every query attends one key alone, which a model may legitimately learn
WHERE_POSITIVE = frozenset(("entropy",))
# A seed is marked as an outlier when its value lies outside the others' prediction interval at this level
OUTLIER_LEVEL = 0.99


def compared_on(metric: str) -> str:
    """How comparisons of a quantity (a results field or a probe metric, e.g. 'mean_pr', 'pr_sv', 'norm_mean') are
    made: RATIO for a positive ratio quantity, RATIO_WHERE_POSITIVE for attention entropy, else DIFFERENCE (losses,
    logits, shares, changes)."""
    return RATIO if metric in RATIO_QUANTITIES else RATIO_WHERE_POSITIVE if metric in WHERE_POSITIVE else DIFFERENCE


def log_margin(m: float) -> float:
    """The margin m of a pair's mean as a margin on ln(a / b): |a - b| <= m (a + b) / 2 exactly when
    |ln(a / b)| <= ln((1 + m / 2) / (1 - m / 2)) (about m: 0.0300023 for 3%)."""
    return math.log((1 + m / 2) / (1 - m / 2))


class NotPositive(UserError, ValueError):
    """A value of a ratio quantity that is 0 or below: its log ratio does not exist."""


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

    diffs: np.ndarray  # what is tested: a_s - b_s for the seeds both sides have (finite only), ln(a_s / b_s) on RATIO
    mean_a: float
    mean_b: float  # 0 for a one-sample comparison
    scale: float  # the margin and the relative size are shares of this (on DIFFERENCE)
    seeds: tuple | None = None  # the seed of each difference, where known: a look at fewer seeds keeps its own
    on: str = DIFFERENCE  # DIFFERENCE or RATIO: what diffs are
    raw: np.ndarray | None = None  # on RATIO, a_s - b_s in the quantity's units (None: diffs are those)
    note: str = ""  # why a comparison of a ratio quantity fell back to differences ('' where it did not)

    @property
    def units(self) -> np.ndarray:
        """The per-seed differences in the quantity's units."""
        return self.diffs if self.raw is None else self.raw

    def keep(self, mask: np.ndarray) -> "Paired":
        """The comparison on the seeds `mask` keeps."""
        return dataclasses.replace(self, diffs=self.diffs[mask], raw=None if self.raw is None else self.raw[mask],
                                   seeds=None if self.seeds is None else
                                   tuple(s for s, k in zip(self.seeds, mask) if k))

    @staticmethod
    def of(a: dict, b: dict, on: str = DIFFERENCE, names: tuple[str, str] = ("a", "b")) -> "Paired":
        """Pair two {seed: value} maps on their common seeds, by differences or, `on` RATIO, by log ratios (a value
        of 0 or below is a NotPositive naming `names` and the seed; RATIO_WHERE_POSITIVE falls back to differences
        there and says so in `note`)."""
        seeds = [s for s in a if s in b and math.isfinite(a[s]) and math.isfinite(b[s])]
        xa, xb = np.array([a[s] for s in seeds], float), np.array([b[s] for s in seeds], float)
        if on == DIFFERENCE:
            ma, mb = (float(xa.mean()), float(xb.mean())) if seeds else (math.nan, math.nan)
            return Paired(xa - xb, ma, mb, (abs(ma) + abs(mb)) / 2, tuple(seeds))
        return Paired.ratio(xa, xb, tuple(seeds), names, fallback=on == RATIO_WHERE_POSITIVE)

    @staticmethod
    def ratio(a, b, seeds: tuple | None = None, names: tuple[str, str] = ("a", "b"),
              fallback: bool = False) -> "Paired":
        """Per-seed log ratios ln(a_s / b_s) of aligned positive values (a one-sample comparison of a quantity with a
        reference: b the reference at each seed), seeds where either is not finite left out. A value of 0 or below:
        NotPositive, one line naming the side, the seed (or the run's place) and the value; with `fallback`,
        differences instead, and `note` says why."""
        xa, xb = np.asarray(a, float), np.asarray(b, float)
        finite = np.isfinite(xa) & np.isfinite(xb)  # a value not measured leaves its seed out, as Paired.of does
        if not finite.all():
            xa, xb = xa[finite], xb[finite]
            seeds = None if seeds is None else tuple(s for s, k in zip(seeds, finite) if k)
        ma, mb = (float(xa.mean()), float(xb.mean())) if xa.size else (math.nan, math.nan)
        bad = [(name, i, float(v)) for name, x in zip(names, (xa, xb)) for i, v in enumerate(x) if not v > 0]
        if bad:
            name, i, v = bad[0]
            where = f"{name} (seed {seeds[i]})" if seeds is not None else f"{name} (run {i + 1})"
            if not fallback:
                raise NotPositive(f"{where} is {v:g}, not positive: the quantity is compared on per-seed log "
                                  f"ratios, which need positive values ({RATIOS}); fix: check that run's results "
                                  f"file, or leave the run out")
            return Paired(xa - xb, ma, mb, (abs(ma) + abs(mb)) / 2, seeds,
                          note=f"compared by differences, not log ratios: {where} is {v:g}")
        return Paired(np.log(xa) - np.log(xb), ma, mb, (abs(ma) + abs(mb)) / 2, seeds, RATIO, xa - xb)

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
    # On RATIO the comparison was decided on per-seed log ratios: ci, margin and sd are log ratios, log_mean is the
    # mean log ratio, and diff stays the mean difference in units (for the tables' column in units)
    on: str = DIFFERENCE
    log_mean: float = math.nan
    values: tuple = ()  # the per-seed values decided (differences, or log ratios on RATIO), in `seeds` order
    seeds: tuple | None = None
    note: str = ""  # Paired.note: why a ratio quantity was compared by differences

    @property
    def ratio(self) -> bool:
        return self.on == RATIO

    @property
    def est(self) -> float:
        """The estimate the interval is about: the mean difference, or on RATIO the mean log ratio. Signs are read
        off it."""
        return self.log_mean if self.ratio else self.diff

    @property
    def rel(self) -> float:
        """The difference as a share of the compared values' mean; on RATIO the ratio minus 1, exp(log_mean) - 1."""
        if self.ratio:
            return math.expm1(self.log_mean) if math.isfinite(self.log_mean) else math.nan
        return self.diff / self.scale if self.scale else math.nan

    @property
    def ci_rel(self) -> tuple[float, float]:
        """The interval as shares of the compared values' mean; on RATIO mapped back as a ratio minus 1."""
        if self.ratio:
            return tuple(math.expm1(v) if math.isfinite(v) else math.nan for v in self.ci)
        return tuple(v / self.scale if self.scale else math.nan for v in self.ci)

    @property
    def per_seed(self) -> tuple:
        """Each seed's value as shown: its difference in units, or on RATIO its ratio minus 1."""
        return tuple(math.expm1(v) for v in self.values) if self.ratio else self.values

    @property
    def outliers(self) -> tuple[bool, ...]:
        """Which seeds' values are outliers (outliers()), in `values` order."""
        return outliers(self.values)

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


def outliers(values, level: float = OUTLIER_LEVEL) -> tuple[bool, ...]:
    """Per value, whether it lies outside the prediction interval of the OTHER values at `level`: |x_i - mean of the
    others| > t_{n-2} s_others sqrt(1 + 1/(n - 1)), s_others their standard deviation. Under normal values each is
    marked with probability exactly 1 - level (the statistic is Student's t with n - 2 degrees of freedom), whatever
    their mean and spread; needs 4 values (3 others), else none is marked. At 4 values a mark takes 11.5 of the others'
    standard deviations, at 8 values 4.0."""
    x = np.asarray(values, float)
    n = x.size
    if n < 4:
        return (False,) * n
    factor = t_critical(n - 2, level) * math.sqrt(1 + 1 / (n - 1))
    tol = SPREAD_TOL * max(float(np.abs(x).max()), 1e-300)
    out = []
    for i in range(n):
        others = np.delete(x, i)
        off = abs(float(x[i] - others.mean()))
        out.append(off > tol and off > factor * float(others.std(ddof=1)))
    return tuple(out)


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
    # a log ratio is a relative size already: agreeing to SPREAD_TOL is agreeing to 9 digits of the ratio
    size = 1.0 if c.on == RATIO else max(abs(c.mean_a), abs(c.mean_b), float(np.abs(c.diffs).max()))
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
        ratio = c.on == RATIO
        if ratio and margin.absolute:
            raise ValueError("a comparison on log ratios takes a margin that is a share, not an absolute one")
        m = log_margin(margin.value) if ratio else margin.of(c.scale)
        diff = float(c.units.mean()) if n else math.nan  # the mean difference in units, whatever was decided
        est = float(c.diffs.mean()) if n else math.nan
        kept = dict(on=c.on, log_mean=est if ratio else math.nan, values=tuple(float(v) for v in c.diffs),
                    seeds=c.seeds, note=c.note)
        if n < 2 or no_spread(c):
            outcome = NO_SPREAD if n >= 2 else DESCRIPTIVE if n else NO_DATA
            out[key] = Decision(n, c.mean_a, c.mean_b, diff, 0.0 if n >= 2 else math.nan, (math.nan, math.nan),
                                math.nan, math.nan, math.nan, m, c.scale, outcome, share, **kept)
            continue
        sd = float(c.diffs.std(ddof=1))
        half = t_critical(n - 1, level) * sd / math.sqrt(n)
        p = one_sample_p(c.diffs)
        out[key] = Decision(n, c.mean_a, c.mean_b, diff, sd, (est - half, est + half), level, p, min(1.0, k * p), m,
                            c.scale, outcome_of(est - half, est + half, m), share, **kept)
    return out
