"""The write-ups' four claims about the QK-norm study, checked on a set of runs.

    (a) the learned gain drives key PR (A != B and B ~ C)
    (b) key PR does not predict loss
    (c) the PR trajectory is U-shaped (falls, then recovers)
    (d) a frozen gain is worse than no QK-norm (final train loss B > C)

`claims(runs, verdict)` returns a Claim per letter: a status (holds / does not hold / partly /
cannot be tested) and the evidence in words.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.rules import FINAL_FIELDS, LOSS_REL_TOL, PR_REL_TOL, compare, finals, runs_of
from research.analysis.series import aligned
from research.analysis.stats import mean_ci95, spearman_rho
from research.results.values import as_float
from research.results.vocabulary import LETTERS, QK_CONDITIONS

# U-shaped trajectory: the minimum of mean_pr lies strictly inside, and both the start and the end are
# above the minimum by at least U_MARGIN of the minimum.
U_MARGIN = 0.05


@dataclass(frozen=True)
class UShape:
    u: bool
    reason: str  # why not, when not
    start: float
    min: float
    end: float
    i_min: int  # index of the minimum in the trajectory (-1 when untestable)
    n: int


def u_shape(y) -> UShape:
    """Is a trajectory U-shaped? min strictly inside, start and end above it by >= U_MARGIN of the min."""
    y = np.array([as_float(v) for v in y], dtype=float)
    ok = np.isfinite(y)
    if ok.sum() < 3:
        return UShape(False, "fewer than 3 probes", math.nan, math.nan, math.nan, -1, len(y))
    idx = np.flatnonzero(ok)
    vals = y[idx]
    i = int(np.argmin(vals))
    start, low, end = float(vals[0]), float(vals[i]), float(vals[-1])
    margin = U_MARGIN * abs(low)
    inside = 0 < i < len(vals) - 1
    falls, rises = start - low >= margin, end - low >= margin
    if not inside:
        reason = "minimum at the " + ("start" if i == 0 else "end")
    elif not falls:
        reason = f"falls by only {start - low:.2f} (< margin {margin:.2f})"
    elif not rises:
        reason = f"recovers by only {end - low:.2f} (< margin {margin:.2f})"
    else:
        reason = ""
    return UShape(inside and falls and rises, reason, start, low, end, int(idx[i]), len(y))


@dataclass(frozen=True)
class Claim:
    claim: str
    status: str  # holds / does not hold / partly / cannot be tested (+ " (tentative)")
    text: str  # the evidence


def _mean_traj(runs: dict, cond: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = aligned(runs_of(runs, cond), lambda r: r["mean_pr"])
    return x, (np.nanmean(y, axis=0) if y.size else np.zeros(0))


def _claim_gain(tri) -> Claim:
    ab, bc = tri.pairs.get(("QK", "QK_frozen")), tri.pairs.get(("QK_frozen", "NoQK"))
    if ab and bc:
        status = "holds" if tri.key == "gain" else "does not hold"
        if tri.tentative:
            status += " (tentative)"
        text = (f"A\u2212B = {ab.diff:+.1f} ({ab.rel:.1%} of the mean, "
                f"{'equal' if ab.equal else 'different'}), B\u2212C = {bc.diff:+.1f} ({bc.rel:.1%}, "
                f"{'equal' if bc.equal else 'different'}); verdict: {tri.verdict}.")
    else:
        status, text = "cannot be tested", "needs QK, QK_frozen and NoQK."
    return Claim("the learned gain drives key PR (A\u2260B and B\u2248C)", status, text)


def _claim_pr_not_loss(runs: dict, conds: list[str], fin: dict) -> Claim:
    claim = "key PR does not predict loss"
    if len(conds) < 2:
        return Claim(claim, "cannot be tested", "needs at least two conditions.")
    lines, n_conc, n_other = [], 0, 0
    for i, x in enumerate(conds):
        for y in conds[i + 1:]:
            pr = compare(finals(runs, x, "mean_pr"), finals(runs, y, "mean_pr"), PR_REL_TOL)
            lo = compare(finals(runs, x, "loss"), finals(runs, y, "loss"), LOSS_REL_TOL)
            lx, ly = LETTERS[x], LETTERS[y]
            if not all(map(math.isfinite, (pr.mean_a, pr.mean_b, lo.mean_a, lo.mean_b))):
                lines.append(f"{lx} vs {ly}: no final PR or train loss to compare")
                continue
            if pr.equal and lo.equal:
                kind = "neither PR nor loss differs"
            elif pr.equal:
                kind, n_other = "loss differs but PR does not", n_other + 1
            elif lo.equal:
                kind, n_other = "PR differs but loss does not", n_other + 1
            elif (pr.diff > 0) == (lo.diff < 0):
                kind, n_conc = "concordant: the higher-PR condition has the lower loss", n_conc + 1
            else:
                kind, n_other = "discordant: the higher-PR condition has the higher loss", n_other + 1
            lines.append(f"{lx} vs {ly}: PR {pr.diff:+.1f} ({pr.rel:.1%}), train loss "
                         f"{lo.diff:+.3f} ({lo.rel:.2%}) \u2192 {kind}")
    by_pr = sorted(conds, key=lambda c: -fin[c]["mean_pr"])
    by_loss = sorted(conds, key=lambda c: fin[c]["loss"])
    rho = spearman_rho([fin[c]["mean_pr"] for c in conds], [fin[c]["loss"] for c in conds])
    status = "holds" if n_other else ("does not hold" if n_conc else "cannot be tested")
    text = (f"order by final PR (highest first): {' > '.join(LETTERS[c] for c in by_pr)}; by final train "
            f"loss (lowest first): {' < '.join(LETTERS[c] for c in by_loss)}; Spearman \u03c1(PR, loss) = "
            f"{rho:+.2f} over {len(conds)} conditions (\u22121 would mean higher PR always goes with lower "
            f"loss). Pairs (PR rule {PR_REL_TOL:.0%}, loss rule {LOSS_REL_TOL:.1%}): " + "; ".join(lines) + ".")
    return Claim(claim, status, text)


def _claim_u_shape(runs: dict, conds: list[str]) -> Claim:
    claim = "the PR trajectory is U-shaped (falls, then recovers)"
    if not conds:
        return Claim(claim, "cannot be tested", "no runs.")
    parts, n_u = [], 0
    for c in conds:
        x, traj = _mean_traj(runs, c)
        u = u_shape(traj)
        n_u += u.u
        per_seed = [u_shape(r["mean_pr"]).u for r in runs_of(runs, c)]
        seeds = f" (U-shaped in {sum(per_seed)} of {len(per_seed)} seeds)" if len(per_seed) > 1 else ""
        parts.append(f"{LETTERS[c]}: {u.start:.1f} \u2192 min {u.min:.1f} "
                     + (f"(at {x[u.i_min] / 1e6:.3g}M tokens) " if u.i_min >= 0 else "")
                     + f"\u2192 {u.end:.1f}, " + ("U-shaped" if u.u else f"not U-shaped ({u.reason})") + seeds)
    testable = sum(len(_mean_traj(runs, c)[1]) >= 3 for c in conds)
    status = "holds" if n_u == len(conds) else ("does not hold" if n_u == 0 else "partly")
    if not testable:
        status = "cannot be tested"
    text = (f"rule: the minimum of mean PR lies strictly inside the run and both the start and the end are "
            f"above it by at least {U_MARGIN:.0%} of the minimum. " + "; ".join(parts) + ".")
    return Claim(claim, status, text)


def _claim_frozen_worse(runs: dict, conds: list[str]) -> Claim:
    claim = "a frozen gain is worse than no QK-norm (final train loss B > C)"
    if not ("QK_frozen" in conds and "NoQK" in conds):
        return Claim(claim, "cannot be tested", "needs QK_frozen and NoQK.")
    lo = compare(finals(runs, "QK_frozen", "loss"), finals(runs, "NoQK", "loss"), LOSS_REL_TOL)
    va = compare(finals(runs, "QK_frozen", "val_loss"), finals(runs, "NoQK", "val_loss"), LOSS_REL_TOL)
    pr = compare(finals(runs, "QK_frozen", "mean_pr"), finals(runs, "NoQK", "mean_pr"), PR_REL_TOL)
    if not (math.isfinite(lo.mean_a) and math.isfinite(lo.mean_b)):
        status, how = "cannot be tested", "a final train loss is missing"
    elif lo.equal:
        status, how = "does not hold", "no difference by the rule"
    elif lo.diff > 0:
        status, how = "holds", "B's loss is higher"
    else:
        status, how = "does not hold", "B's loss is lower: the frozen gain trains better"
    text = (f"final train loss B {lo.mean_a:.3f} vs C {lo.mean_b:.3f} (B\u2212C {lo.diff:+.3f}, "
            f"{lo.rel:.2%}" + (f", Welch p = {lo.p:.3g}" if lo.tested else "") + f"): {how}. "
            f"Validation loss B\u2212C {va.diff:+.3f}" + (f" (p = {va.p:.3g})" if va.tested else "")
            + f". In key PR, B\u2212C = {pr.diff:+.1f} ("
            + ("no difference by the rule" if pr.equal else
               f"{'lower' if pr.diff < 0 else 'higher'} rank with the frozen gain") + ").")
    return Claim(claim, status, text)


def claims(runs: dict, tri) -> dict[str, Claim]:
    """The write-ups' four claims checked on these runs, keyed a-d; `tri` is their research.analysis.qk_norm
    Verdict."""
    conds = [c for c in QK_CONDITIONS if runs.get(c)]
    fin = {c: {f: mean_ci95(finals(runs, c, f))[0] for f in FINAL_FIELDS} for c in conds}
    return {"a": _claim_gain(tri), "b": _claim_pr_not_loss(runs, conds, fin),
            "c": _claim_u_shape(runs, conds), "d": _claim_frozen_worse(runs, conds)}
