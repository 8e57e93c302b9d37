"""Decisions of the QK-norm study: learned gain (A), gain frozen at 1 (B), no QK-norm (C).

Pure functions of results dicts (runs: condition -> one results dict per seed), each returning
a small frozen dataclass that the figures and the report receive:

    triangulate(runs)   -> Verdict          A != B ~ C: gain; A ~ B != C: normalization; all differ: both
    summary(runs)       -> dict             finals per condition (combined.json)
    pairwise(runs)      -> [PairDifference] every pair in final PR and losses
    layer_effects(runs) -> LayerEffects     the causal decomposition per layer
    analyze(runs)       -> QkNormAnalysis   all of the above and the write-ups' claims (research.analysis.claims)

The equality rule is research.analysis.rules; "final" values are the last entry of a run's
`mean_pr`, `loss` and `val_loss`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.claims import claims
from research.analysis.rules import ALPHA, FINAL_FIELDS, PR_REL_TOL, compare, conditions, finals, rule_text, runs_of
from research.analysis.stats import diff_ci95, mean_ci95, welch_t_test
from research.results.read import layer_keys, seed_of
from research.results.values import as_float, json_safe
from research.results.vocabulary import LETTERS, QK_CONDITIONS, label


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
