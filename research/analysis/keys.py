"""Key dynamics: the per-layer key series over training, layer groups, and where each layer ended.

Per layer, over training, at the k_norm hook (pre-RoPE keys, mean over the layer's KV heads):
norm_mean, max_abs ("outlier magnitude"), peak_frac, cos_mean ("redundancy") and std, read
from `probes[*].layers[*].means["k_norm.<metric>"]`. With several seeds the per-layer series
are averaged over seeds (probe by probe).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.series import mean_over_seeds, nanmean
from research.results.read import d_head_of, layer_series, probe_tokens, seeds_text
from research.results.vocabulary import MAIN_SITE

SITE = MAIN_SITE
METRICS = ("norm_mean", "max_abs", "peak_frac", "cos_mean", "std")
DEFAULT_D_HEAD = 64  # when a file records neither the config nor any gain
AT_TOLERANCE = 0.01  # a final norm within +-1% of sqrt(d_head) counts as "at" sqrt(d_head)


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


def classify_layers(final_norms, d_head: int, tol: float = AT_TOLERANCE) -> dict[str, list[int]]:
    """Layers whose final norm ends above / below / within tol of sqrt(d_head)."""
    ref = math.sqrt(d_head)
    out = {"above": [], "below": [], "at": []}
    for i, v in enumerate(final_norms):
        if not np.isfinite(v):
            continue
        out["above" if v > ref * (1 + tol) else "below" if v < ref * (1 - tol) else "at"].append(i)
    return out


@dataclass(frozen=True)
class KeyDynamics:
    """One condition: seed-averaged per-layer series and the decisions drawn from them."""

    tokens: np.ndarray  # [n_probes]
    series: dict  # metric -> [n_probes, n_layers]
    n_layers: int
    d_head: int
    d_source: str  # where d_head came from
    n_seeds: int
    seeds: str  # seeds_text
    groups: dict  # layer_groups(n_layers)
    ended: dict  # classify_layers of the final norms
    final_norm_std: np.ndarray | None  # per layer, spread over seeds (None with one seed)


def condition_dynamics(results: list[dict]) -> KeyDynamics | None:
    """The key dynamics of one condition, or None if no run has probe records."""
    with_probes = [r for r in results if r.get("probes")]
    if not with_probes:
        return None
    series = {m: mean_over_seeds([layer_series(r, m, SITE) for r in with_probes]) for m in METRICS}
    n = series["norm_mean"].shape[0]
    L = series["norm_mean"].shape[1]
    if n == 0 or L == 0:
        return None
    d_head, d_source = d_head_of(with_probes[0])
    if d_head is None:
        d_head, d_source = DEFAULT_D_HEAD, f"not recorded in the file; assumed {DEFAULT_D_HEAD}"
    spread = None
    if len(with_probes) > 1:
        per_seed = np.array([layer_series(r, "norm_mean", SITE)[-1] for r in with_probes])
        spread = np.nanstd(per_seed, axis=0)
    return KeyDynamics(tokens=probe_tokens(with_probes[0])[:n], series=series, n_layers=L, d_head=d_head,
                       d_source=d_source, n_seeds=len(with_probes), seeds=seeds_text(with_probes),
                       groups=layer_groups(L), ended=classify_layers(series["norm_mean"][-1], d_head),
                       final_norm_std=spread)


def analyze(runs: dict[str, list[dict]]) -> dict[str, KeyDynamics | None]:
    """condition -> its key dynamics (None: no probe records, only the write-ups' summary fields)."""
    return {cond: condition_dynamics(results) for cond, results in runs.items()}
