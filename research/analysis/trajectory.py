"""Key metrics of one model over its saved checkpoints (research/checkpoint_keys_study.py). No torch.

Input: checkpoint_keys.json (research.results.trajectory). Every measured checkpoint read the SAME text batches,
so the text batch is the unit of uncertainty and the pairing unit. Per checkpoint and layer group, the mean over
batches and its 95% interval of pr_sv, norm_mean, peak_frac, attention entropy, first-token attention and the
loss; the k_norm gain's CV, exact. The change from the first to the last measured checkpoint is decided by
research.analysis.rules (one family of key and attention metrics; the loss its own at LOSS_MARGIN). Duplicate
checkpoints are listed, never counted as a step of training.
What is measured and where: docs/inspection.md, "Keys across saved checkpoints".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.keys import layer_groups
from research.analysis.pretrained import attn_per_batch, per_batch, site_of
from research.analysis.rules import (DESCRIPTIVE, DIFFERENCE, DIFFERENT, EQUAL, INCONCLUSIVE, LOSS_MARGIN, MARGIN,
                                     NO_DATA, NO_SPREAD, UNRESOLVED, WITHIN, Decision, Paired, compared_on, decide)
from research.analysis.wording import effect_text, needed_text
from research.analysis.stats import mean_ci

GAIN_CV = "gain_cv"
LOSS = "loss"


@dataclass(frozen=True)
class Metric:
    key: str     # the series' name in Trajectory.series
    title: str   # what a figure panel and a report line call it
    kind: str    # "keys" (at `site`), "attn" (attention, per query head) or "gain" (weights)
    field: str   # the measure_keys metric
    site: str | None = None

    @property
    def on(self) -> str:
        """How its changes are decided (rules.compared_on): a key PR, norm or attention entropy on log ratios; the
        gain's CV, a share (peak_frac, sink mass) by differences."""
        return DIFFERENCE if self.kind == "gain" else compared_on(self.field)


@dataclass(frozen=True)
class Change:
    """First -> last measured checkpoint of one metric in one layer group: the decision and its sentence."""

    metric: str
    group: str
    decision: Decision
    verdict: str


@dataclass(frozen=True)
class Trajectory:
    labels: list[str]          # measured checkpoints, by step
    steps: list[int]
    duplicates: list[dict]     # {label, step, duplicate_of, duplicate_step, source}
    site: str                  # k_norm or k_proj
    groups: dict               # group -> layers
    metrics: list[Metric]
    series: dict               # metric key -> group -> (means [C], 95% half widths [C]); loss: group "model"
    changes: list[Change]      # the key and attention family, then the loss
    n_batches: int
    margin: float
    loss_margin: float
    file: dict                 # checkpoint_keys.json, checked: the command, provenance, model, text, checkpoints


def metrics_of(site: str, has_gain: bool) -> list[Metric]:
    out = [Metric(f"pr_sv@{site}", f"pr_sv at {site}", "keys", "pr_sv", site),
           Metric(f"norm_mean@{site}", f"key norm at {site}", "keys", "norm_mean", site),
           Metric("pr_sv@k_rope", "pr_sv after RoPE (k_rope)", "keys", "pr_sv", "k_rope"),
           Metric("norm_mean@k_rope", "key norm after RoPE (k_rope)", "keys", "norm_mean", "k_rope"),
           Metric(f"peak_frac@{site}", f"peak_frac at {site}", "keys", "peak_frac", site)]
    if has_gain:
        out.append(Metric(GAIN_CV, "k_norm gain CV (weights, exact)", "gain", "k_norm"))
    return out + [Metric("entropy", "attention entropy (nats)", "attn", "entropy"),
                  Metric("sink_mass", "first-token attention, queries 1..T-1", "attn", "sink_mass_excl_q0")]


def per_batch_group(rec: dict, m: Metric, layers: list[int]) -> np.ndarray:
    """[n_batches]: the mean over the group's layers and heads of a batch-measured metric."""
    x = per_batch(rec, m.field, m.site) if m.kind == "keys" else attn_per_batch(rec, m.field)   # [N, L, H]
    return x[:, layers].mean(axis=(1, 2))


def gain_cv(rec: dict, layers: list[int]) -> float:
    """The mean over the group's layers of the k_norm gain's CV (std, ddof 1, over |mean|); NaN without gains."""
    rows = (rec.get("gains") or {}).get("k_norm")
    if not rows:
        return math.nan
    cvs = [float(np.std(g, ddof=1) / abs(np.mean(g))) if np.mean(g) else math.nan
           for g in (np.asarray(rows[i], float) for i in layers)]
    return float(np.mean(cvs))


def _by_batch(x: np.ndarray) -> dict:
    return {i: float(v) for i, v in enumerate(x)}


