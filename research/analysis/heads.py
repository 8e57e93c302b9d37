"""Head specialization: per-head series, the layer to show, and the sink / gatherer taxonomy.

Per KV head over training, from the probe records: key norm, max_abs, pr_vec, attention entropy, sink mass and q/k
norm ratio, plus the layer's k_norm gains; attention metrics are the mean over the query heads a KV head serves.
Heads are not matched across seeds, so per-head series are never averaged over seeds. `classify` sorts the heads
at the last probe into sinks, gatherers and neither, by attention alone; whether sinks have longer keys than
gatherers is then decided per seed (research.analysis.rules).
The taxonomy's thresholds and why: docs/decisions.md, "Sinks and gatherers".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.rules import MARGIN, Decision, Paired, decide
from research.analysis.series import seed_mean
from research.results.read import d_head_of, layer_series, probe_tokens, seed_of, seeds_text
from research.results.values import as_float
from research.results.vocabulary import MAIN_SITE

TAXONOMY_MARGIN = 0.1
SINK_MASS = 0.3  # Gu et al. 2024
SITE = MAIN_SITE
HEAD_METRICS = ("norm_mean", "max_abs", "pr_vec")          # per KV head, from probes[*].layers[*].k_norm
ATTN_METRICS = ("entropy", "sink_mass", "qk_ratio")        # per query head, grouped onto KV heads


@dataclass(frozen=True)
class HeadSeries:
    """One run's per-head series: metric -> [n_probes, n_layers, n_kv_heads]."""

    series: dict
    tokens: np.ndarray
    n_layers: int
    n_kv: int
    group: int  # query heads per KV head
    gains: list  # [probe][layer] -> k_norm gain vector or None
    qk_norm: str | None
    d_head: int | None
    seed: int | None


def _nan_list(values, n):
    return [as_float(v) for v in values] if values else [math.nan] * n


