"""Figures and report.md of a pretrained-model inspection, from the inspect.json dict alone (no torch)."""
from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from research.plots import inspection_dictionaries as dictionaries
from research.plots.common import fmt_num, styled, subplots
from research.results.values import as_array as _arr

FIGURES = ("weight_stats.png", "first_token_attention.png", "hidden_similarity.png", "amplitude.png",
           "key_metrics.png") + dictionaries.FIGURES


@styled
def plot_weight_stats(r: dict):
    fig, axes = subplots(1, 2, figsize=(10, 3.8), sharey=True)
    mats = r["weights"]["matrices"]
    for ax, orient, title in ((axes[0], "model_dim", "vectors along the model dimension"),
                              (axes[1], "heads", "vectors across heads")):
        for m, c in zip("qkvo", ("C0", "C1", "C2", "C3")):
            ax.plot(mats[m][orient], "o-", ms=3, color=c, label=f"W{m}")
        ax.axhline(r["weights"]["gaussian_reference"], color="k", ls="--", lw=1, label="Gaussian 1.253")
        ax.set_title(title)
        ax.set_xlabel("layer")
    axes[0].set_ylabel("sigma / mean|w|")
    axes[0].legend()
    fig.tight_layout()
    return fig


@styled
def plot_first_token(r: dict):
    a = r["attention"]
    fig, axes = subplots(1, 2, figsize=(11, 4))
    im = axes[0].imshow(np.array(a["first_token"]).T, aspect="auto", origin="lower", vmin=0, vmax=1, cmap="viridis")
    axes[0].set_xlabel("layer")
    axes[0].set_ylabel("query head")
    for ax in axes:  # heads and layers are whole numbers
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(False)
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_title(f"mean attention on token 0 (sink rate {a['sink_rate']:.2f} at >{a['sink_threshold']})")
    fig.colorbar(im, ax=axes[0])
    im = axes[1].imshow(np.array(a["heatmap"]), aspect="auto", origin="lower", vmin=0, vmax=1, cmap="viridis")
    axes[1].set_xlabel("query position")
    axes[1].set_ylabel("query head")
    axes[1].set_title(f"layer {a['heatmap_layer']}: attention on token 0")
    fig.colorbar(im, ax=axes[1])
    fig.tight_layout()
    return fig


@styled
def plot_hidden(r: dict):
    h = r["hidden"]
    fig, axes = subplots(1, 3, figsize=(14, 3.8))
    m, s = _arr(h["adjacent_mean"]), _arr(h["adjacent_std"])
    x = np.arange(len(m))
    axes[0].plot(x, m, "o-", ms=3)
    axes[0].fill_between(x, m - s, m + s, alpha=0.25)
    axes[0].set_title("cos(h_l, h_l+1) per token: mean +- std")
    axes[0].set_xlabel("layer l")
    for g, c in zip(h["gaps"], ("C1", "C2")):
        gd = h["gaps"][g]
        if gd["start_layer"]:
            axes[1].plot(gd["start_layer"], gd["measured"], "o-", ms=3, color=c, label=f"{g}-layer gap, measured")
            axes[1].plot(gd["start_layer"], gd["predicted"], "--", color=c, label=f"{g}-layer gap, product of 1-layer")
    axes[1].set_title("cos(h_l, h_l+g)")
    axes[1].set_xlabel("start layer l")
    if axes[1].lines:
        axes[1].legend()
    else:
        axes[1].text(0.5, 0.5, f"fewer than {min(int(g) for g in h['gaps'])} layers: no gap curve",
                     ha="center", va="center", transform=axes[1].transAxes)
    nb = h["neighbour"]
    for k, lab in (("d1", "distance 1"), ("d2", "distance 2"), ("all_pairs", "all pairs")):
        axes[2].plot(_arr(nb[k]), "o-", ms=3, label=lab)
    axes[2].set_title("token-token cosine within a layer")
    axes[2].set_xlabel("hidden state (0 = embeddings)")
    axes[2].legend()
    fig.tight_layout()
    return fig


@styled
def plot_amplitude(r: dict):
    a = r["amplitude"]
    fig, axes = subplots(1, 2, figsize=(10, 3.8))
    axes[0].plot(_arr(a["rms"]), "o-", ms=3, label="all tokens")
    axes[0].plot(_arr(a["rms_excl_first"]), "s--", ms=3, label="without token 0")
    axes[0].set_yscale("log")
    axes[0].set_title("RMS of hidden states")
    axes[0].set_xlabel("hidden state (0 = embeddings)")
    axes[0].legend()
    for name, g in a["mean_gain"].items():
        axes[1].plot(g, "o-", ms=3, label=name)
    axes[1].set_title("mean norm gain per layer")
    axes[1].set_xlabel("layer")
    axes[1].legend()
    fig.tight_layout()
    return fig


