"""Decisions of the QK-norm study: learned gain (A), gain frozen at 1 (B), no QK-norm (C).

Pure functions of results dicts (runs: condition -> one results dict per seed), each returning
a small frozen dataclass that the figures and the report receive:

    compare(a, b, rel_tol)  -> Comparison     the equality rule on two conditions' per-seed values
    triangulate(runs)       -> Verdict        A != B ~ C: gain; A ~ B != C: normalization; all differ: both
    claims(runs)            -> dict[str, Claim]   the write-ups' four claims
    u_shape(trajectory)     -> UShape
    analyze(runs)           -> QkNormAnalysis everything the figures and report need

"Final" values are the last entry of a run's `mean_pr`, `loss` and `val_loss`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.series import aligned
from research.analysis.stats import diff_ci95, mean_ci95, roughly_equal, spearman_rho, welch_t_test
from research.results.read import last, layer_keys, seed_of
from research.results.values import as_float, json_safe
from research.results.vocabulary import LETTERS, QK_CONDITIONS, label

# The equality rule (stated in report.md): two conditions are "equal" in a quantity when the difference of
# their means is below REL_TOL of the mean of the two, AND, when both have >= 2 seeds, Welch's t-test does
# not reject equality at ALPHA. Key PR differences of a few percent are visible in the write-ups' curves;
# losses of the three conditions sit within ~2% of each other, so loss uses a finer threshold (0.5% is
# ~0.02 nats at loss 3.6).
PR_REL_TOL = 0.03
LOSS_REL_TOL = 0.005
ALPHA = 0.05
# U-shaped trajectory: the minimum of mean_pr lies strictly inside, and both the start and the end are
# above the minimum by at least U_MARGIN of the minimum.
U_MARGIN = 0.05
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


# ---------------------------------------------------------------------------------------------------------
# The equality rule and the verdict


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
    n_a: int
    n_b: int
    rel_tol: float


def compare(a_values, b_values, rel_tol: float, alpha: float = ALPHA) -> Comparison:
    """equal = |mean_a - mean_b| < rel_tol * mean of |means| (research.analysis.stats.roughly_equal), AND,
    when both sides have >= 2 values, Welch's p >= alpha."""
    ma, _ = mean_ci95(a_values)
    mb, _ = mean_ci95(b_values)
    na = int(np.isfinite(np.array([as_float(v) for v in a_values], dtype=float)).sum())
    nb = int(np.isfinite(np.array([as_float(v) for v in b_values], dtype=float)).sum())
    close = roughly_equal(ma, mb, rel_tol)
    scale = (abs(ma) + abs(mb)) / 2
    rel = abs(ma - mb) / scale if scale > 0 else 0.0
    tested = na >= 2 and nb >= 2
    t, dof, p = welch_t_test(a_values, b_values) if tested else (math.nan, math.nan, math.nan)
    diff, diff_half = diff_ci95(a_values, b_values)
    equal = close and (not tested or p >= alpha)
    return Comparison(mean_a=ma, mean_b=mb, diff=diff, diff_ci95=diff_half, rel=rel, close=close, tested=tested,
                      t=t, dof=dof, p=p, equal=equal, n_a=na, n_b=nb, rel_tol=rel_tol)


def rule_text(rel_tol: float, quantity: str) -> str:
    return (f"two conditions are called equal in {quantity} when the difference of their means is below "
            f"{rel_tol:.1%} of the mean of the two AND, when both have at least 2 seeds, Welch's t-test does "
            f"not reject equality (p \u2265 {ALPHA})")


@dataclass(frozen=True)
class Verdict:
    """The triangulation verdict on the final mean key PR."""

    verdict: str
    key: str  # gain / normalization / both / neither / unclear / qknorm / none
    tentative: bool  # a "different" call rests on a difference Welch's test does not find significant
    pairs: dict  # (x, y) -> Comparison
    rule: str
    rule_short: str
    rule_applied: str