def head_series(res: dict) -> HeadSeries | None:
    """Per-head series of one run; None if the run has no probe records."""
    probes = res.get("probes") or []
    if not probes:
        return None
    L = len(probes[0]["layers"])
    first = probes[0]["layers"][0]
    n_kv = len(first[SITE]["norm_mean"])
    model = ((res.get("config") or {}).get("model") or {})
    n_q = model.get("n_heads") or len((first.get("attn") or {}).get("entropy") or []) or n_kv
    group = max(1, int(n_q) // n_kv)
    P = len(probes)
    out = {m: np.full((P, L, n_kv), np.nan) for m in (*HEAD_METRICS, *ATTN_METRICS)}
    gains: list[list[np.ndarray | None]] = [[None] * L for _ in range(P)]
    for p, probe in enumerate(probes):
        for rec in probe["layers"]:
            i = rec["layer"]
            for m in HEAD_METRICS:
                out[m][p, i] = _nan_list(rec[SITE].get(m), n_kv)
            attn = rec.get("attn") or {}
            for m in ATTN_METRICS:
                q = np.array(_nan_list(attn.get(m), n_kv * group), dtype=float)
                if q.size == n_kv * group:
                    out[m][p, i] = q.reshape(n_kv, group).mean(axis=1)
            g = rec.get("gamma_k")
            if g and g.get("values"):
                gains[p][i] = np.asarray(g["values"], dtype=float)
    return HeadSeries(series=out, tokens=probe_tokens(res), n_layers=L, n_kv=n_kv, group=group, gains=gains,
                      qk_norm=model.get("qk_norm"), d_head=d_head_of(res)[0], seed=seed_of(res))


@dataclass(frozen=True)
class LayerChoice:
    layer: int
    why: str


def choose_layer(h: HeadSeries) -> LayerChoice:
    """The layer whose KV-head key norms spread most (max - min) at the last probe, and why."""
    last = h.series["norm_mean"][-1]
    if h.n_kv > 1:
        spread = np.nan_to_num(np.nanmax(last, axis=1) - np.nanmin(last, axis=1), nan=-1.0)
        i = int(np.argmax(spread))
        return LayerChoice(i, f"largest spread of KV-head norms at the last probe ({spread[i]:.2f})")
    change = np.nan_to_num(np.abs(last[:, 0] - h.series["norm_mean"][0][:, 0]), nan=-1.0)
    i = int(np.argmax(change))
    return LayerChoice(i, f"one KV head per layer: largest norm change over training ({change[i]:.2f})")


def _nanmedian(a) -> float:
    a = np.asarray(a, float)
    a = a[np.isfinite(a)]
    return float(np.median(a)) if a.size else math.nan


@dataclass(frozen=True)
class Taxonomy:
    classes: np.ndarray  # of str: sink / gatherer / neither / n/a, shaped like the inputs
    median_entropy: float
    margin: float
    sink_mass: float  # sink: sink mass above this (gatherer: at most this) ...
    sink_entropy: float  # ... and entropy below this
    gatherer_entropy: float  # gatherer: entropy above this

    def heads(self, name: str) -> list[tuple[int, int]]:
        """(layer, KV head) of every head of class `name`, for [n_layers, n_kv] inputs."""
        return [tuple(int(x) for x in ix) for ix in zip(*np.nonzero(self.classes == name))]


def classify(sink_mass, entropies, margin: float = TAXONOMY_MARGIN, sink_threshold: float = SINK_MASS) -> Taxonomy:
    """Sink / gatherer / neither for every head, by its attention: sink mass against `sink_threshold`, entropy
    relative to the median of the given heads.

    sink_mass, entropies: arrays of the same shape (e.g. [n_layers, n_kv_heads] at the last probe)."""
    sink_mass, entropies = np.asarray(sink_mass, float), np.asarray(entropies, float)
    med_e = _nanmedian(entropies)
    hi_e, lo_e = med_e * (1 + margin), med_e * (1 - margin)
    classes = np.full(entropies.shape, "neither", dtype=object)
    classes[(sink_mass > sink_threshold) & (entropies < lo_e)] = "sink"
    classes[(sink_mass <= sink_threshold) & (entropies > hi_e)] = "gatherer"
    classes[~np.isfinite(sink_mass) | ~np.isfinite(entropies)] = "n/a"
    return Taxonomy(classes, med_e, margin, sink_threshold, lo_e, hi_e)


@dataclass(frozen=True)
class RunHeads:
    """One seed: its per-head series, the layer of widest head divergence, the layer the figures
    show (that one unless the caller fixed another) and the taxonomy at the last probe."""

    heads: HeadSeries
    divergence: LayerChoice
    shown: LayerChoice
    taxonomy: Taxonomy


@dataclass(frozen=True)
class HeadsCondition:
    runs: list  # RunHeads per seed that has probe records (the figures draw the first)
    n_seeds: int
    erank: np.ndarray  # [n_probes, n_layers] effective rank, layer mean over KV heads, mean over seeds
    erank_tokens: np.ndarray  # the token counts every seed was probed at: where erank's mean is taken
    erank_seeds: str
    norm_gap: Decision | None  # sinks' mean key norm against gatherers' (log ratios, seeds that have both); None if
    #   none does

    @property
    def norm_gap_claim(self) -> str:
        """The write-ups' claim that sinks have higher key norms than gatherers: holds / fails /
        inconclusive / not tested."""
        d = self.norm_gap
        if d is None or not d.tested:
            return "not tested"
        return "holds" if d.differs and d.est > 0 else "fails" if d.decided else "inconclusive"


def norm_means(run: RunHeads) -> tuple[float, float]:
    """(mean key norm of a run's sinks, that of its gatherers) at the last probe (NaN without both)."""
    norms, cls = run.heads.series["norm_mean"][-1], run.taxonomy.classes
    sinks, gatherers = norms[cls == "sink"], norms[cls == "gatherer"]
    return (float(sinks.mean()), float(gatherers.mean())) if sinks.size and gatherers.size else (math.nan, math.nan)


@dataclass(frozen=True)
class HeadsAnalysis:
    """Everything the figures and the report of the head-specialization study draw from."""

    conditions: dict  # condition -> HeadsCondition, or None where its runs hold no probe records
    margin: float


def analyze(runs: dict[str, list[dict]], layer: int | None = None, margin: float = MARGIN) -> HeadsAnalysis:
    """Each condition's head analysis. `layer` fixes the layer shown (default: the layer whose KV-head norms
    spread most at the last probe)."""
    out = {}
    for cond, results in runs.items():
        with_probes = [r for r in results if r.get("probes")]
        if not with_probes:
            out[cond] = None
            continue
        per_run = []
        for res in with_probes:
            h = head_series(res)
            if layer is not None and not 0 <= layer < h.n_layers:
                raise ValueError(f"layer {layer} does not exist: the model has layers 0..{h.n_layers - 1}")
            widest = choose_layer(h)
            shown = LayerChoice(layer, "set by the caller") if layer is not None else widest
            per_run.append(RunHeads(h, widest, shown, classify(h.series["sink_mass"][-1], h.series["entropy"][-1])))
        er_tokens, er = seed_mean(with_probes, lambda r: layer_series(r, "erank", SITE))  # by token count
        # key norms are a ratio quantity (rules.compared_on): sinks' against gatherers' on per-seed log ratios
        sinks, gatherers = np.array([norm_means(r) for r in per_run], float).reshape(-1, 2).T
        gap = decide({"gap": Paired.ratio(sinks, gatherers, names=(f"{cond}'s sinks' mean key norm", "gatherers'"))},
                     margin)["gap"] if np.isfinite(sinks).any() else None
        out[cond] = HeadsCondition(per_run, len(with_probes), er, er_tokens, seeds_text(with_probes), gap)
    return HeadsAnalysis(out, margin)
