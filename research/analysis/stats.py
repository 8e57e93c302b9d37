"""Statistics over seeds: confidence intervals of means, Holm's correction, and how many seeds a test needs.

Distributions come from scipy.stats. Every function that takes samples drops missing values (None,
NaN) first: a run that has no value at some probe simply does not count there.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
from scipy import stats

from research.results.values import present


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
    return float(2 * stats.t.sf(abs(t), x.size - 1))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values: the i-th smallest p times (m - i + 1), made non-decreasing, capped at 1.
    NaN entries are left out of the family and stay NaN."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = [i for i in np.argsort(p, kind="stable") if np.isfinite(p[i])]
    m, running = len(idx), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def holm_levels(p_values: Sequence[float], alpha: float = 0.05) -> list[float]:
    """The per-comparison significance level Holm's step-down procedure gives each test: alpha / (m - rank)
    for the test of 0-based rank `rank` in increasing p (NaN for missing p-values)."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = [i for i in np.argsort(p, kind="stable") if np.isfinite(p[i])]
    for rank, i in enumerate(idx):
        out[i] = alpha / (len(idx) - rank)
    return out.tolist()


def seeds_to_decide(diff: float, sd: float, margin: float, alpha_diff: float = 0.05, alpha_equiv: float = 0.05,
                    max_n: int = 10_000) -> int | None:
    """Seeds needed, if the observed mean difference and its spread held, for a decision: significant at
    alpha_diff (|diff| > t sd / sqrt(n), two-sided) or equivalent within the margin by TOST at alpha_equiv
    (|diff| + t_{1-alpha_equiv} sd / sqrt(n) < margin). None when even max_n seeds would not do."""
    if not (math.isfinite(diff) and math.isfinite(sd)):
        return None
    n = np.arange(2, max_n + 1)
    se = sd / np.sqrt(n)
    significant = abs(diff) > stats.t.ppf(1 - alpha_diff / 2, n - 1) * se
    equivalent = abs(diff) + stats.t.ppf(1 - alpha_equiv, n - 1) * se < margin
    hit = np.flatnonzero(significant | equivalent)
    return int(n[hit[0]]) if hit.size else None


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation of the complete pairs (NaN with fewer than 2, or a constant side)."""
    xa = np.array([math.nan if v is None else v for v in x], dtype=float)
    ya = np.array([math.nan if v is None else v for v in y], dtype=float)
    keep = np.isfinite(xa) & np.isfinite(ya)
    if keep.sum() < 2 or np.ptp(xa[keep]) == 0 or np.ptp(ya[keep]) == 0:
        return math.nan
    return float(stats.spearmanr(xa[keep], ya[keep]).statistic)
