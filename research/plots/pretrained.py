"""Figures of research/pretrained_keys_study.py, from pretrained_keys.json alone (no torch); its report.md and In
short: research.plots.pretrained_report. Each figure has one panel per model, under its label (labels)."""
from __future__ import annotations

from collections import Counter
from pathlib import PurePosixPath

import numpy as np
from matplotlib.ticker import MaxNLocator

from research.analysis import pretrained as A
from research.analysis.stats import mean_ci
from research.plots.common import (GROUP_COLORS, message_figure, styled, subplots)

CLASS_COLORS = {"sink": "#c44e52", "gatherer": "#4c72b0", "neither": "#999999", "n/a": "#dddddd"}


def _panels(n: int, height: float = 3.8):
    fig, axes = subplots(1, n, figsize=(6.2 * n, height), squeeze=False)
    return fig, axes[0]


def _layer_band(ax, x_NL: np.ndarray, color: str, label: str) -> None:
    """Mean over batches per layer with its 95% CI over batches."""
    stats = [mean_ci(x_NL[:, i]) for i in range(x_NL.shape[1])] if x_NL.shape[0] > 1 else None
    m = x_NL.mean(0)
    ax.plot(m, "o-", ms=3, color=color, lw=1.6, label=label)
    if stats:
        half = np.array([s[1] for s in stats])
        ax.fill_between(np.arange(len(m)), m - half, m + half, color=color, alpha=0.25, lw=0)


def labels(names) -> dict[str, str]:
    """Each model's name as the report and figures show it: the last part of a path or hub id ('llama' for
    /tmp/x/llama, 'SmolLM2-135M' for HuggingFaceTB/SmolLM2-135M), or the whole name where that part is another
    model's too. The models table gives where each came from."""
    names = list(names)
    short = {n: PurePosixPath(n.rstrip("/")).name or n for n in names}
    counts = Counter(short.values())
    return {n: short[n] if counts[short[n]] == 1 else n for n in names}


def _records(analysis: A.PretrainedAnalysis) -> dict:
    """model label (labels) -> its record in pretrained_keys.json."""
    label = labels(analysis.models)
    return {label[name]: model.record for name, model in analysis.models.items()}


