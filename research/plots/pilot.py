"""Figures and report of the pilot: QK-norm vs no QK-norm (research.analysis.pilot).

    panel_a_loss.png             train (solid) and validation (dashed) loss vs tokens
    panel_b_pr_trajectory.png    mean key PR over layers vs tokens
    panel_c_per_layer.png        final key PR per layer
    panel_d_delta.png            per-layer difference of final PR, QK-norm minus no QK-norm
    layer_pr_heatmap_500k.png    key PR per layer (y) and probe (x), one panel per condition

Everything is drawn from the seed means of combined_results.json (PilotCondition.combined).
"""
from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch

from research.analysis.pilot import PilotAnalysis
from research.analysis.wording import ratio_text, rule_text
from research.plots.common import (color, decided_text, decision_table, effect_bars, figure_line, fmt_num, label,
                                   styled, subplots, tokens_axis)
from research.plots.in_short import family_text, short_line
from research.results.values import as_array

FIGURES = ("panel_a_loss.png", "panel_b_pr_trajectory.png", "panel_c_per_layer.png", "panel_d_delta.png",
           "layer_pr_heatmap_500k.png")


def _seeds_txt(e: dict) -> str:
    n = e.get("n_seeds", 1)
    return f", mean over {n} seeds" if n > 1 else ""


# ----------------------------------------------------------------------------- figures

def _finish(fig, ax=None):
    if ax is not None:
        ax.legend()
    fig.tight_layout()
    return fig


@styled
def panel_loss(analysis: PilotAnalysis):
    fig, ax = subplots(figsize=(8.5, 5.2))
    for cond, c in analysis.conditions.items():
        e = c.combined
        x = tokens_axis(ax, e["tokens"])
        ax.plot(x, as_array(e["train_loss"]), color=color(cond), lw=2, label=f"{label(cond)}: train{_seeds_txt(e)}")
        ax.plot(x, as_array(e["val_loss"]), color=color(cond), lw=2, ls="--", label=f"{label(cond)}: validation")
    ax.set_ylabel("loss (cross-entropy, nats per token)")
    ax.set_title("(a) Loss: train (solid, mean of the last probe_every steps) and validation (dashed)")
    return _finish(fig, ax)


@styled
def panel_pr(analysis: PilotAnalysis):
    fig, ax = subplots(figsize=(8.5, 5.2))
    for cond, c in analysis.conditions.items():
        e = c.combined
        x = tokens_axis(ax, e["tokens"])
        ax.plot(x, as_array(e["mean_pr"]), color=color(cond), lw=2, marker="o", ms=3,
                label=f"{label(cond)}{_seeds_txt(e)}")
    ax.set_ylabel("mean key PR over layers (pr_sv, dimensions)")
    ax.set_title("(b) Key participation ratio over training (keys at k_norm, pre-RoPE)")
    return _finish(fig, ax)


@styled
def panel_per_layer(analysis: PilotAnalysis):
    fig, ax = subplots(figsize=(8.5, 5.2))
    n_layers = 0
    for cond, c in analysis.conditions.items():
        layers = sorted(c.final_layer)
        n_layers = max(n_layers, len(layers))
        ax.plot(layers, [c.final_layer[i] for i in layers], color=color(cond), lw=2, marker="o",
                label=f"{label(cond)} (at {c.tokens / 1e6:.3g}M tokens{_seeds_txt(c.combined)})")
    ax.set_xlabel("layer")
    ax.set_ylabel("final key PR (pr_sv, dimensions)")
    if n_layers <= 24:
        ax.set_xticks(range(n_layers))
    ax.set_title("(c) Final key participation ratio per layer")
    return _finish(fig, ax)


