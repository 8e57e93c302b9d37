"""Figures and report.md of a pretrained-model inspection, from the inspect.json dict alone (no torch)."""
from __future__ import annotations

import math

import numpy as np
from matplotlib.ticker import MaxNLocator

from research.plots import inspection_dictionaries as dictionaries
from research.plots.common import fmt_num, styled, subplots
from research.results.values import as_array as _arr

FIGURES = ("weight_stats.png", "first_token_attention.png", "hidden_similarity.png", "amplitude.png",
           "key_metrics.png", "key_heads.png") + dictionaries.FIGURES


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
    for j, (name, g) in enumerate(a["mean_gain"].items()):
        axes[1].plot(g, "o-", ms=3, color=f"C{j}", label=f"{name}: mean")
        ab = (a.get("mean_abs_gain") or {}).get(name)
        if ab:
            axes[1].plot(ab, "--", color=f"C{j}", lw=1, label=f"{name}: mean |gain|")
    axes[1].axhline(0, color="k", lw=0.6)
    axes[1].set_title("norm gain per layer: signed mean (solid), mean |gain| (dashed)")
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


@styled
def plot_key_heads(r: dict):
    """Per layer and KV head: key norm (at the model's last key site before RoPE), pr_sv and the first-token
    attention of the head's query heads (mean; without query 0 where recorded)."""
    k, a = r["keys"], r["attention"]
    site = "k_norm" if "k_norm" in k["sites"] else "k_proj"
    n_kv, G = r["n_kv_heads"], r["n_heads"] // r["n_kv_heads"]
    first = np.array(a.get("first_token_excl_q0", a["first_token"]), float).reshape(len(k["layers"]), n_kv, G)
    panels = ((f"{site} norm_mean", np.array([layer[site]["norm_mean"] for layer in k["layers"]], float)),
              (f"{site} pr_sv (of d_head {r['head_dim']})", np.array([layer[site]["pr_sv"] for layer in k["layers"]],
                                                                    float)),
              ("first-token attention" + (" (queries 1..T-1)" if "first_token_excl_q0" in a else ""),
               first.mean(axis=2)))
    fig, axes = subplots(1, 3, figsize=(14, 3.8))
    for ax, (title, v) in zip(axes, panels):
        for h in range(n_kv):
            ax.plot(v[:, h], "o-", ms=3, label=f"KV head {h}")
        ax.set_title(title)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].axhline(math.sqrt(r["head_dim"]), color="k", ls="--", lw=1, label="sqrt(d_head)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def figures(r: dict) -> dict:
    """The figures, by file name (the dictionary sections' three only when the file has them)."""
    out = dict(zip(FIGURES, (plot_weight_stats(r), plot_first_token(r), plot_hidden(r), plot_amplitude(r),
                             plot_key_metrics(r), plot_key_heads(r))))
    return {**out, **dictionaries.figures(r)} if dictionaries.has_sections(r) else out


def _text_line(r: dict) -> str:
    t = r.get("text") or {"source": "prompt"}
    if t["source"] == "prompt":
        c = r.get("context") or {}
        cut = (f" (the prompt has {c['tokens_given']} tokens: cut to the model's context, {c['field']} = "
               f"{c['limit']})" if (c.get("tokens_given") or 0) > r["n_tokens"] == c.get("limit") else "")
        return f"one prompt of {r['n_tokens']} tokens{cut}."
    return (f"{r['batch']} windows of {r['n_tokens']} tokens of {t['source']} (sha256 {t['sha256'][:12]}, seed "
            f"{t['seed']}{', BOS first' if t.get('bos') else ''}; {t['description']}); sections of one token "
            f"sequence (logit and input lens) read window 0.")


def _gain_lines(amp: dict) -> list[str]:
    """The layers' norm gains, signed: a mean near zero can hide large gains of both signs."""
    if not amp.get("mean_gain"):
        return []
    lines = ["Norm gains (the multiplier each norm applies, per layer; mean over the model dimension, signed, "
             "and mean |gain|):", "", "| norm | signed mean: min .. max over layers | mean abs: min .. max |",
             "|---|---|---|"]
    for name, g in amp["mean_gain"].items():
        ab = (amp.get("mean_abs_gain") or {}).get(name)
        lines.append(f"| {name} | {fmt_num(min(g))} .. {fmt_num(max(g))} | "
                     + (f"{fmt_num(min(ab))} .. {fmt_num(max(ab))} |" if ab else "n/a |"))
    return lines + [""]


def _header(record: dict) -> list[str]:
    lines = [f"# Inspection of {record['model']}", "",
             f"{record['family']} ({record['model_type']}), {record['n_layers']} layers, d_model {record['d_model']}, "
             f"{record['n_heads']} query / {record['n_kv_heads']} KV heads of size {record['head_dim']}, "
             f"{record['dtype']}; {_text_line(record)}", ""]
    if record.get("quantization"):
        lines += [f"**Quantized weights.** {record['quantization']}", ""]
    return lines


def _parameters(record: dict) -> list[str]:
    params = record["params"]
    lines = ["## Parameters", "", "| kind | parameters | share |", "|---|---|---|"]
    for kind, n in params["by_kind"].items():
        lines.append(f"| {kind} | {n:,} | {n / params['total']:.1%} |")
    lines += [f"| total | {params['total']:,} | model's own count {params['model_count']:,} "
              f"({'matches' if params['matches'] else 'MISMATCH'}) |", "",
              "## Weights: sigma / mean|w| (a zero-centred Gaussian gives 1.253)", "",
              "![](weight_stats.png)", "", "| matrix | model-dim vectors (mean over layers) | across-head vectors |",
              "|---|---|---|"]
    for m, d in record["weights"]["matrices"].items():
        lines.append(f"| W{m} | {fmt_num(float(np.mean(d['model_dim'])))} | {fmt_num(float(np.mean(d['heads'])))} |")
    return lines


def _attention_and_hidden(record: dict) -> list[str]:
    attn, hidden, amp = record["attention"], record["hidden"], record["amplitude"]
    lines = ["", "## Attention to the first token", "", "![](first_token_attention.png)", "",
             f"Sink rate (share of layer-head pairs with mean first-token attention > {attn['sink_threshold']}): "
             f"**{attn['sink_rate']:.3f}** over all query positions (Gu et al. 2024), "
             + (f"**{attn['sink_rate_excl_q0']:.3f}** without query 0 (which can only attend to token 0, weight 1). "
                if "sink_rate_excl_q0" in attn else "")
             + "Mean first-token attention per layer: "
             + ", ".join(fmt_num(x, 2) for x in attn["layer_mean_first_token"]) + "."
             + (" Without query 0: " + ", ".join(fmt_num(x, 2) for x in attn["layer_mean_first_token_excl_q0"]) + "."
                if "layer_mean_first_token_excl_q0" in attn else ""),
             "", "## Hidden-state similarity", "", "![](hidden_similarity.png)", "",
             "Adjacent-layer cosine (mean per layer): " + ", ".join(fmt_num(x, 3) for x in hidden["adjacent_mean"])
             + "."]
    for g, gd in hidden["gaps"].items():
        if gd["measured"]:
            lines.append(f"{g}-layer gap from layer 0: measured {fmt_num(gd['measured'][0])}, "
                         f"product of 1-layer similarities {fmt_num(gd['predicted'][0])}.")
        else:
            lines.append(f"{g}-layer gap: the model has fewer than {g} layers.")
    lines += ["", "## Amplitude", "", "![](amplitude.png)", "",
              "RMS of hidden states (0 = embeddings): " + ", ".join(fmt_num(x, 3) for x in amp["rms"]) + ".", ""]
    return lines + _gain_lines(amp)


def _logit_lens(record: dict) -> list[str]:
    lines = ["## Logit lens", ""]
    for j, pos in enumerate(record["logit_lens"]["positions"]):
        lines += [f"Position {pos} (token {record['tokens'][pos]!r}):", "", "| state | top tokens (prob) |",
                  "|---|---|"]
        for layer in record["logit_lens"]["layers"]:
            e = layer["positions"][j]
            lines.append(f"| {layer['layer']} | " + ", ".join(f"{t!r} ({pr:.2f})" for t, pr in
                                                             zip(e["tokens"], e["probs"])) + " |")
        lines.append("")
    return lines


def _keys(record: dict) -> list[str]:
    sites = record["keys"]["sites"]
    lines = ["## Keys", "", "![](key_metrics.png)", "", "![](key_heads.png)", "",
             f"Means over KV heads (key_heads.png and inspect.json have each KV head); sqrt(d_head) = "
             f"{math.sqrt(record['head_dim']):.1f}. The k_norm gain is the multiplier the model applies"
             + (" (1 + w for Gemma)" if record["family"] == "gemma3" else "")
             + ": signed mean, mean |gain| and CV.", "",
             "| layer | " + " | ".join(f"{s} pr_sv | {s} norm" for s in sites)
             + " | k_norm gain mean / mean abs (cv) |", "|" + "---|" * (2 + 2 * len(sites))]
    for layer in record["keys"]["layers"]:
        g = layer["gamma_k"]
        cells = [f"{fmt_num(layer['means'][f'{s}.pr_sv'], 2)} | {fmt_num(layer['means'][f'{s}.norm_mean'], 2)}"
                 for s in sites]
        gk = ("none" if g is None else
              f"{fmt_num(g['mean'])} / {fmt_num(float(np.mean(np.abs(g['values']))))} ({fmt_num(g['cv'])})")
        lines.append(f"| {layer['layer']} | " + " | ".join(cells) + f" | {gk} |")
    return lines + ["", "## Memory", "", record["memory"]["bound"] + ".", ""]


def report(record: dict) -> str:
    """The text of report.md, section by section, from an inspect.json record."""
    return "\n".join(_header(record) + _parameters(record) + _attention_and_hidden(record) + _logit_lens(record)
                     + dictionaries.report_lines(record) + _keys(record))
