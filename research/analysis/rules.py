"""The equality rule of the QK-norm study, and the per-seed final values it is applied to.

Two conditions are "equal" in a quantity when the difference of their means is below a relative
threshold of the mean of the two AND, when both have >= 2 seeds, Welch's t-test does not reject
equality at ALPHA. Pure functions of results dicts (runs: condition -> one results dict per seed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from research.analysis.stats import diff_ci95, mean_ci95, roughly_equal, welch_t_test
from research.results.read import last
from research.results.values import present
from research.results.vocabulary import QK_CONDITIONS

PR_REL_TOL = 0.03  # PR differences of a few percent show in the write-ups' curves
LOSS_REL_TOL = 0.005  # their losses sit within ~2% of each other; 0.5% is ~0.02 nats at loss 3.6
ALPHA = 0.05
FINAL_FIELDS = ("mean_pr", "loss", "val_loss")


def conditions(runs: dict) -> list[str]:
    """Conditions with at least one run: the study's three in A, B, C order, then any others."""
    known = [c for c in QK_CONDITIONS if runs.get(c)]
    return known + [c for c in runs if c not in QK_CONDITIONS and runs.get(c)]


def runs_of(runs: dict, cond: str) -> list[dict]:
    r = runs.get(cond) or []
    return [r] if isinstance(r, dict) else list(r)


def finals(runs: dict, cond: str, field: str) -> list[float]:
    """The last value of `field` in every seed of a condition."""
    return [last(r, field) for r in runs_of(runs, cond)]


@dataclass(frozen=True)
class Comparison:
    """Two conditions' per-seed values under the equality rule (first minus second)."""

    mean_a: float
    mean_b: float
    diff: float
    diff_ci95: float
    rel: float  # |difference| / mean of the two magnitudes
    close: bool  # below the threshold
    tested: bool  # both sides have >= 2 seeds, so Welch's test ran
    t: float
    dof: float
    p: float
    equal: bool
    rel_tol: float


def compare(a_values, b_values, rel_tol: float, alpha: float = ALPHA) -> Comparison:
    """equal = |mean_a - mean_b| < rel_tol * mean of |means| (research.analysis.stats.roughly_equal), AND,
    when both sides have >= 2 values, Welch's p >= alpha."""
    ma, _ = mean_ci95(a_values)
    mb, _ = mean_ci95(b_values)
    na, nb = len(present(a_values)), len(present(b_values))
    close = roughly_equal(ma, mb, rel_tol)
    scale = (abs(ma) + abs(mb)) / 2
    rel = abs(ma - mb) / scale if scale > 0 else 0.0
    tested = na >= 2 and nb >= 2
    t, dof, p = welch_t_test(a_values, b_values) if tested else (math.nan, math.nan, math.nan)
    diff, diff_half = diff_ci95(a_values, b_values)
    equal = close and (not tested or p >= alpha)
    return Comparison(mean_a=ma, mean_b=mb, diff=diff, diff_ci95=diff_half, rel=rel, close=close, tested=tested,
                      t=t, dof=dof, p=p, equal=equal, rel_tol=rel_tol)


def rule_text(rel_tol: float, quantity: str) -> str:
    return (f"two conditions are called equal in {quantity} when the difference of their means is below "
            f"{rel_tol:.1%} of the mean of the two AND, when both have at least 2 seeds, Welch's t-test does "
            f"not reject equality (p \u2265 {ALPHA})")
