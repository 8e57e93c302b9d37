"""Key dynamics: the per-layer key series over training, where each layer ended, and how much of the
change weight decay on the gains explains.

Per layer, over training, at the k_norm hook (mean over the layer's KV heads): norm_mean, max_abs, peak_frac,
cos_mean and std. Series are averaged over seeds for the figures; every claim is decided per seed by
research.analysis.rules, on per-seed log ratios (a key norm is a ratio quantity): where a layer ended against
sqrt(d_head), how a layer group's norm changed, and weight decay's part of that change (when the study ran QK with
and without weight decay on the gains).
How the parts are decided and printed: docs/decisions.md, "Ratio quantities" and "Numbers derived from comparisons".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.rules import DESCRIPTIVE, MARGIN, RATIO, Paired, by_seed, decide
from research.analysis.series import nanmean, seed_mean
from research.results.read import d_head_of, layer_series, seeds_text
from research.results.vocabulary import MAIN_SITE

SITE = MAIN_SITE
METRICS = ("norm_mean", "max_abs", "peak_frac", "cos_mean", "std")
DEFAULT_D_HEAD = 64  # when a file records neither the config nor any gain
WITH_WD, WITHOUT_WD = "QK", "QK_no_gain_wd"  # the study's conditions: weight decay on the gains on and off


def layer_groups(n_layers: int) -> dict[str, list[int]]:
    """early: first two layers, middle: L//2 - 1 and L//2, final: last two (clipped to the model)."""
    def clip(ix):
        return sorted({min(max(i, 0), n_layers - 1) for i in ix})
    L = n_layers
    return {"early": clip([0, 1]), "middle": clip([L // 2 - 1, L // 2]), "final": clip([L - 2, L - 1])}


def group_of(layer: int, groups: dict[str, list[int]]) -> str:
    names = [g for g, ix in groups.items() if layer in ix]
    return "/".join(names) if names else "-"


def group_mean(values: np.ndarray, layers: list[int]) -> np.ndarray:
    """[n_probes, n_layers] -> [n_probes]: the mean over a group's layers."""
    return nanmean(values[:, layers], axis=1)


@dataclass(frozen=True)
class KeyDynamics:
    """One condition: seed-averaged per-layer series and where each layer ended."""

    tokens: np.ndarray  # [n_probes]: the token counts every seed was probed at
    series: dict  # metric -> [n_probes, n_layers], the mean over seeds at those token counts
    n_layers: int
    d_head: int
    d_source: str  # where d_head came from
    n_seeds: int
    seeds: str  # seeds_text
    groups: dict  # layer_groups(n_layers)
    ended: dict  # layer -> Decision of its final norm minus sqrt(d_head)
    final_norm_std: np.ndarray | None  # per layer, spread over seeds (None with one seed)

    def ended_where(self, layer: int) -> str:
        """above / below / at sqrt(d_head), or undecided (descriptive with one seed: sign beyond the margin)."""
        d = self.ended[layer]
        if d.outcome == DESCRIPTIVE:
            return "above" if d.est > d.margin else "below" if d.est < -d.margin else "at"
        if d.differs:
            return "above" if d.est > 0 else "below"
        return "at" if d.same else "undecided"


def _final_norm(res: dict, layer: int) -> float:
    s = layer_series(res, "norm_mean", SITE)
    return float(s[-1, layer]) if s.size else math.nan


def condition_dynamics(results: list[dict], margin: float = MARGIN) -> KeyDynamics | None:
    """The key dynamics of one condition, or None if no run has probe records."""
    with_probes = [r for r in results if r.get("probes")]
    if not with_probes:
        return None
    # seeds averaged at the token counts all of them were probed at, never by position
    means = {m: seed_mean(with_probes, lambda r, m=m: layer_series(r, m, SITE)) for m in METRICS}
    tokens, series = means["norm_mean"][0], {m: y for m, (_, y) in means.items()}
    n, L = series["norm_mean"].shape
    if n == 0 or L == 0:
        return None
    d_head, d_source = d_head_of(with_probes[0])
    if d_head is None:
        d_head, d_source = DEFAULT_D_HEAD, f"not recorded in the file; assumed {DEFAULT_D_HEAD}"
    ref = math.sqrt(d_head)
    ended = decide({i: Paired.ratio([_final_norm(r, i) for r in with_probes], [ref] * len(with_probes),
                                    names=(f"layer {i}'s final key norm", "sqrt(d_head)")) for i in range(L)}, margin)
    spread = None
    if len(with_probes) > 1:
        spread = np.nanstd(np.array([layer_series(r, "norm_mean", SITE)[-1] for r in with_probes]), axis=0)
    return KeyDynamics(tokens=tokens, series=series, n_layers=L, d_head=d_head,
                       d_source=d_source, n_seeds=len(with_probes), seeds=seeds_text(with_probes),
                       groups=layer_groups(L), ended=ended, final_norm_std=spread)


def _group_ends(res: dict, layers: list[int]) -> tuple[float, float]:
    """(initial, final) mean key norm of a group of layers in one run (NaN without two probes)."""
    s = layer_series(res, "norm_mean", SITE)
    if s.shape[0] < 2:
        return math.nan, math.nan
    g = group_mean(s, layers)
    return float(g[0]), float(g[-1])


def weight_decay_part(on: dict, off: dict, group: str) -> Paired:
    """Weight decay's part of a group's norm change, paired by seed, from {seed: (initial, final) norm} with and without
    it: per seed the log ratio of the growths, ln((final / initial with) / (final / initial without)), which is
    ln(growth with) - ln(growth without); in units beside it the change with minus the change without. A norm of 0 or
    below is a NotPositive naming the condition and the seed."""
    seeds = [s for s in on if s in off and np.isfinite([*on[s], *off[s]]).all()]
    x = {name: np.array([v[s] for s in seeds], float).reshape(-1, 2) for name, v in (("on", on), ("off", off))}
    growth = {name: Paired.ratio(v[:, 1], v[:, 0], tuple(seeds), (f"{cond}'s final {group} layers' key norm",
                                                                   "its initial"))
              for (name, v), cond in zip(x.items(), (WITH_WD, WITHOUT_WD))}
    change = {name: v[:, 1] - v[:, 0] for name, v in x.items()}
    ma, mb = (float(change[k].mean()) if seeds else math.nan for k in ("on", "off"))
    return Paired(growth["on"].diffs - growth["off"].diffs, ma, mb, (abs(ma) + abs(mb)) / 2, tuple(seeds), RATIO,
                  change["on"] - change["off"])


def weight_decay_shrink(res: dict) -> float | None:
    """(1 - lr x wd)^steps: the factor AdamW's decoupled weight decay alone applies to the gains over the run,
    at the peak learning rate (1 without weight decay on the gains; None when the file does not say)."""
    train = (res.get("config") or {}).get("train") or {}
    steps = res.get("steps") or []
    if not train or not steps:
        return None
    if not train.get("wd_on_gains"):
        return 1.0
    wd = train.get("adamw_weight_decay", train.get("weight_decay", 0.0))
    return (1 - train["adamw_lr"] * wd) ** steps[-1]


@dataclass(frozen=True)
class KeysAnalysis:
    conditions: dict  # condition -> KeyDynamics or None (no probe records)
    group_changes: dict  # (condition, group) -> Decision of final against initial group norm (log ratios)
    weight_decay: dict  # group -> Decision of the growth with against without weight decay on the gains (log ratios)
    shrink: dict  # condition -> factor weight decay alone applies to the gains (None if unknown)
    margin: float

    def early_shrink_late_grow(self, cond: str) -> str:
        """The write-ups' claim in one condition: the early group's norm falls and the final group's rises
        (holds / fails / inconclusive / not tested)."""
        early, final = self.group_changes.get((cond, "early")), self.group_changes.get((cond, "final"))
        if early is None or final is None or not (early.tested and final.tested):
            return "not tested"
        if early.differs and early.est < 0 and final.differs and final.est > 0:
            return "holds"
        return "fails" if early.decided and final.decided else "inconclusive"


def analyze(runs: dict[str, list[dict]], margin: float = MARGIN) -> KeysAnalysis:
    conds = {cond: condition_dynamics(results, margin) for cond, results in runs.items()}
    changes = {}
    for cond, k in conds.items():
        if k is None:
            continue
        with_probes = [r for r in runs[cond] if r.get("probes")]
        for g, layers in k.groups.items():
            first, final = np.array([_group_ends(r, layers) for r in with_probes], float).reshape(-1, 2).T
            changes[(cond, g)] = Paired.ratio(final, first, names=(f"{cond}'s final {g} layers' key norm",
                                                                   "its initial"))
    wd = {}
    if conds.get(WITH_WD) and conds.get(WITHOUT_WD):
        for g, layers in conds[WITH_WD].groups.items():
            on = by_seed([r for r in runs[WITH_WD] if r.get("probes")], lambda r: _group_ends(r, layers))
            off = by_seed([r for r in runs[WITHOUT_WD] if r.get("probes")], lambda r: _group_ends(r, layers))
            wd[g] = weight_decay_part(on, off, g)
    shrink = {cond: weight_decay_shrink(results[0]) if results else None for cond, results in runs.items()}
    return KeysAnalysis(conds, decide(changes, margin), decide(wd, margin), shrink, margin)