def triangulate(runs: dict, rel_tol: float = PR_REL_TOL) -> Verdict:
    """A != B ~ C: the gain drives rank; A ~ B != C: the normalization does; all differ: both."""
    pairs = {}
    for x, y in (("QK", "QK_frozen"), ("QK_frozen", "NoQK"), ("QK", "NoQK")):
        if runs.get(x) and runs.get(y) and np.isfinite(finals(runs, x, "mean_pr")).any() \
                and np.isfinite(finals(runs, y, "mean_pr")).any():
            pairs[(x, y)] = compare(finals(runs, x, "mean_pr"), finals(runs, y, "mean_pr"), rel_tol)
    ab, bc, ac = pairs.get(("QK", "QK_frozen")), pairs.get(("QK_frozen", "NoQK")), pairs.get(("QK", "NoQK"))
    if ab and bc:
        if not ab.equal and bc.equal:
            key, verdict = "gain", "gain drives rank (A\u2260B\u2248C)"
        elif ab.equal and not bc.equal:
            key, verdict = "normalization", "normalization drives rank (A\u2248B\u2260C)"
        elif not ab.equal and not bc.equal:
            key, verdict = "both", "both gain and normalization drive rank (all differ: A\u2260B, B\u2260C)"
            if ac and ac.equal:
                verdict += "; their effects cancel (A\u2248C)"
        elif ac and not ac.equal:
            key, verdict = "unclear", ("unclear: A\u2248B and B\u2248C but A\u2260C (small effects of both, "
                                       "each below the threshold)")
        else:
            key, verdict = "neither", "neither: A\u2248B\u2248C, QK-norm does not change key rank here"
    elif ac:
        key = "qknorm"
        verdict = ("QK-norm " + ("does not change" if ac.equal else "changes") + " key rank (A"
                   + ("\u2248" if ac.equal else "\u2260") + "C); without the frozen-gain run (B) gain and "
                   "normalization cannot be separated")
    else:
        key, verdict = "none", "no verdict: needs at least two of QK, QK_frozen, NoQK"
    weak = [f"{LETTERS[x]} vs {LETTERS[y]} (p = {c.p:.2g})" for (x, y), c in pairs.items()
            if c.tested and not c.equal and c.p >= ALPHA]
    if weak and key != "none":
        verdict += ("; tentative: the difference " + ", ".join(weak) + " is above the threshold but not "
                    "significant, more seeds would be needed")
    tested = [p.tested for p in pairs.values()]
    if tested and all(tested):
        applied = "threshold and Welch test (every condition has at least 2 seeds)"
    elif any(tested):
        applied = "threshold and Welch test where both conditions have at least 2 seeds, threshold only elsewhere"
    else:
        applied = "threshold only (one run per condition, so no test is possible)"
    short = (f"equal when |difference| < {rel_tol:.0%} of the mean"
             + (f" and Welch p \u2265 {ALPHA}" if any(tested) else " (one run each: no test)"))
    return Verdict(verdict=verdict, key=key, tentative=bool(weak), pairs=pairs, rule=rule_text(rel_tol, "final PR"),
                   rule_short=short, rule_applied=applied)


# ---------------------------------------------------------------------------------------------------------
# The write-ups' claims


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


def _claim_gain(runs: dict, tri: Verdict) -> Claim:
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


def claims(runs: dict, tri: Verdict | None = None) -> dict[str, Claim]:
    """The write-ups' four claims checked on these runs, keyed a-d."""
    tri = tri or triangulate(runs)
    conds = [c for c in QK_CONDITIONS if runs.get(c)]
    fin = {c: {f: mean_ci95(finals(runs, c, f))[0] for f in FINAL_FIELDS} for c in conds}
    return {"a": _claim_gain(runs, tri), "b": _claim_pr_not_loss(runs, conds, fin),
            "c": _claim_u_shape(runs, conds), "d": _claim_frozen_worse(runs, conds)}


# ---------------------------------------------------------------------------------------------------------
# Tables and per-layer effects


def summary(runs: dict) -> dict:
    """condition -> final PR / train loss / val loss: mean over seeds, 95% CI half width, per-seed values.

    Keys per condition: n, seeds, tokens (final tokens per seed), and for each of final_pr, final_loss,
    final_val_loss: the mean, `<name>_ci95` (half width; None with one seed) and `<name>_per_seed`.
    Undefined values are None so the dict can go straight into combined.json."""
    out = {}
    for c in conditions(runs):
        rl = runs_of(runs, c)
        entry = {"tag": c, "label": label(c), "n": len(rl), "seeds": [seed_of(r) for r in rl],
                 "tokens": [r["tokens"][-1] if r["tokens"] else None for r in rl]}
        for name, field in (("final_pr", "mean_pr"), ("final_loss", "loss"), ("final_val_loss", "val_loss")):
            values = finals(runs, c, field)
            mean, half = mean_ci95(values)
            entry[name] = json_safe(mean)
            entry[f"{name}_ci95"] = json_safe(half)
            entry[f"{name}_per_seed"] = [json_safe(v) for v in values]
        out[c] = entry
    return out


