"""Small statistics for comparing conditions across seeds: confidence intervals, Welch's t-test, equality rule.

numpy and math only (scipy is not a dependency; no torch). The Student t distribution is computed here
from the regularized incomplete beta function:

    two-sided p of |T| >= t with nu degrees of freedom = I_x(nu/2, 1/2),  x = nu / (nu + t^2)

and I_x(a, b) is evaluated by its continued fraction (modified Lentz method), using the symmetry
I_x(a, b) = 1 - I_{1-x}(b, a) on the side where the fraction converges fast. Quantiles (critical values)
are found by bisection on the CDF. Accuracy is ~1e-12 absolute, far below what a 3-seed study needs.

Missing values: every function that takes samples drops None and NaN entries first (a run that has no
loss at some probe simply does not count there).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from research.results.values import as_array
from research.results.values import present as _clean

_TINY = 1e-300
_EPS = 1e-15


# ---------------------------------------------------------------------------------------------------------
# Incomplete beta and the Student t distribution


def _beta_cf(a: float, b: float, x: float, max_iter: int = 100_000) -> float:
    """Continued fraction of I_x(a, b) (without its prefactor), by the modified Lentz method.

    The fraction is 1 / (1 + d1 / (1 + d2 / (1 + ...))) with
        d_{2m+1} = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1))
        d_{2m}   =  m (b - m) x / ((a + 2m - 1)(a + 2m)).
    """
    f = _TINY
    c = f
    d = 0.0
    for j in range(1, 2 * max_iter + 2):
        if j == 1:
            num = 1.0
        else:
            k = j - 1  # index of the d coefficient
            m = k // 2
            if k % 2 == 1:
                num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
            else:
                num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + num * d
        if abs(d) < _TINY:
            d = _TINY
        c = 1.0 + num / c
        if abs(c) < _TINY:
            c = _TINY
        d = 1.0 / d
        delta = c * d
        f *= delta
        if abs(delta - 1.0) < _EPS:
            return f
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc needs a > 0 and b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1, got x={x}")
    if x == 0.0 or x == 1.0:
        return x
    log_front = (a * math.log(x) + b * math.log1p(-x)
                 + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b))
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def t_sf2(t: float, dof: float) -> float:
    """Two-sided tail probability P(|T| >= |t|) of Student's t with `dof` degrees of freedom.

    dof may be fractional (Welch) or math.inf (standard normal)."""
    t = abs(float(t))
    if math.isnan(t) or math.isnan(dof):
        return math.nan
    if dof <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {dof}")
    if math.isinf(t):
        return 0.0
    if math.isinf(dof):
        return math.erfc(t / math.sqrt(2.0))
    return min(1.0, betainc(dof / 2.0, 0.5, dof / (dof + t * t)))


def t_cdf(t: float, dof: float) -> float:
    """P(T <= t) for Student's t with `dof` degrees of freedom (math.inf: standard normal)."""
    half_tail = 0.5 * t_sf2(t, dof)
    return 1.0 - half_tail if t > 0 else half_tail