def verdict(title: str, group: str, first: str, last: str, d: Decision, margin: float, unit: str = "batch") -> str:
    """One sentence that states the estimates and never says more than the interval showed; `unit`: what was paired
    (text batches of one model, or seeds)."""
    what = f"{title}, {group}" + (" layers" if group in ("early", "middle", "final") else "")
    values = f"{d.mean_b:.3g} at {first} -> {d.mean_a:.3g} at {last}"
    eff = effect_text(d, unit)
    one = "text batch" if unit == "batch" else unit
    if d.outcome == NO_DATA:
        return f"{what}: no {unit} holds both values."
    if d.outcome == DESCRIPTIVE:
        return f"{what}: {values}, {eff}: one {one}, no test."
    if d.outcome == NO_SPREAD:
        by = f"by the same factor, {d.rel:+.3g}" if d.ratio else f"by exactly {d.diff:+.3g}"
        return f"{what}: {values}, {eff}: every {one} changed {by}, so no interval: no test."
    way = "rose" if d.est > 0 else "fell"
    pm = f"\u00b1{margin:.1%}" if margin < 0.01 else f"\u00b1{margin:.0%}"
    if d.outcome == EQUAL:
        return f"{what}: {values} ({eff}): unchanged within {pm}."
    if d.outcome == WITHIN:
        return f"{what}: {values} ({eff}): {way}, by less than {pm}."
    if d.outcome == DIFFERENT:
        return f"{what}: {values} ({eff}): {way}, by more than {pm}."
    if d.outcome == UNRESOLVED:
        return (f"{what}: {values} ({eff}): {way}; whether by more than {pm} is unresolved"
                f"{needed_text(d, unit)}.")
    assert d.outcome == INCONCLUSIVE
    return f"{what}: {values} ({eff}): inconclusive, no change shown{needed_text(d, unit)}."


def analyze(res: dict, margin: float | None = None, loss_margin: float = LOSS_MARGIN) -> Trajectory:
    margin = res.get("margin", MARGIN) if margin is None else margin
    ckpts = res["checkpoints"]
    measured = [c for c in ckpts if c.get("duplicate_of") is None]
    step_of = {c["label"]: c["step"] for c in ckpts}
    dups = [{"label": c["label"], "step": c["step"], "duplicate_of": c["duplicate_of"], "source": c["source"],
             "duplicate_step": step_of[c["duplicate_of"]]} for c in ckpts if c.get("duplicate_of") is not None]
    site = site_of(measured[0])
    groups = layer_groups(res["model"]["n_layers"])
    has_gain = all((c.get("gains") or {}).get("k_norm") for c in measured)
    metrics = metrics_of(site, has_gain)
    series, batches = {}, {}
    for m in metrics:
        series[m.key] = {}
        for g, ix in groups.items():
            if m.kind == "gain":
                series[m.key][g] = (np.array([gain_cv(c, ix) for c in measured]), np.full(len(measured), np.nan))
                continue
            x = [per_batch_group(c, m, ix) for c in measured]                 # C x [N]
            batches[(m.key, g)] = x
            stats = np.array([mean_ci(v) for v in x])
            series[m.key][g] = (stats[:, 0], stats[:, 1])
    losses = [np.array([b["loss"] for b in c["batches"]], float) for c in measured]
    stats = np.array([mean_ci(v) for v in losses])
    series[LOSS] = {"model": (stats[:, 0], stats[:, 1])}
    changes = []
    if len(measured) >= 2:
        first, last = measured[0]["label"], measured[-1]["label"]
        titles = {m.key: m.title for m in metrics}
        on = {m.key: m.on for m in metrics}
        fam = decide({k: Paired.of(_by_batch(x[-1]), _by_batch(x[0]), on[k[0]],
                                   (f"{k[0]} of the {k[1]} layers at {last}", f"at {first}"))
                      for k, x in batches.items()}, margin)
        changes += [Change(k[0], k[1], d, verdict(titles[k[0]], k[1], first, last, d, margin)) for k, d in fam.items()]
        d = decide({LOSS: Paired.of(_by_batch(losses[-1]), _by_batch(losses[0]))}, loss_margin)[LOSS]
        changes.append(Change(LOSS, "model", d, verdict("loss (nats/token)", "whole model", first, last, d,
                                                        loss_margin)))
    return Trajectory([c["label"] for c in measured], [c["step"] for c in measured], dups, site, groups, metrics,
                      series, changes, len(measured[0]["batches"]), margin, loss_margin, res)


def gain_change(t: Trajectory) -> dict[str, tuple[float, float]]:
    """group -> (first, last) k_norm gain CV: exact weights, described, never tested."""
    if GAIN_CV not in t.series:
        return {}
    return {g: (float(m[0]), float(m[-1])) for g, (m, _) in t.series[GAIN_CV].items()}