@dataclass(frozen=True)
class PairDifference:
    """First minus second condition in one final quantity: difference, its 95% CI (Welch), p."""

    a: str
    b: str
    field: str
    diff: float
    ci95: float
    p: float


def pairwise(runs: dict) -> list[PairDifference]:
    """Every pair of conditions (in A, B, C order) in final PR, train loss and val loss."""
    conds = conditions(runs)
    out = []
    for i, x in enumerate(conds):
        for y in conds[i + 1:]:
            for field in FINAL_FIELDS:
                a, b = finals(runs, x, field), finals(runs, y, field)
                d, h = diff_ci95(a, b)
                out.append(PairDifference(x, y, field, d, h, welch_t_test(a, b)[2]))
    return out


def layer_matrix(run_list: list[dict], layers: list[str], probe: int) -> tuple[np.ndarray, float]:
    """Y[n_runs, n_layers] of layer_pr at the common probe `probe` (-1: last, 0: first); tokens there."""
    tokens = sorted(set.intersection(*(set(r["tokens"]) for r in run_list))) if run_list else []
    if not tokens:
        return np.full((len(run_list), len(layers)), np.nan), math.nan
    t = tokens[probe]
    y = np.full((len(run_list), len(layers)), np.nan)
    for i, r in enumerate(run_list):
        j = r["tokens"].index(t)
        for k, layer in enumerate(layers):
            values = (r.get("layer_pr") or {}).get(layer)
            if values is not None and j < len(values):
                y[i, k] = as_float(values[j])
    return y, float(t)


@dataclass(frozen=True)
class LayerEffect:
    """Per layer, the difference of the final layer PR of two conditions (first minus second)."""

    a: str
    b: str
    kind: str  # gain (A-B), normalization (B-C) or total (A-C, when B is missing)
    mean: np.ndarray  # [n_layers]
    ci95: np.ndarray  # [n_layers], NaN with one run per condition


@dataclass(frozen=True)
class LayerEffects:
    layers: list[str]
    effects: list[LayerEffect]  # empty when fewer than two of the three conditions ran
    one_run_each: bool


def layer_effects(runs: dict) -> LayerEffects:
    """The causal decomposition per layer: A-B (gain) and B-C (normalization); A-C when B is missing."""
    have = [c for c in QK_CONDITIONS if runs.get(c)]
    pairs = []
    if "QK" in have and "QK_frozen" in have:
        pairs.append(("QK", "QK_frozen", "gain"))
    if "QK_frozen" in have and "NoQK" in have:
        pairs.append(("QK_frozen", "NoQK", "normalization"))
    if not pairs and "QK" in have and "NoQK" in have:
        pairs.append(("QK", "NoQK", "total"))
    layers = layer_keys([r for c in have for r in runs_of(runs, c)])
    mats = {c: layer_matrix(runs_of(runs, c), layers, -1)[0] for c in have}
    effects = []
    for a, b, kind in (pairs if layers else []):
        d = np.array([diff_ci95(mats[a][:, i], mats[b][:, i]) for i in range(len(layers))]).reshape(-1, 2)
        effects.append(LayerEffect(a, b, kind, d[:, 0], d[:, 1]))
    return LayerEffects(layers, effects, all(m.shape[0] == 1 for m in mats.values()))


# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QkNormAnalysis:
    """Everything the figures and the report of the QK-norm study draw from."""

    conditions: list[str]
    verdict: Verdict
    claims: dict  # a-d -> Claim
    summary: dict  # combined.json's per-condition finals
    pairwise: list[PairDifference]
    layer_effects: LayerEffects


def analyze(runs: dict) -> QkNormAnalysis:
    tri = triangulate(runs)
    return QkNormAnalysis(conditions=conditions(runs), verdict=tri, claims=claims(runs, tri),
                          summary=summary(runs), pairwise=pairwise(runs), layer_effects=layer_effects(runs))
