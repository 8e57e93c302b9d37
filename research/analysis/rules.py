"""The decision procedure every claim of the studies goes through.

Conditions trained with the same seed share their initial hidden weights and their data order, so
they are compared by per-seed (paired) differences d_s = a_s - b_s. For each comparison in a family
of k comparisons (the three pairs of conditions, the layers of a model, ...):

- "different": Student's t-test of mean(d) = 0 rejects at 0.05 after Holm's correction for the k
  comparisons; its CI is reported at the Holm-adjusted level (95% family-wise).
- "equal": the 90% CI of mean(d) lies inside +-margin (two one-sided tests at 0.05); the margin is
  a share of the compared values' mean: 3% for key metrics, 0.5% for losses, unless asked otherwise.
- both: "different but within the margin" (real, but smaller than the margin).
- neither: "inconclusive", with the number of seeds that would decide it if the observed mean and
  spread held.
- one seed: "descriptive" (no test is possible; no verdict is drawn from it).

Absence of evidence is never called equality.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.stats import holm, holm_levels, one_sample_p, seeds_to_decide, t_critical
from research.results.read import last, seed_of
from research.results.values import present
from research.results.vocabulary import QK_CONDITIONS

ALPHA = 0.05
MARGIN = 0.03  # default equivalence margin of key metrics: 3% of the mean of the compared values
LOSS_MARGIN = 0.005  # losses of the conditions sit within ~2% of each other; 0.5% is ~0.02 nats at 3.6
EQUAL, DIFFERENT, WITHIN, INCONCLUSIVE, DESCRIPTIVE = (
    "equal", "different", "different but within the margin", "inconclusive", "descriptive")
FINAL_FIELDS = ("mean_pr", "loss", "val_loss")


def conditions(runs: dict) -> list[str]:
    """Conditions with at least one run: the study's three in A, B, C order, then any others."""
    known = [c for c in QK_CONDITIONS if runs.get(c)]
    return known + [c for c in runs if c not in QK_CONDITIONS and runs.get(c)]


def runs_of(runs: dict, cond: str) -> list[dict]:
    r = runs.get(cond) or []
    return [r] if isinstance(r, dict) else list(r)


def by_seed(runs: list[dict], get) -> dict:
    """{seed: get(run)} over a condition's runs (runs without a seed are keyed by their position)."""
    out = {}
    for i, r in enumerate(runs):
        seed = seed_of(r)
        out[f"run {i}" if seed is None else seed] = get(r)
    return out


def finals(runs: dict, cond: str, field: str) -> dict:
    """{seed: last value of `field`} of a condition."""
    return by_seed(runs_of(runs, cond), lambda r: last(r, field))


@dataclass(frozen=True)
class Paired:
    """What one comparison tests: per-seed differences and the values they came from."""

    diffs: np.ndarray  # a_s - b_s for the seeds both sides have (finite only)
    mean_a: float
    mean_b: float  # 0 for a one-sample comparison
    scale: float  # the margin and the relative size are shares of this

    @staticmethod
    def of(a: dict, b: dict) -> "Paired":
        """Pair two {seed: value} maps on their common seeds."""
        seeds = [s for s in a if s in b and math.isfinite(a[s]) and math.isfinite(b[s])]
        xa, xb = np.array([a[s] for s in seeds], float), np.array([b[s] for s in seeds], float)
        ma, mb = (float(xa.mean()), float(xb.mean())) if seeds else (math.nan, math.nan)
        return Paired(xa - xb, ma, mb, (abs(ma) + abs(mb)) / 2)

    @staticmethod
    def one_sample(values, scale: float) -> "Paired":
        """Values tested against 0 (e.g. per-seed falls of a trajectory)."""
        x = present(values)
        return Paired(x, float(x.mean()) if x.size else math.nan, 0.0, scale)


@dataclass(frozen=True)
class Decision:
    n: int  # seeds compared
    mean_a: float
    mean_b: float
    diff: float  # mean of the per-seed differences
    sd: float  # their standard deviation (ddof=1)
    ci: tuple[float, float]  # two-sided CI of diff at the Holm-adjusted level
    ci_level: float  # that level, e.g. 0.983 for the first of three comparisons
    ci90: tuple[float, float]  # the equivalence test's interval
    p: float  # two-sided paired t-test
    p_holm: float
    margin: float  # absolute
    scale: float
    outcome: str  # EQUAL, DIFFERENT, WITHIN, INCONCLUSIVE or DESCRIPTIVE
    seeds_needed: int | None  # for INCONCLUSIVE: seeds that would decide it, if the spread held

    @property
    def rel(self) -> float:
        """The difference as a share of the compared values' mean."""
        return self.diff / self.scale if self.scale else math.nan

    @property
    def differs(self) -> bool:
        """A difference at least as large as the margin could be: the outcome is DIFFERENT."""
        return self.outcome == DIFFERENT

    @property
    def same(self) -> bool:
        """Equal, or a real difference inside the margin."""
        return self.outcome in (EQUAL, WITHIN)

    @property
    def decided(self) -> bool:
        return self.outcome in (EQUAL, DIFFERENT, WITHIN)


def decide(family: dict, margin: float = MARGIN, alpha: float = ALPHA) -> dict:
    """Decide every comparison of a family {key: Paired}; Holm's correction runs over the family."""
    keys = list(family)
    ps = [one_sample_p(family[k].diffs) for k in keys]
    adjusted, levels = holm(ps), holm_levels(ps, alpha)
    out = {}
    for k, p, p_holm, level in zip(keys, ps, adjusted, levels):
        c = family[k]
        n = int(c.diffs.size)
        m = margin * c.scale
        if n < 2:
            d = float(c.diffs[0]) if n else math.nan
            out[k] = Decision(n, c.mean_a, c.mean_b, d, math.nan, (math.nan, math.nan), math.nan,
                              (math.nan, math.nan), math.nan, math.nan, m, c.scale, DESCRIPTIVE, None)
            continue
        d, sd = float(c.diffs.mean()), float(c.diffs.std(ddof=1))
        se = sd / math.sqrt(n)
        h95, h90 = t_critical(n - 1, 1 - level) * se, t_critical(n - 1, 1 - 2 * alpha) * se
        significant, equivalent = p_holm < alpha, -m < d - h90 and d + h90 < m
        outcome = (WITHIN if significant and equivalent else DIFFERENT if significant else
                   EQUAL if equivalent else INCONCLUSIVE)
        needed = seeds_to_decide(d, sd, m, level, alpha) if outcome == INCONCLUSIVE else None
        out[k] = Decision(n, c.mean_a, c.mean_b, d, sd, (d - h95, d + h95), 1 - level, (d - h90, d + h90),
                          p, p_holm, m, c.scale, outcome, needed)
    return out


def rule_text(margin: float = MARGIN, loss_margin: float | None = None) -> str:
    """The procedure in one paragraph, for reports."""
    within = f"\u00b1{margin:.0%} of the mean" + (f" (\u00b1{loss_margin:.1%} for losses)" if loss_margin else "")
    return (f"conditions are compared by per-seed differences (same seed: same initial weights and data order). "
            f"\"Different\": the paired t-test rejects at {ALPHA} after Holm's correction over the comparisons "
            f"of the table (CIs shown at the Holm-adjusted level). \"Equal\": the 90% CI of the difference lies "
            f"within {within} (two one-sided tests at {ALPHA}). Both: \"different but "
            f"within the margin\". Neither: \"inconclusive\", with the seeds that would decide it if the observed "
            f"mean and spread held. One seed: descriptive only, no verdict")
