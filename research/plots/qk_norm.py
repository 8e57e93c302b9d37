"""Figures of the QK-norm study: learned gain (A), gain frozen at 1 (B), no QK-norm (C).

    figures(runs, analysis) -> {file name: Figure} for 1_loss.png ... 5_gamma_cv.png

runs: condition -> one results dict per seed (conditions may be missing; files with only the
write-ups' fields work too); analysis: research.analysis.qk_norm.analyze(runs). With one run
per condition the figures show plain lines; with several, the mean over seeds and a shaded
95% confidence band, over the probes all seeds of a condition share.
"""
from __future__ import annotations

import math

import matplotlib.transforms as mtransforms
from matplotlib.lines import Line2D
import numpy as np

from research.analysis.qk_norm import QkNormAnalysis, layer_matrix
from research.analysis.rules import runs_of
from research.analysis.series import aligned, mean_band
from research.plots.common import color, effect_bars, label, message_figure, styled, subplots, tokens_axis
from research.results.read import d_head_of, layer_keys
from research.results.vocabulary import LETTERS, QK_CONDITIONS

FIGURES = ("1_loss.png", "2_key_pr_causal.png", "3_per_layer.png", "4_causal_decomposition.png",
           "5_gamma_cv.png", "6_gain_vs_geometry.png")
SITE_TEXT = "k_norm output, pre-RoPE"
EFFECT_TEXT = {"gain": ("gain effect A\u2212B (learned \u2212 frozen gain)", "#6a3d9a"),
               "normalization": ("normalization effect B\u2212C (frozen gain \u2212 no QK-norm)", "#b15928"),
               "total": ("total QK-norm effect A\u2212C (no frozen-gain run to split it)", "#555555")}
_FROZEN_ZERO = 1e-9


def name(cond: str) -> str:
    """'A: QK-norm, learned gain (QK)' for the study's conditions; the label for others."""
    letter = LETTERS.get(cond)
    return f"{letter}: {label(cond)} ({cond})" if letter else f"{label(cond)} ({cond})"


def seed_note(runs: dict, conds: list[str]) -> str:
    ns = sorted({len(runs_of(runs, c)) for c in conds})
    if ns == [1]:
        return "one run per condition"
    return f"mean of {'/'.join(map(str, ns))} seeds, shaded: 95% CI"


def _head_dim(runs: dict, conds: list[str]) -> int | None:
    return next((d for c in conds for r in runs_of(runs, c) if (d := d_head_of(r)[0])), None)


def _plot_series(ax, x, y, cond, *, ls="-", marker=None, lw=2.0, with_label=True, ms=3.5):
    """One condition's line: the single run, or mean over seeds with its 95% CI band."""
    mean, half = mean_band(y)
    lab = name(cond) + (f", n={y.shape[0]}" if y.shape[0] > 1 else "") if with_label else None
    ax.plot(x, mean, ls=ls, color=color(cond), lw=lw, marker=marker, ms=ms, label=lab)
    if y.shape[0] > 1 and np.isfinite(half).any():
        ax.fill_between(x, mean - half, mean + half, color=color(cond), alpha=0.18, lw=0)
    return mean, half


def _end_labels(ax, items: list[tuple[float, float, str]], decimals: int = 1):
    """Value labels just right of the lines' last points, nudged apart vertically so they never overlap."""
    items = sorted((it for it in items if np.isfinite(it[1])), key=lambda it: it[1])
    if not items:
        return
    ax.margins(x=0.07)
    lo, hi = ax.get_ylim()
    gap = 0.05 * (hi - lo)
    placed: list[float] = []
    for it in items:
        placed.append(it[1] if not placed else max(it[1], placed[-1] + gap))
    shift = max(0.0, placed[-1] - (hi - 0.5 * gap))
    to_right = mtransforms.offset_copy(ax.transData, fig=ax.figure, x=6, units="points")
    for (xv, yv, text_color), yp in zip(items, placed):
        ax.text(xv, yp - shift, f"{yv:.{decimals}f}", transform=to_right, ha="left", va="center",
                color=text_color, fontsize=9, fontweight="bold", clip_on=False)


def _last_mean(y: np.ndarray) -> float:
    if y.size == 0 or not np.isfinite(y[:, -1]).any():
        return math.nan
    return float(np.nanmean(y[:, -1]))


