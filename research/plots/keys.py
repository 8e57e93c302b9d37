"""Figures and report of the key-dynamics study (research.analysis.keys).

Figures (one set per condition; with several conditions the file names get the condition
as a suffix, e.g. key_analysis_report_QK.png):

    key_analysis_report.png  four panels: smoothed norm of the early / middle / final layer
                             groups; max_abs of the first, middle and last layer; cos_mean by
                             group; final norm per layer with the sqrt(d_head) line
    key_norm_evolution.png   norm of the three groups (and of each of their layers) over training
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib.patches import Patch

from research.analysis.keys import AT_TOLERANCE, KeyDynamics, group_mean, group_of
from research.plots.common import GROUP_COLORS, fmt_num, fmt_tokens, label, message_figure, plt, smooth, tokens_axis

GROUP_NAMES = {"early": "early layers", "middle": "middle layers", "final": "final layers"}
NO_RECORDS = ("This results file has no per-probe key records ('probes'),\n"
              "only the write-ups' summary fields; key norms cannot be drawn.")


def figure_name(base: str, condition: str, n_conditions: int) -> str:
    return f"{base}.png" if n_conditions == 1 else f"{base}_{condition}.png"


def smoothing_window(n_probes: int) -> int:
    return 1 if n_probes < 8 else max(3, n_probes // 8)


def _sqrt_line(ax, d_head: int) -> None:
    ax.axhline(math.sqrt(d_head), color="black", ls="--", lw=1,
               label=f"√d_head = {math.sqrt(d_head):.2f} (d_head = {d_head})")


def _panel_norm(ax, data: KeyDynamics) -> None:
    w = smoothing_window(len(data.tokens))
    smooth_txt = (f"moving average over {w} probes; faint: raw" if w > 1
                  else f"not smoothed: only {len(data.tokens)} probes")
    x = tokens_axis(ax, data.tokens)
    for g, layers in data.groups.items():
        y = group_mean(data.series["norm_mean"], layers)
        if w > 1:
            ax.plot(x, y, color=GROUP_COLORS[g], alpha=0.25, lw=1)
        ax.plot(x, smooth(y, w), color=GROUP_COLORS[g], lw=2, label=f"{GROUP_NAMES[g]} ({', '.join(map(str, layers))})")
    _sqrt_line(ax, data.d_head)
    ax.set_ylabel("mean key L2 norm")
    ax.set_title(f"(a) key norm by layer group ({smooth_txt})")
    ax.legend()


def _panel_outliers(ax, data: KeyDynamics) -> None:
    L = data.n_layers
    x = tokens_axis(ax, data.tokens)
    seen = set()
    for name, layer, g in (("first", 0, "early"), ("middle", L // 2, "middle"), ("last", L - 1, "final")):
        if layer not in seen:
            seen.add(layer)
            ax.plot(x, data.series["max_abs"][:, layer], color=GROUP_COLORS[g], lw=2, marker="o", ms=3,
                    label=f"layer {layer} ({name})")
    ax.set_ylabel("largest |key component| (outlier magnitude)")
    ax.set_title("(b) outlier magnitude: max |k_j| over all keys, mean over KV heads")
    ax.legend()


def _panel_redundancy(ax, data: KeyDynamics) -> None:
    x = tokens_axis(ax, data.tokens)
    for g, layers in data.groups.items():
        ax.plot(x, group_mean(data.series["cos_mean"], layers), color=GROUP_COLORS[g], lw=2,
                label=f"{GROUP_NAMES[g]} ({', '.join(map(str, layers))})")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_ylabel("mean cosine similarity between keys")
    ax.set_title("(c) redundancy: mean pairwise key cosine within a sequence")
    ax.legend()


def _panel_final_norms(ax, data: KeyDynamics) -> None:
    L, groups, ref = data.n_layers, data.groups, math.sqrt(data.d_head)
    final = data.series["norm_mean"][-1]
    colors = [GROUP_COLORS[group_of(i, groups).split("/")[-1]] if group_of(i, groups) != "-" else "#9a9a9a"
              for i in range(L)]
    ax.bar(np.arange(L), final, color=colors, edgecolor="black", lw=0.5)
    _sqrt_line(ax, data.d_head)
    ax.axhspan(ref * (1 - AT_TOLERANCE), ref * (1 + AT_TOLERANCE), color="grey", alpha=0.2, lw=0,
               label=f"±{AT_TOLERANCE:.0%}: counted as at √d_head in the report")
    finite = final[np.isfinite(final)]
    if finite.size:
        lo, hi = min(finite.min(), ref), max(finite.max(), ref)
        pad = 0.15 * (hi - lo) + 0.05 * hi
        ax.set_ylim(max(0.0, lo - pad), hi + pad)
    ax.set_xlabel("layer")
    ax.set_ylabel("final mean key L2 norm")
    ax.set_xticks(np.arange(L))
    ax.set_title(f"(d) final key norm per layer (at {fmt_tokens(data.tokens[-1])} tokens; y axis not from 0)")
    handles = [Patch(color=GROUP_COLORS[g], label=GROUP_NAMES[g]) for g in groups]
    if "#9a9a9a" in colors:
        handles.append(Patch(color="#9a9a9a", label="other layers"))
    ax.legend(handles=[*handles, *ax.get_legend_handles_labels()[0]], fontsize=8)


def analysis_figure(cond: str, data: KeyDynamics):
    """The four-panel key analysis report of one condition."""
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    for ax, panel in zip(axes.ravel(), (_panel_norm, _panel_outliers, _panel_redundancy, _panel_final_norms)):
        panel(ax, data)
    fig.suptitle(f"Key dynamics: {label(cond)} ({data.seeds}); keys at the k_norm output (pre-RoPE), "
                 f"layer = mean over KV heads", fontsize=12)
    fig.tight_layout()
    return fig


def evolution_figure(cond: str, data: KeyDynamics):
    s = data.series["norm_mean"]
    groups = data.groups
    fig, ax = plt.subplots(figsize=(9, 5.5))
    x = tokens_axis(ax, data.tokens)
    for g, layers in groups.items():
        for i in layers:
            ax.plot(x, s[:, i], color=GROUP_COLORS[g], lw=0.8, alpha=0.35)
        ax.plot(x, group_mean(s, layers), color=GROUP_COLORS[g], lw=2.2, marker="o", ms=3,
                label=f"{GROUP_NAMES[g]} (layers {', '.join(map(str, layers))}): group mean")
    _sqrt_line(ax, data.d_head)
    ax.set_ylabel("mean key L2 norm")
    ax.set_title(f"Key norm over training: {label(cond)} ({data.seeds})\n"
                 f"thick: group mean, thin: each layer of the group; keys at the k_norm output (pre-RoPE)")
    ax.legend()
    fig.tight_layout()
    return fig


def figures(analysis: dict[str, KeyDynamics | None]) -> dict:
    """Both figures of every condition, by file name."""
    out = {}
    for cond, data in analysis.items():
        a_name = figure_name("key_analysis_report", cond, len(analysis))
        e_name = figure_name("key_norm_evolution", cond, len(analysis))
        if data is None:
            out[a_name] = message_figure(f"Key dynamics: {label(cond)}", NO_RECORDS)
            out[e_name] = message_figure(f"Key norm over training: {label(cond)}", NO_RECORDS)
        else:
            out[a_name], out[e_name] = analysis_figure(cond, data), evolution_figure(cond, data)
    return out


# ----------------------------------------------------------------------------- report

def _layers_text(layers: list[int]) -> str:
    if not layers:
        return "none"
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))


def report(analysis: dict[str, KeyDynamics | None]) -> str:
    lines = ["# Key dynamics: what happens with attention keys as the LLM trains", "",
             "Keys measured at the k_norm output (pre-RoPE) on the fixed evaluation batch; every per-layer "
             "number is the mean over the layer's KV heads. norm = mean L2 norm of a key; max_abs = largest "
             "absolute key component (outlier magnitude); cos_mean = mean pairwise cosine similarity of keys "
             "within a sequence (redundancy); peak_frac = share of a key's energy in its top dimension.", ""]
    for cond, data in analysis.items():
        lines += [f"## {label(cond)} (`{cond}`)", ""]
        if data is None:
            lines += ["No per-probe key records ('probes') in the results file(s): only the write-ups' summary "
                      "fields, so there is nothing to report on keys.", ""]
            continue
        s, L, d_head = data.series, data.n_layers, data.d_head
        ref = math.sqrt(d_head)
        groups = data.groups
        t = data.tokens
        cls = data.ended
        lines += [f"- Runs: {data.seeds}" + (" (every number below is the mean over seeds, probe by probe)"
                                                if data.n_seeds > 1 else ""),
                  f"- Probes: {len(t)}, from {fmt_tokens(t[0])} to {fmt_tokens(t[-1])} training tokens",
                  f"- d_head = {d_head} ({data.d_source}), so sqrt(d_head) = {ref:.2f}; a final norm within "
                  f"±{AT_TOLERANCE:.0%} of it ({ref * (1 - AT_TOLERANCE):.2f} to {ref * (1 + AT_TOLERANCE):.2f}) "
                  f"counts as at sqrt(d_head)",
                  f"- Ended above sqrt(d_head): {_layers_text(cls['above'])}",
                  f"- Ended below sqrt(d_head): {_layers_text(cls['below'])}",
                  f"- Ended at sqrt(d_head) (within ±{AT_TOLERANCE:.0%}): {_layers_text(cls['at'])}", "",
                  "### Per layer (initial = first probe, final = last probe)", "",
                  "| layer | group | initial norm | final norm | change | vs sqrt(d_head) | initial max_abs | "
                  "final max_abs | initial cos_mean | final cos_mean | final peak_frac |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for i in range(L):
            where = "above" if i in cls["above"] else "below" if i in cls["below"] else \
                "at" if i in cls["at"] else "n/a"
            n0, n1 = s["norm_mean"][0, i], s["norm_mean"][-1, i]
            lines.append(f"| {i} | {group_of(i, groups)} | {fmt_num(n0)} | {fmt_num(n1)} | {fmt_num(n1 - n0, 3)} | "
                         f"{where} | "
                         f"{fmt_num(s['max_abs'][0, i])} | {fmt_num(s['max_abs'][-1, i])} | "
                         f"{fmt_num(s['cos_mean'][0, i], 4)} | {fmt_num(s['cos_mean'][-1, i], 4)} | "
                         f"{fmt_num(s['peak_frac'][-1, i], 4)} |")
        lines += ["", "### Layer groups (mean over the group's layers)", "",
                  "| group | layers | initial norm | final norm | initial max_abs | final max_abs | "
                  "initial cos_mean | final cos_mean |", "|---|---|---|---|---|---|---|---|"]
        for g, layers in groups.items():
            def gm(m, p):
                return float(group_mean(s[m][[p]], layers)[0])
            lines.append(f"| {g} | {', '.join(map(str, layers))} | {fmt_num(gm('norm_mean', 0))} | "
                         f"{fmt_num(gm('norm_mean', -1))} | {fmt_num(gm('max_abs', 0))} | "
                         f"{fmt_num(gm('max_abs', -1))} | "
                         f"{fmt_num(gm('cos_mean', 0), 4)} | {fmt_num(gm('cos_mean', -1), 4)} |")
        if data.final_norm_std is not None:
            lines += ["", "Final norm per layer, spread over seeds (std): "
                      + ", ".join(f"layer {i}: {data.final_norm_std[i]:.3f}" for i in range(L))]
        lines.append("")
    return "\n".join(lines) + "\n"