@styled
def plot_key_metrics(r: dict):
    k = r["keys"]
    fig, axes = subplots(1, 3, figsize=(14, 3.8))
    for ax, metric in zip(axes, ("pr_sv", "norm_mean", "cos_mean")):
        for site in k["sites"]:
            ax.plot([layer["means"][f"{site}.{metric}"] for layer in k["layers"]], "o-", ms=3, label=site)
        ax.set_title(f"keys: {metric} (mean over KV heads)")
        ax.set_xlabel("layer")
        ax.legend()
    fig.tight_layout()
    return fig


def figures(r: dict) -> dict:
    """The figures, by file name (the dictionary sections' three only when the file has them)."""
    out = dict(zip(FIGURES, (plot_weight_stats(r), plot_first_token(r), plot_hidden(r), plot_amplitude(r),
                             plot_key_metrics(r))))
    return {**out, **dictionaries.figures(r)} if dictionaries.has_sections(r) else out


def report(r: dict) -> str:
    """The text of report.md."""
    p, a, h, amp = r["params"], r["attention"], r["hidden"], r["amplitude"]
    L = r["n_layers"]
    lines = [f"# Inspection of {r['model']}", "",
             f"{r['family']} ({r['model_type']}), {L} layers, d_model {r['d_model']}, {r['n_heads']} query / "
             f"{r['n_kv_heads']} KV heads of size {r['head_dim']}, {r['dtype']}; prompt of {r['n_tokens']} tokens.", "",
             "## Parameters", "", "| kind | parameters | share |", "|---|---|---|"]
    for kind, n in p["by_kind"].items():
        lines.append(f"| {kind} | {n:,} | {n / p['total']:.1%} |")
    lines += [f"| total | {p['total']:,} | model's own count {p['model_count']:,} "
              f"({'matches' if p['matches'] else 'MISMATCH'}) |", "",
              "## Weights: sigma / mean|w| (a zero-centred Gaussian gives 1.253)", "",
              "![](weight_stats.png)", "", "| matrix | model-dim vectors (mean over layers) | across-head vectors |",
              "|---|---|---|"]
    for m, d in r["weights"]["matrices"].items():
        lines.append(f"| W{m} | {fmt_num(float(np.mean(d['model_dim'])))} | {fmt_num(float(np.mean(d['heads'])))} |")
    lines += ["", "## Attention to the first token", "", "![](first_token_attention.png)", "",
              f"Sink rate (share of layer-head pairs with mean first-token attention > {a['sink_threshold']}): "
              f"**{a['sink_rate']:.3f}**. Mean first-token attention per layer: "
              + ", ".join(fmt_num(x, 2) for x in a["layer_mean_first_token"]) + ".",
              "", "## Hidden-state similarity", "", "![](hidden_similarity.png)", "",
              "Adjacent-layer cosine (mean per layer): " + ", ".join(fmt_num(x, 3) for x in h["adjacent_mean"]) + "."]
    for g, gd in h["gaps"].items():
        if gd["measured"]:
            lines.append(f"{g}-layer gap from layer 0: measured {fmt_num(gd['measured'][0])}, "
                         f"product of 1-layer similarities {fmt_num(gd['predicted'][0])}.")
        else:
            lines.append(f"{g}-layer gap: the model has fewer than {g} layers.")
    lines += ["", "## Amplitude", "", "![](amplitude.png)", "",
              "RMS of hidden states (0 = embeddings): " + ", ".join(fmt_num(x, 3) for x in amp["rms"]) + ".", "",
              "## Logit lens", ""]
    for j, pos in enumerate(r["logit_lens"]["positions"]):
        lines += [f"Position {pos} (token {r['tokens'][pos]!r}):", "", "| state | top tokens (prob) |", "|---|---|"]
        for layer in r["logit_lens"]["layers"]:
            e = layer["positions"][j]
            lines.append(f"| {layer['layer']} | " + ", ".join(f"{t!r} ({pr:.2f})" for t, pr in
                                                             zip(e["tokens"], e["probs"])) + " |")
        lines.append("")
    lines += dictionaries.report_lines(r)
    lines += ["## Keys", "", "![](key_metrics.png)", "", "| layer | " +
              " | ".join(f"{s} pr_sv | {s} norm" for s in r["keys"]["sites"]) + " | k_norm gain mean (cv) |",
              "|" + "---|" * (2 + 2 * len(r["keys"]["sites"]))]
    for layer in r["keys"]["layers"]:
        g = layer["gamma_k"]
        cells = [f"{fmt_num(layer['means'][f'{s}.pr_sv'], 2)} | {fmt_num(layer['means'][f'{s}.norm_mean'], 2)}"
                 for s in r["keys"]["sites"]]
        gk = "none" if g is None else f"{fmt_num(g['mean'])} ({fmt_num(g['cv'])})"
        lines.append(f"| {layer['layer']} | " + " | ".join(cells) + f" | {gk} |")
    lines += ["", "## Memory", "", r["memory"]["bound"] + ".", ""]
    return "\n".join(lines)