def t_ppf(q: float, dof: float) -> float:
    """Quantile of Student's t: the t with t_cdf(t, dof) = q, found by bisection on the CDF."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {q}")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_ppf(1.0 - q, dof)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, dof) < q:
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, dof) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def t_critical(dof: float, confidence: float = 0.95) -> float:
    """Two-sided critical value: P(|T| <= t_critical) = confidence (dof 2 -> 4.3027, dof 4 -> 2.7764)."""
    return t_ppf(1.0 - (1.0 - confidence) / 2.0, dof)


# ---------------------------------------------------------------------------------------------------------
# What the studies use


def mean_ci95(values: Iterable) -> tuple[float, float]:
    """(mean, half width of the 95% confidence interval of the mean) of independent samples (e.g. seeds).

    half width = t_{0.975, n-1} * s / sqrt(n), s the sample standard deviation (ddof=1).
    None / NaN entries are dropped. With n = 1 the half width is NaN (one run gives no interval: callers
    show the value alone, never a band of zero width); with n = 0 both are NaN."""
    x = _clean(values)
    n = len(x)
    if n == 0:
        return math.nan, math.nan
    mean = float(x.mean())
    if n == 1:
        return mean, math.nan
    s = float(x.std(ddof=1))
    return mean, t_critical(n - 1) * s / math.sqrt(n)


def _welch_parts(a, b):
    a, b = _clean(a), _clean(b)
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        return None
    ma, mb = float(a.mean()), float(b.mean())
    va, vb = float(a.var(ddof=1)) / na, float(b.var(ddof=1)) / nb
    se2 = va + vb
    dof = se2 * se2 / (va * va / (na - 1) + vb * vb / (nb - 1)) if se2 > 0 else math.nan
    return ma, mb, se2, dof


def welch_t_test(a: Iterable, b: Iterable) -> tuple[float, float, float]:
    """Welch's unequal-variance t-test of mean(a) == mean(b): returns (t, dof, two-sided p).

    t = (mean_a - mean_b) / sqrt(s_a^2/n_a + s_b^2/n_b); dof by Welch-Satterthwaite:
    (s_a^2/n_a + s_b^2/n_b)^2 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1)).
    None / NaN entries are dropped. Fewer than 2 values in either sample: (nan, nan, nan) (no test is
    possible). Both samples without any spread: t = 0, p = 1 if the means are equal, else t = +-inf, p = 0
    (dof nan in both cases)."""
    parts = _welch_parts(a, b)
    if parts is None:
        return math.nan, math.nan, math.nan
    ma, mb, se2, dof = parts
    if se2 == 0:
        if ma == mb:
            return 0.0, math.nan, 1.0
        return math.copysign(math.inf, ma - mb), math.nan, 0.0
    t = (ma - mb) / math.sqrt(se2)
    return t, dof, t_sf2(t, dof)


def diff_ci95(a: Iterable, b: Iterable) -> tuple[float, float]:
    """(mean(a) - mean(b), half width of its 95% CI by Welch: t_{0.975, dof} * sqrt(s_a^2/n_a + s_b^2/n_b)).

    Half width NaN when either sample has fewer than 2 values; 0 when neither has any spread."""
    a_c, b_c = _clean(a), _clean(b)
    if len(a_c) == 0 or len(b_c) == 0:
        return math.nan, math.nan
    diff = float(a_c.mean() - b_c.mean())
    parts = _welch_parts(a_c, b_c)
    if parts is None:
        return diff, math.nan
    _, _, se2, dof = parts
    if se2 == 0:
        return diff, 0.0
    return diff, t_critical(dof) * math.sqrt(se2)


def roughly_equal(a: float, b: float, rel_tol: float = 0.03) -> bool:
    """The studies' rule for calling two values equal: |a - b| < rel_tol * (|a| + |b|) / 2.

    That is, the difference is below rel_tol (e.g. 0.03 = 3%) of the mean of the two magnitudes. Identical
    values are equal (also when both are 0); NaN is equal to nothing. This is only the effect-size half of
    the rule: with several seeds per condition the studies also require that Welch's test does not reject
    equality (p >= 0.05); see research/analysis/qk_norm.py."""
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return False
    if a == b:
        return True
    return abs(a - b) < rel_tol * (abs(a) + abs(b)) / 2.0


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties get the mean of their ranks."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=float)
    ranks[order] = np.arange(1, len(x) + 1, dtype=float)
    for v in np.unique(x):
        tie = x == v
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation of paired values (Pearson correlation of their ranks, ties averaged).

    NaN when fewer than 2 complete pairs or when either side is constant."""
    xa, ya = as_array(x), as_array(y)
    keep = ~(np.isnan(xa) | np.isnan(ya))
    xa, ya = xa[keep], ya[keep]
    if len(xa) < 2:
        return math.nan
    rx, ry = _ranks(xa), _ranks(ya)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum() / den) if den > 0 else math.nan
