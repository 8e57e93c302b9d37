"""Statistics over seeds: confidence intervals of means and t-tests.

Distributions come from scipy.stats. Every function that takes samples drops missing values (None,
NaN) first: a run that has no value at some probe simply does not count there.
"""
from __future__ import annotations

import functools
import math
from typing import Iterable, Sequence

import numpy as np
from scipy import special, stats

from research.results.values import present


@functools.lru_cache(maxsize=4096)  # a few (dof, level) pairs per study, asked for again and again (simulations)
def t_critical(dof: float, confidence: float = 0.95) -> float:
    """Two-sided critical value of Student's t: P(|T| <= t) = confidence."""
    return float(stats.t.ppf(0.5 + confidence / 2, dof))


def mean_ci(values: Iterable, confidence: float = 0.95) -> tuple[float, float]:
    """(mean, half width of its two-sided confidence interval) of independent samples (e.g. seeds):
    t_{n-1} * s / sqrt(n) with the sample standard deviation s (ddof=1). One value: half width NaN (one
    run gives no interval); none: both NaN."""
    x = present(values)
    if x.size == 0:
        return math.nan, math.nan
    if x.size == 1:
        return float(x[0]), math.nan
    return float(x.mean()), t_critical(x.size - 1, confidence) * float(x.std(ddof=1)) / math.sqrt(x.size)


def mean_ci95(values: Iterable) -> tuple[float, float]:
    return mean_ci(values, 0.95)


def one_sample_p(values: Iterable) -> float:
    """Two-sided p of Student's t-test that the mean of `values` is 0 (NaN with fewer than 2 values; with
    no spread, 0 for a nonzero mean and 1 for a zero mean)."""
    x = present(values)
    if x.size < 2:
        return math.nan
    sd = float(x.std(ddof=1))
    if sd == 0:
        return 0.0 if x.mean() != 0 else 1.0
    t = float(x.mean()) / (sd / math.sqrt(x.size))
    return float(2 * special.stdtr(x.size - 1, -abs(t)))  # stats.t.sf(|t|) without its per-call overhead


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation of the complete pairs (NaN with fewer than 2, or a constant side)."""
    xa = np.array([math.nan if v is None else v for v in x], dtype=float)
    ya = np.array([math.nan if v is None else v for v in y], dtype=float)
    keep = np.isfinite(xa) & np.isfinite(ya)
    if keep.sum() < 2 or np.ptp(xa[keep]) == 0 or np.ptp(ya[keep]) == 0:
        return math.nan
    return float(stats.spearmanr(xa[keep], ya[keep]).statistic)


def binomial_upper(successes: int, trials: int, alpha: float) -> float:
    """The exact (Clopper-Pearson) one-sided upper confidence bound at level 1 - alpha on a binomial proportion:
    the p at which seeing `successes` or fewer of `trials` has probability alpha (1 when every trial succeeded;
    NaN with no trial). With no success it is 1 - alpha ** (1 / trials)."""
    if trials <= 0:
        return math.nan
    if successes >= trials:
        return 1.0
    return float(stats.beta.ppf(1 - alpha, successes + 1, trials - successes))