@styled
def panel_delta(analysis: PilotAnalysis):
    fig, ax = subplots(figsize=(8.5, 5.2))
    a, b = analysis.a, analysis.b
    if a is None or b is None:
        ax.axis("off")
        ax.text(0.5, 0.5, "The per-layer difference needs two conditions\n(QK-norm and no QK-norm); "
                f"only {', '.join(map(label, analysis.conditions)) or 'none'} found.", ha="center", va="center",
                transform=ax.transAxes, fontsize=11)
        ax.set_title("(d) Per-layer difference of final key PR")
        return _finish(fig)
    delta, err, ratio = effect_bars([analysis.layer_decisions[i] for i in analysis.layers])
    if not np.isfinite(delta).any():  # no seed paired: the difference of the condition means, described
        delta, err, ratio = np.array([analysis.delta[i] for i in analysis.layers]), None, False
    ax.bar(analysis.layers, delta, color=[color(a) if v >= 0 else color(b) for v in delta], edgecolor="black", lw=0.5,
           yerr=err, capsize=3 if err is not None else 0)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel("final key PR, ratio − 1 (%)" if ratio else "Δ final key PR (dimensions)")
    if len(analysis.layers) <= 24:
        ax.set_xticks(analysis.layers)
    ax.set_title((f"(d) Per-layer final key PR, {label(a)} / {label(b)} − 1" if ratio else
                  f"(d) Per-layer Δ final key PR = {label(a)} − {label(b)}")
                 + ("\n(error bars: Bonferroni intervals of the per-seed log ratios over the layers, as ratios)"
                    if err is not None and ratio else
                    "\n(error bars: Bonferroni intervals of the per-seed differences over the layers)"
                    if err is not None else ""))
    ax.legend(handles=[Patch(color=color(a), label=f"{label(a)} higher"),
                       Patch(color=color(b), label=f"{label(b)} higher")])
    return _finish(fig)


@styled
def heatmap(analysis: PilotAnalysis):
    conds = list(analysis.conditions)
    mats = {}
    for cond in conds:
        e = analysis.conditions[cond].combined
        layers = sorted(e["layer_pr"], key=int)
        mats[cond] = np.array([as_array(e["layer_pr"][l]) for l in layers]) if layers else np.zeros((0, 0))
    finite = np.concatenate([m[np.isfinite(m)] for m in mats.values()]) if mats else np.zeros(0)
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    # constrained layout: tight_layout mishandles the shared colour bar
    fig, axes = subplots(1, max(1, len(conds)), figsize=(5.5 * max(1, len(conds)) + 1.2, 5.2), squeeze=False,
                         layout="constrained")
    im = None
    for ax, cond in zip(axes[0], conds):
        m, tokens = mats[cond], analysis.conditions[cond].combined["tokens"]
        ax.grid(False)
        if m.size == 0:
            ax.axis("off")
            ax.text(0.5, 0.5, "no layer_pr in this run", ha="center", va="center", transform=ax.transAxes)
            continue
        im = ax.imshow(m, aspect="auto", origin="lower", cmap="viridis", vmin=vmin, vmax=vmax,
                       interpolation="nearest")
        n_p, L = m.shape[1], m.shape[0]
        ticks = np.unique(np.linspace(0, n_p - 1, min(n_p, 7)).round().astype(int))
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{tokens[t] / 1e6:.3g}" if tokens[t] is not None else "?" for t in ticks])
        ax.set_yticks(range(L) if L <= 24 else np.linspace(0, L - 1, 12).round().astype(int))
        ax.set_xlabel("training tokens (millions) at each probe")
        ax.set_ylabel("layer")
        ax.set_title(f"{label(cond)}{_seeds_txt(analysis.conditions[cond].combined)}")
    if im is not None:
        fig.colorbar(im, ax=list(axes[0]), label="key PR (pr_sv, dimensions)", fraction=0.04, pad=0.01)
    fig.suptitle("Key participation ratio per layer and probe (same colour scale in every panel)")
    return fig


def figures(analysis: PilotAnalysis) -> dict:
    return dict(zip(FIGURES, (panel_loss(analysis), panel_pr(analysis), panel_per_layer(analysis),
                              panel_delta(analysis), heatmap(analysis))))


# ----------------------------------------------------------------------------- report

def _layer_lines(analysis: PilotAnalysis, top: int) -> list[str]:
    """The ranking and the count of layers, from the layers whose decision is settled only."""
    a, ds, n = analysis.a, analysis.layer_decisions, len(analysis.layers)
    decided = [i for i, d in ds.items() if d.decided]
    if not decided:
        return [f"- Which layers differ, and in how many {label(a)} is higher: not decided in any of the {n} layers "
                "(their intervals are in the per-layer table below)"]
    beyond = analysis.differing
    open_ = n - len(decided)
    rest = f"; not decided in {open_}" if open_ else ""
    return ["- Layers that differ beyond the margin, largest first: "
            + (", ".join(f"layer {i} ({decided_text(ds[i], 2)})" for i in beyond[:top]) if beyond else
               f"none of the {len(decided)} decided layers") + rest,
            f"- {label(a)} higher beyond the margin in {sum(ds[i].est > 0 for i in beyond)} of {n} layers, lower in "
            f"{sum(ds[i].est < 0 for i in beyond)}, the same within the margin in {len(decided) - len(beyond)}"
            + rest]