@styled
def fig_loss(runs: dict, conds: list[str]):
    if not conds:
        return message_figure("Training and validation loss", "no runs", size=(9, 5))
    series = {}
    for c in conds:
        x, tr = aligned(runs_of(runs, c), lambda r: r["loss"])
        _, va = aligned(runs_of(runs, c), lambda r: r["val_loss"])
        series[c] = (x / 1e6, tr, va)
    xmax = max((np.nanmax(s[0]) for s in series.values() if len(s[0])), default=0.0)
    zoom = max((int(np.sum(s[0] >= 0.5 * xmax)) for s in series.values()), default=0) >= 4
    fig, axes = subplots(1, 2 if zoom else 1, figsize=(13, 5.2) if zoom else (9, 5.2), squeeze=False)
    axes = axes[0]
    ranges = []
    for k, ax in enumerate(axes):
        for c in conds:
            x, tr, va = series[c]
            tokens_axis(ax, x * 1e6)
            m_tr, h_tr = _plot_series(ax, x, tr, c, ls="-", lw=2.0, with_label=(k == 0))
            m_va, h_va = _plot_series(ax, x, va, c, ls="--", lw=1.6, with_label=False)
            if k == 1:
                sel = x >= 0.5 * xmax
                for m, h in ((m_tr, h_tr), (m_va, h_va)):
                    h = np.where(np.isfinite(h), h, 0.0)
                    ranges += [np.nanmin((m - h)[sel]) if np.isfinite(m[sel]).any() else np.nan,
                               np.nanmax((m + h)[sel]) if np.isfinite(m[sel]).any() else np.nan]
        ax.set_ylabel("loss (nats per token)")
    axes[0].set_title(f"Training and validation loss ({seed_note(runs, conds)})")
    if zoom:
        ax = axes[1]
        ax.set_xlim(0.5 * xmax - 0.01 * xmax, xmax * 1.01)
        finite = [v for v in ranges if np.isfinite(v)]
        if finite:
            lo, hi = min(finite), max(finite)
            pad = 0.08 * (hi - lo if hi > lo else 1.0)
            ax.set_ylim(lo - pad, hi + pad)
        ax.set_title("Zoom: second half of training (numbers: final train loss)")
        _end_labels(ax, [(series[c][0][-1], _last_mean(series[c][1]), color(c)) for c in conds], 3)
    style = [Line2D([], [], color="0.25", ls="-", lw=2.0, label="train (mean over the last probe_every steps)"),
             Line2D([], [], color="0.25", ls="--", lw=1.6, label="validation")]
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].legend(handles + style, labels + [h.get_label() for h in style], loc="upper right")
    fig.tight_layout()
    return fig


@styled
def fig_mean_pr(runs: dict, analysis: QkNormAnalysis):
    conds = analysis.conditions
    title = "Mean key PR over training: does the gain or the normalization drive it?"
    if not conds:
        return message_figure(title, "no runs", size=(9, 5))
    fig, ax = subplots(figsize=(10, 5.8))
    ends, starts = [], []
    for c in conds:
        x, y = aligned(runs_of(runs, c), lambda r: r["mean_pr"])
        if not len(x):
            continue
        x = tokens_axis(ax, x)
        mean, _ = _plot_series(ax, x, y, c, marker="o", lw=2.2)
        ends.append((x[-1], mean[-1], color(c)))
        if x[0] == 0 and np.isfinite(mean[0]):
            starts.append(mean[0])
    if starts:
        init = float(np.mean(starts))
        ax.axhline(init, color="0.45", ls=":", lw=1.3, label=f"value at initialization ({init:.1f})")
    d = _head_dim(runs, conds)
    ax.set_ylabel("mean key PR over layers (effective dimensions" + (f", max {d})" if d else ")"))
    ax.set_title(f"{title}\n({SITE_TEXT}; {seed_note(runs, conds)})")
    _end_labels(ax, ends)
    ax.legend(loc="best")
    note = "\n".join(_figure_note(analysis))
    fig.text(0.01, 0.01, note, fontsize=8, color="0.2", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.015 + 0.027 * (note.count("\n") + 1), 1, 1))
    return fig


