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

from research.analysis.keys import WITH_WD, WITHOUT_WD, KeyDynamics, KeysAnalysis, group_mean, group_of
from research.analysis.rules import Decision, log_margin
from research.analysis.wording import effect_text, ratio_text, rule_text
from research.plots.common import (GROUP_COLORS, decided_text, decision_table, figure_line, fmt_diff_ci, fmt_num,
                                   fmt_tokens, label, message_figure, smooth, styled, subplots, tokens_axis,
                                   undecided_text)
from research.plots.in_short import MOST, family_text, outcome_words, short_line

GROUP_NAMES = {"early": "early layers", "middle": "middle layers", "final": "final layers"}
NO_RECORDS = ("This results file has no per-probe key records ('probes'),\n"
              "only the write-ups' summary fields; key norms cannot be drawn.")


FIGURE_BASES = ("key_analysis_report", "key_norm_evolution")  # one of each per condition (figure_name)


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


def _panel_final_norms(ax, data: KeyDynamics, margin: float) -> None:
    L, groups, ref = data.n_layers, data.groups, math.sqrt(data.d_head)
    final = data.series["norm_mean"][-1]
    colors = [GROUP_COLORS[group_of(i, groups).split("/")[-1]] if group_of(i, groups) != "-" else "#9a9a9a"
              for i in range(L)]
    ax.bar(np.arange(L), final, color=colors, edgecolor="black", lw=0.5)
    _sqrt_line(ax, data.d_head)
    ax.axhspan(ref / math.exp(log_margin(margin)), ref * math.exp(log_margin(margin)), color="grey", alpha=0.2, lw=0,
               label=f"±{margin:.0%}: the equivalence margin around √d_head")
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


@styled
def analysis_figure(cond: str, data: KeyDynamics, margin: float):
    """The four-panel key analysis report of one condition."""
    fig, axes = subplots(2, 2, figsize=(13, 9))
    for ax, panel in zip(axes.ravel()[:3], (_panel_norm, _panel_outliers, _panel_redundancy)):
        panel(ax, data)
    _panel_final_norms(axes[1, 1], data, margin)
    fig.suptitle(f"Key dynamics: {label(cond)} ({data.seeds}); keys at the k_norm output (pre-RoPE), "
                 f"layer = mean over KV heads", fontsize=12)
    fig.tight_layout()
    return fig


@styled
def evolution_figure(cond: str, data: KeyDynamics):
    s = data.series["norm_mean"]
    groups = data.groups
    fig, ax = subplots(figsize=(9, 5.5))
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


def figures(analysis: KeysAnalysis) -> dict:
    """Both figures of every condition, by file name."""
    out = {}
    conds = analysis.conditions
    for cond, data in conds.items():
        a_name, e_name = (figure_name(b, cond, len(conds)) for b in FIGURE_BASES)
        if data is None:
            out[a_name] = message_figure(f"Key dynamics: {label(cond)}", NO_RECORDS)
            out[e_name] = message_figure(f"Key norm over training: {label(cond)}", NO_RECORDS)
        else:
            out[a_name] = analysis_figure(cond, data, analysis.margin)
            out[e_name] = evolution_figure(cond, data)
    return out


# ----------------------------------------------------------------------------- report

def _layers_text(layers: list[int]) -> str:
    if not layers:
        return "none"
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))


def _figures(cond: str, n_conditions: int) -> tuple[str, str]:
    """The Markdown lines of a condition's two figures: the four panels, then the norm over training."""
    a_name, e_name = (figure_name(b, cond, n_conditions) for b in FIGURE_BASES)
    return (figure_line(a_name, f"Key norm, outliers and redundancy by layer group and final norm per layer of {cond}"),
            figure_line(e_name, f"Key norm of each layer group of {cond} over training"))