@styled
def plot_key_norms(analysis: A.PretrainedAnalysis):
    models = _records(analysis)
    fig, axes = _panels(len(models))
    for ax, (name, rec) in zip(axes, models.items()):
        site = A.site_of(rec)
        norms = A.per_batch(rec, "norm_mean", site)                   # [N, L, Hkv]
        for h in range(rec["n_kv_heads"]):
            ax.plot(norms[:, :, h].mean(0), "-", lw=0.8, alpha=0.6, label=f"KV head {h}")
        _layer_band(ax, norms.mean(2), "k", "mean over KV heads (95% CI over batches)")
        for g, ix in A.layer_groups(rec["n_layers"]).items():
            ax.axvspan(min(ix) - 0.4, max(ix) + 0.4, color=GROUP_COLORS[g], alpha=0.12, lw=0)
        ref = rec["head_dim"] ** 0.5
        ax.axhline(ref, color="k", ls="--", lw=1, label=f"sqrt(d_head) = {ref:.1f}")
        ax.set_title(f"{name}: key norm at {site}")
        ax.set_xlabel("layer (shaded: early / middle / final groups)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    axes[0].set_ylabel("mean |k| over tokens")
    fig.tight_layout()
    return fig


@styled
def plot_sinks(analysis: A.PretrainedAnalysis):
    fig, axes = _panels(len(analysis.models), 4.2)
    label = labels(analysis.models)
    for ax, (name, model) in zip(axes, analysis.models.items()):
        rec, s = model.record, model.sinks
        tax = s["taxonomy"] if rec["n_kv_heads"] > 1 else s["taxonomy_query_heads"]
        unit = "KV heads" if rec["n_kv_heads"] > 1 else "query heads (one KV head per layer)"
        sink = A.attn_per_batch(rec, "sink_mass_excl_q0").mean(0)
        ent = A.attn_per_batch(rec, "entropy").mean(0)
        norm = A.per_batch(rec, "norm_mean").mean(0)                  # [L, Hkv]
        if rec["n_kv_heads"] > 1:
            sink, ent = A.kv_mean(sink, rec["n_kv_heads"]), A.kv_mean(ent, rec["n_kv_heads"])
        else:
            norm = np.repeat(norm, rec["n_heads"], axis=1)
        size = 12 + 60 * (norm - norm.min()) / max(float(np.ptp(norm)), 1e-12)
        for c, col in CLASS_COLORS.items():
            m = tax.classes == c
            if m.any():
                ax.scatter(sink[m], ent[m], s=size[m], color=col, alpha=0.8, label=f"{c} ({int(m.sum())})")
        ax.axvline(tax.sink_mass, color="k", ls=":", lw=1)
        ax.axhline(tax.sink_entropy, color=CLASS_COLORS["sink"], ls="--", lw=0.8)
        ax.axhline(tax.gatherer_entropy, color=CLASS_COLORS["gatherer"], ls="--", lw=0.8)
        ax.set_title(f"{label[name]}: {unit}\n(marker size: key norm)")
        ax.set_xlabel("first-token attention, query positions 1..T-1")
        ax.set_ylabel("attention entropy (nats)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@styled
def plot_gains(analysis: A.PretrainedAnalysis):
    label = labels(analysis.models)
    models = {label[n]: m for n, m in analysis.models.items() if m.gain is not None}
    if not models:
        return message_figure("k_norm gains", "none of the models normalizes its keys (no k_norm)")
    fig, axes = subplots(len(models), 2, figsize=(13, 3.6 * len(models)), squeeze=False,
                         gridspec_kw={"width_ratios": [3, 1.2]})
    for row, (name, model) in zip(axes, models.items()):
        rec, gc = model.record, model.gain
        g = np.array(rec["gains"]["k_norm"], float)                    # [L, D]
        lim = float(np.abs(g).max())
        im = row[0].imshow(g, aspect="auto", origin="lower", cmap="RdBu_r", vmin=-lim, vmax=lim,
                           interpolation="nearest")
        for i, layer in enumerate(gc["layers"]):
            row[0].plot(layer["golden"], [i] * len(layer["golden"]), "k|", ms=5)
        row[0].set_title(f"{name}: k_norm gain as applied{' (1 + w)' if rec.get('family') == 'gemma3' else ''}; "
                         f"| = golden dimension (> median + {gc['golden_k']:g} robust SD)")
        row[0].set_xlabel("dimension")
        row[0].set_ylabel("layer")
        row[0].grid(False)
        fig.colorbar(im, ax=row[0])
        row[1].plot([x["cv"] for x in gc["layers"]], "o-", ms=3, label="CV = std / |mean|")
        row[1].plot([x["mean"] for x in gc["layers"]], "s--", ms=3, label="mean (signed)")
        row[1].plot([x["mean_abs"] for x in gc["layers"]], ":", label="mean |gain|")
        row[1].set_xlabel("layer")
        row[1].set_title("spread per layer")
        row[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


@styled
def plot_key_rank(analysis: A.PretrainedAnalysis):
    models = _records(analysis)
    fig, axes = _panels(len(models))
    for ax, (name, rec) in zip(axes, models.items()):
        site = A.site_of(rec)
        _layer_band(ax, A.per_batch(rec, "pr_sv", site).mean(2), "C3", "trained")
        if "init_keys" in rec["batches"][0]:
            _layer_band(ax, A.per_batch(rec, "pr_sv", site, "init_keys").mean(2), "C7", "untrained (same text)")
        ax.axhline(rec["head_dim"], color="k", ls="--", lw=1, label=f"d_head = {rec['head_dim']}")
        ax.set_yscale("log")
        ax.set_title(f"{name}: pr_sv of keys at {site} (mean over KV heads)")
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    axes[0].set_ylabel("pr_sv (dimensions; 95% CI over batches)")
    fig.tight_layout()
    return fig


FIGURES = ("key_norms.png", "sinks.png", "gains.png", "key_rank.png")


def figures(analysis: A.PretrainedAnalysis) -> dict:
    return dict(zip(FIGURES, (plot_key_norms(analysis), plot_sinks(analysis), plot_gains(analysis),
                              plot_key_rank(analysis))))


# ---------------------------------------------------------------------------------------------- report