def _mean_text(values, percent: bool) -> str:
    """The mean of the finite values, '+1.2' or '+1.2%'; 'n/a' where none is finite (no layer decided)."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    return f"{finite.mean():+.1f}" + ("%" if percent else "") if finite.size else "n/a"


def _figure_note(analysis: QkNormAnalysis) -> list[str]:
    """The two lines under the key-PR figure: the rule, and each pair's outcome words at the last probe (the verdict
    and its estimates are in report.md)."""
    if analysis.descriptive:
        return ["Rule: one seed per condition, described only: no test, no verdict."]
    rule = (f"Rule: paired by seed, one Bonferroni interval per comparison of key PR's family (95% for all at once), "
            f"read against \u00b1{analysis.margin:.0%} of the pair's mean (docs/decisions.md).")
    words = "; ".join(f"{x}/{y} {d.outcome}" for (x, y), d in analysis.decisions["mean_pr"].items())
    return [rule, f"At the last probe: {words or 'no pair compared'} (report.md: the estimates and the verdict)."]


def _layer_ticks(ax, layers: list[str]) -> np.ndarray:
    xs = np.arange(len(layers))
    shown = xs if len(xs) <= 16 else xs[::2]
    ax.set_xticks(shown)
    ax.set_xticklabels([layers[i] for i in shown])
    ax.set_xlabel("layer index (0 = first)")
    return xs


@styled
def fig_per_layer(runs: dict, conds: list[str]):
    layers = layer_keys([r for c in conds for r in runs_of(runs, c)])
    if not layers:
        return message_figure("Key PR per layer", "no per-layer PR (layer_pr) in these runs", size=(9, 5))
    fig, ax = subplots(figsize=(10, 5.5))
    xs = _layer_ticks(ax, layers)
    last_tokens, init = [], []
    for c in conds:
        y, t = layer_matrix(runs_of(runs, c), layers, -1)
        last_tokens.append(t)
        _plot_series(ax, xs, y, c, marker="o", lw=2.0)
        y0, t0 = layer_matrix(runs_of(runs, c), layers, 0)
        if t0 == 0:
            init.append(np.nanmean(y0, axis=0))
    if init:
        ax.plot(xs, np.nanmean(np.vstack(init), axis=0), color="0.45", ls=":", lw=1.5,
                label="at initialization (mean of conditions)")
    d = _head_dim(runs, conds)
    ax.set_ylabel("key PR (effective dimensions" + (f", max {d})" if d else ")"))
    t_txt = ", ".join(sorted({f"{t / 1e6:.3g}M" for t in last_tokens if np.isfinite(t)}))
    ax.set_title(f"Key PR per layer at the last probe ({t_txt} tokens)\n({SITE_TEXT}; {seed_note(runs, conds)})")
    ax.legend(loc="best")
    fig.tight_layout()
    return fig


@styled
def fig_decomposition(analysis: QkNormAnalysis):
    title = "Causal decomposition of the final key PR per layer"
    eff = analysis.layer_effects
    have = [c for c in QK_CONDITIONS if c in analysis.conditions]
    if len(have) < 2:
        return message_figure(title, "needs at least two of the conditions QK, QK_frozen, NoQK; "
                                     f"found: {', '.join(have) or 'none'}", size=(9, 5))
    if not eff.layers:
        return message_figure(title, "no per-layer PR (layer_pr) in these runs", size=(9, 5))
    fig, ax = subplots(figsize=(12, 5.5))
    xs = _layer_ticks(ax, eff.layers)
    width = 0.8 / len(eff.effects)
    ratio = False
    for k, e in enumerate(eff.effects):
        text, col = EFFECT_TEXT[e.kind]
        height, err, ratio = effect_bars(e.decisions)
        ax.bar(xs + (k - (len(eff.effects) - 1) / 2) * width, height, width, color=col, alpha=0.85,
               yerr=err, capsize=2 if err is not None else 0, error_kw={"lw": 0.8},
               label=f"{text}; mean over layers {_mean_text(height, ratio)}")
    if len(eff.effects) == 2:
        heights = [effect_bars(e.decisions)[0] for e in eff.effects]
        # ratios multiply: A/C = (A/B)(B/C); differences add
        total = (100 * ((1 + heights[0] / 100) * (1 + heights[1] / 100) - 1) if ratio else heights[0] + heights[1])
        ax.plot(xs, total, "D", color="black", ms=4, label=("total A/C (product); mean " if ratio else
                                                            "total A\u2212C (sum); mean ")
                + _mean_text(total, ratio))
    ax.axhline(0, color="black", lw=0.8)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + 0.22 * (hi - lo))  # headroom so the legend covers no bar
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("total"))
    ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="best")
    ax.set_xlim(-0.7, len(xs) - 0.3)
    ax.set_ylabel("ratio of key PR at the last probe, minus 1 (%)" if ratio else
                  "difference in key PR at the last probe\n(effective dimensions)")
    what = "ratio (exp of the mean per-seed log ratio, minus 1)" if ratio else "mean per-seed difference"
    bars = ("bars: one run per condition" if eff.one_run_each
            else f"bars: {what}, error bars: its interval, Bonferroni over the layers")
    ax.set_title(f"{title}: above 0 = the first condition has the higher rank\n({bars})")
    fig.tight_layout()
    return fig


@styled
def fig_gamma_cv(runs: dict, conds: list[str]):
    title = "Spread of the k_norm gain over its dimensions (coefficient of variation)"
    note = seed_note(runs, conds)
    conds = [c for c in conds if any(r.get("gamma_cv") for r in runs_of(runs, c))]
    if not conds:
        return message_figure(title, "No QK-norm gain in these runs:\nno condition recorded gamma_cv "
                                     "(only QK-norm conditions have a k_norm gain).", size=(9, 5))
    layers = layer_keys([r for c in conds for r in runs_of(runs, c)], "gamma_cv")
    picks = sorted({layers[0], layers[len(layers) // 2], layers[-1]}, key=layers.index)
    where = {layers[0]: "first", layers[len(layers) // 2]: "middle", layers[-1]: "last"}
    fig, axes = subplots(1, len(picks), figsize=(4.3 * len(picks) + 0.5, 4.8), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, layer in zip(axes, picks):
        for c in conds:
            run_list = [r for r in runs_of(runs, c) if layer in (r.get("gamma_cv") or {})]
            if not run_list:
                continue
            x, y = aligned(run_list, lambda r, layer=layer: r["gamma_cv"][layer])
            _plot_series(ax, tokens_axis(ax, x), y, c, lw=2.0, with_label=False)
        ax.set_title(f"layer {layer} ({where[layer]})")
    axes[0].set_ylabel("CV of the k_norm gain (std / |mean| over D)")
    handles = []
    for c in conds:
        zero = all(abs(v) < _FROZEN_ZERO for r in runs_of(runs, c) for vals in r["gamma_cv"].values()
                   for v in vals if v is not None)
        handles.append(Line2D([], [], color=color(c), lw=2.0,
                                  label=name(c) + (": CV = 0 throughout (gain fixed at 1)" if zero else "")))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 2), frameon=False)
    fig.suptitle(f"{title}\n({note})")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


@styled
def fig_gain_vs_geometry(analysis: QkNormAnalysis):
    """The final A - B difference of each key metric (total) beside its two parts: what multiplying by the
    learned gain does (gain) and how the normalized keys differ (geometry), with their CIs."""
    title = "A \u2212 B in key rank: the gain's arithmetic against the normalized keys' geometry"
    dec = analysis.decomposition
    if not dec:
        return message_figure(title, "No pre-gain key records (k_hat) in these runs, or QK / QK_frozen is missing.",
                              size=(9, 5))
    groups = list(dec)
    xs = np.arange(len(groups))
    fig, ax = subplots(figsize=(11, 5.5))
    ratio = False
    for k, (part, col) in enumerate((("total", "0.35"), ("gain", "#6a3d9a"), ("geometry", "#1b9e77"))):
        mean, err, ratio = effect_bars([dec[g][part] for g in groups])
        sign = "/" if ratio else "\u2212"
        ax.bar(xs + (k - 1) * 0.27, mean, 0.27, color=col, yerr=err, capsize=3 if err is not None else 0,
               label={"total": f"total A {sign} B", "gain": f"gain: A's keys {sign} A's keys before the gain",
                      "geometry": f"geometry: A's keys before the gain {sign} B's keys"}[part])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{metric} at {site}" for site, metric in groups])
    if ratio:
        ax.set_ylabel("ratio at the last probe, minus 1 (%)\n(of the mean over layers)")
        ax.set_title(f"{title}\n(ratio: exp of the mean per-seed log ratio, minus 1; error bars: its Bonferroni "
                     f"interval, which decides)")
    else:
        ax.set_ylabel("difference at the last probe\n(effective dimensions, mean over layers)")
        ax.set_title(f"{title}\n(mean per-seed difference; error bars: its Bonferroni interval, which decides)")
    ax.legend(loc="best")
    fig.tight_layout()
    return fig


def figures(analysis: QkNormAnalysis) -> dict:
    """The study's six figures, by file name, in order."""
    runs, conds = analysis.runs, analysis.conditions
    return dict(zip(FIGURES, (fig_loss(runs, conds), fig_mean_pr(runs, analysis), fig_per_layer(runs, conds),
                              fig_decomposition(analysis), fig_gamma_cv(runs, conds),
                              fig_gain_vs_geometry(analysis))))