def _condition(cond: str, data: KeyDynamics, margin: float, n_conditions: int = 1) -> list[str]:
    s, L, d_head, groups, t = data.series, data.n_layers, data.d_head, data.groups, data.tokens
    ref = math.sqrt(d_head)
    where = {i: data.ended_where(i) for i in range(L)}
    lines = [f"- Runs: {data.seeds}" + ("; every number below is their mean, probe by probe" if data.n_seeds > 1
                                       else ""),
             f"- Probes: {len(t)}, from {fmt_tokens(t[0])} to {fmt_tokens(t[-1])} training tokens",
             f"- sqrt(d_head) = {ref:.2f} (d_head = {d_head}, {data.d_source}); at it within "
             f"{ref / math.exp(log_margin(margin)):.2f} to {ref * math.exp(log_margin(margin)):.2f}"
             + ("; one seed, so descriptive" if data.n_seeds < 2 else "")]
    for side in ("above", "below", "at", "undecided"):
        lines.append(f"- Ended {side if side == 'undecided' else side + ' sqrt(d_head)'}: "
                     f"{_layers_text([i for i in range(L) if where[i] == side])}")
    lines += ["", f"### Per layer (initial = first probe, at {fmt_tokens(t[0])} tokens; final = last probe, at "
              f"{fmt_tokens(t[-1])} tokens)", "",
              f"| layer ({cond}) | group | initial norm | final norm | change | vs sqrt(d_head) | initial max_abs | "
              "final max_abs | initial cos_mean | final cos_mean | final peak_frac |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for i in range(L):
        n0, n1 = s["norm_mean"][0, i], s["norm_mean"][-1, i]
        lines.append(f"| {i} | {group_of(i, groups)} | {fmt_num(n0)} | {fmt_num(n1)} | {fmt_num(n1 - n0, 3)} | "
                     f"{where[i]} | {fmt_num(s['max_abs'][0, i])} | {fmt_num(s['max_abs'][-1, i])} | "
                     f"{fmt_num(s['cos_mean'][0, i], 4)} | {fmt_num(s['cos_mean'][-1, i], 4)} | "
                     f"{fmt_num(s['peak_frac'][-1, i], 4)} |")
    panels, evolution = _figures(cond, n_conditions)
    lines += ["", panels, "", "### Layer groups (mean over the group's layers)", "",
              f"| group ({cond}) | layers | initial norm | final norm | initial max_abs | final max_abs | "
              "initial cos_mean | final cos_mean |", "|---|---|---|---|---|---|---|---|"]
    for g, layers in groups.items():
        def gm(m, p):
            return float(group_mean(s[m][[p]], layers)[0])
        lines.append(f"| {g} | {', '.join(map(str, layers))} | {fmt_num(gm('norm_mean', 0))} | "
                     f"{fmt_num(gm('norm_mean', -1))} | {fmt_num(gm('max_abs', 0))} | "
                     f"{fmt_num(gm('max_abs', -1))} | {fmt_num(gm('cos_mean', 0), 4)} | "
                     f"{fmt_num(gm('cos_mean', -1), 4)} |")
    if data.final_norm_std is not None:
        lines += ["", "Final norm per layer, spread over seeds (std): "
                  + ", ".join(f"layer {i}: {data.final_norm_std[i]:.3f}" for i in range(L))]
    return lines + ["", evolution, ""]


def _wd_share(group: str, wd: Decision, with_wd: Decision | None, margin: float) -> str:
    """Weight decay's share of a group's norm change, given only when both its part and the change are settled
    beyond the margin; otherwise what is not decided, with its interval. Both are decided on log ratios (the growth
    with weight decay over the growth without, the final norm over the initial), so the share is one of the log
    change: ln(growth) = weight decay's part + ln(growth without it)."""
    part = f"- {group} layers: weight decay's part of the change"
    if with_wd is None:
        return f"{part}: ratio {wd.rel:+.1%} ({wd.outcome}); the change with weight decay was not measured"
    if wd.differs and with_wd.differs:
        return (f"- {group} layers: change {fmt_diff_ci(with_wd, 3)} with weight decay, of which {fmt_diff_ci(wd, 3)} "
                f"({wd.est / with_wd.est:.0%} of the log change) is weight decay's (both beyond the margin).")
    if wd.same:
        return f"{part}: {fmt_diff_ci(wd, 3)}, {wd.outcome}: inside \u00b1{margin:.0%}, no share."
    if not wd.decided:
        return f"{part}: {undecided_text(wd, 3)}. No share is given."
    return (f"{part}: {fmt_diff_ci(wd, 3)}, {wd.outcome}; the change with weight decay: {decided_text(with_wd, 3)}. "
            f"No share is given.")


def _changes(analysis: KeysAnalysis) -> list[str]:
    if not analysis.group_changes:
        return []
    lines = ["## How each layer group's key norm changed", "",
             f"Final against initial mean key norm of the group, per seed ({rule_text(analysis.margin)}). "
             f"{ratio_text('key norms: a final norm against the initial one, or against sqrt(d_head)')}:", ""]
    lines += decision_table(analysis.group_changes, 3, lambda k: f"{k[0]}: {k[1]} layers")
    lines.append("")
    lines.append(_claim_line(analysis, str) + ".")
    shrink = {cond: f for cond, f in analysis.shrink.items() if f is not None and f < 1}
    if shrink:
        lines.append("- AdamW's weight decay alone would multiply every norm gain, and with it the keys' norm, over "
                     "the run ((1 \u2212 lr \u00d7 wd)^steps at the peak rate) by: "
                     + "; ".join(f"{cond} {f:.3f}" for cond, f in shrink.items()) + ".")
    if analysis.weight_decay:
        lines += ["", f"## What weight decay on the gains explains ({WITH_WD} minus {WITHOUT_WD})", "",
                  "Per group, the norm's growth (final over initial) with weight decay on the gains against its growth "
                  "without it, paired by seed, as a ratio: the part of the change weight decay alone explains. Log "
                  "changes add up, so a share of the change is a share of the log change. A share is given only "
                  "where that part and the change with weight decay both lie beyond the margin; a part inside the "
                  "margin puts no share of the change on weight decay.", ""]
        lines += decision_table(analysis.weight_decay, 3, lambda g: f"{g} layers")
        lines += [_wd_share(g, d, analysis.group_changes.get((WITH_WD, g)), analysis.margin)
                  for g, d in analysis.weight_decay.items()]
    return lines + [""]


def _claim_line(analysis: KeysAnalysis, name) -> str:
    """The write-ups' claim in every condition whose group changes were decided, in one line."""
    return ("- The write-ups' claim that early layers' keys shrink and final layers' keys grow: " + "; ".join(
        f"{name(c)} **{analysis.early_shrink_late_grow(c)}**" for c in dict.fromkeys(c for c, _ in
                                                                                     analysis.group_changes)))


def report(analysis: KeysAnalysis) -> str:
    one = any(data is not None and data.n_seeds < 2 for data in analysis.conditions.values())
    lines = ["# Key dynamics: what happens with attention keys as the LLM trains", "",
             "Keys measured at the k_norm output (pre-RoPE) on the fixed evaluation batch; every per-layer "
             "number is the mean over the layer's KV heads. norm = mean L2 norm of a key; max_abs = largest "
             "absolute key component (outlier magnitude); cos_mean = mean pairwise cosine similarity of keys "
             "within a sequence (redundancy); peak_frac = share of a key's energy in its top dimension. Where a "
             f"layer ended: its final norm against sqrt(d_head), at it within \u00b1{analysis.margin:.0%} of the mean "
             "of the two (the band each condition's section gives), decided per seed on log ratios, ln(norm / "
             "sqrt(d_head)), Bonferroni over the layers"
             + (" (with one seed: descriptive, by the sign of the log ratio beyond the margin)" if one else "")
             + ".", ""]
    for cond, data in analysis.conditions.items():
        lines += [f"## {label(cond)} (`{cond}`)", ""]
        n = len(analysis.conditions)
        if data is None:
            lines += ["No per-probe key records ('probes') in the results file(s): only the write-ups' summary "
                      "fields, so there is nothing to report on keys.", "", *_figures(cond, n), ""]
            continue
        lines += _condition(cond, data, analysis.margin, n)
    lines += _changes(analysis)
    return "\n".join(lines) + "\n"


def _ended_text(data: KeyDynamics) -> str:
    """Where the layers' final norms ended against sqrt(d_head): the layers on each side, those undecided."""
    where = {i: data.ended_where(i) for i in range(data.n_layers)}
    sides = [(side if side == "undecided" else f"{side} it", [i for i in where if where[i] == side])
             for side in ("above", "below", "at", "undecided")]
    return ", ".join(f"{_layers_text(ix)} {name}" for name, ix in sides if ix)


def in_short(analysis: KeysAnalysis) -> list[str]:
    """The study's question (what weight decay on the gains explains of each layer group's key-norm change), each
    group with its outcome, effect and interval; then per condition each group's change and where its layers ended
    against sqrt(d_head), and the write-ups' claim."""
    lines = []
    if analysis.weight_decay:
        family = family_text("weight-decay family", analysis.weight_decay.values())
        lines += [short_line(f"weight decay on the gains, {g} layers' key-norm growth ({WITH_WD} / {WITHOUT_WD})", d,
                             family) for g, d in analysis.weight_decay.items()]
    family = family_text("group-change family", analysis.group_changes.values())
    conds = []
    for cond, data in analysis.conditions.items():
        if data is None:
            conds.append(f"- {label(cond)}: no per-probe key records, nothing measured")
            continue
        changes = [(g, analysis.group_changes[(cond, g)]) for g in data.groups if (cond, g) in analysis.group_changes]
        conds.append(f"- {label(cond)}, key norm final / initial: "
                     + ", ".join(f"{g} {outcome_words(d)} {effect_text(d)}" for g, d in changes)
                     + f" ({family}); final norm against sqrt(d_head) = {math.sqrt(data.d_head):.2f}: "
                     + _ended_text(data))
    room = MOST - len(lines) - 1
    if len(conds) > room:
        conds = conds[:room - 1] + [f"- {len(conds) - room + 1} more conditions: in their sections below"]
    lines += conds
    if analysis.group_changes:
        lines.append(_claim_line(analysis, label))
    return lines