def report(analysis: PilotAnalysis, top: int = 3) -> str:
    lines = ["# Pilot: QK-norm vs no QK-norm", "",
             "PR = participation ratio of the keys at the k_norm output (pre-RoPE), pr_sv = (Σs)² / "
             "Σs² of the singular values; mean PR = mean over layers. Final = the last probe, at the token "
             "count the table gives (n/a where that probe has no value). Train loss = mean training loss of the last "
             "probe_every steps before the probe.", "",
             "| condition | seeds | final probe (tokens) | final mean PR | final train loss | final val loss |",
             "|---|---|---|---|---|---|"]
    for cond, c in analysis.conditions.items():
        lines.append(f"| {label(cond)} (`{cond}`) | {c.combined.get('n_seeds', 1)} | {c.tokens:,.0f} | "
                     f"{fmt_num(c.final_pr, 2)} | {fmt_num(c.final_loss)} | {fmt_num(c.final_val)} |")
    lines += ["", figure_line("panel_a_loss.png", "Train and validation loss over training"), "",
              figure_line("panel_b_pr_trajectory.png", "Mean key PR over training"), ""]
    per_layer = [figure_line("panel_c_per_layer.png", "Final key PR per layer"), "",
                 figure_line("panel_d_delta.png", "Per-layer difference of final key PR"), "",
                 figure_line("layer_pr_heatmap_500k.png", "Key PR per layer and probe"), ""]
    a, b = analysis.a, analysis.b
    if a is None or b is None:
        lines += ["Only one condition: the QK-norm minus no-QK-norm difference needs both.", "", *per_layer]
        return "\n".join(lines) + "\n"
    outcomes = [d.outcome for d in analysis.layer_decisions.values()]
    ds = analysis.decisions
    lines += [f"## Difference: {label(a)} − {label(b)}, per seed", "",
              "Each line is the per-seed decision of the table below; a ranking or count of layers uses only the "
              "layers whose decision is settled.", "",
              f"- Final mean PR: {decided_text(ds['mean_pr'], 2)}",
              f"- Final train loss: {decided_text(ds['loss'], 3)}",
              f"- Final val loss: {decided_text(ds['val_loss'], 3)}",
              *_layer_lines(analysis, top),
              "- Per-layer decisions: " + (", ".join(f"{outcomes.count(o)} {o}" for o in dict.fromkeys(outcomes))
                                          or "none"), "",
              f"Decisions, per seed ({rule_text(analysis.margin, analysis.loss_margin)}). "
              f"{ratio_text('key PR, the mean and per layer')}:", ""]
    names = {"mean_pr": "final mean PR", "loss": "final train loss", "val_loss": "final val loss"}
    lines += decision_table(analysis.decisions, 3, names.get) + [""]
    lines += [f"Per layer (final PR, {label(a)} − {label(b)}; Bonferroni over the {len(analysis.layers)} layers):",
              ""]
    lines += decision_table(analysis.layer_decisions, 2, lambda i: f"layer {i}") + ["", *per_layer]
    return "\n".join(lines) + "\n"


def in_short(analysis: PilotAnalysis) -> list[str]:
    """The pilot's question (does QK-norm change the final key PR and the validation loss?), each with its outcome,
    effect and interval, and the per-layer outcomes counted; with one condition, its final values."""
    a, b = analysis.a, analysis.b
    if a is None or b is None:
        return [f"- {label(c)}: final mean key PR {fmt_num(pc.final_pr, 2)}, final validation loss "
                f"{fmt_num(pc.final_val)} ({pc.combined.get('n_seeds', 1)} seed(s)); the QK-norm minus no-QK-norm "
                f"difference needs both conditions" for c, pc in analysis.conditions.items()]
    lines = []
    for field, what in (("mean_pr", "final key PR"), ("val_loss", "final validation loss")):
        d = analysis.decisions[field]
        sign = "/" if d.ratio else "\u2212"
        lines.append(short_line(f"{what}, {label(a)} {sign} {label(b)}", d, family_text("its own family", [d])))
    ds = analysis.layer_decisions
    if ds:
        beyond = [d for d in ds.values() if d.differs]
        higher, lower = sum(d.est > 0 for d in beyond), sum(d.est < 0 for d in beyond)
        lines.append(f"- final key PR per layer, {label(a)} against {label(b)}: higher beyond the margin in {higher} "
                     f"of {len(ds)} layers, lower in {lower}, the same within the margin in "
                     f"{sum(d.same for d in ds.values())}, not decided in {sum(not d.decided for d in ds.values())} "
                     f"({family_text('per-layer family', ds.values())})")
    return lines
