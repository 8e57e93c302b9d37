"""Figures and report of the head-specialization study (research.analysis.heads).

One set of figures per condition (with several conditions the names get the condition as a suffix, e.g.
norm_divergence_QK.png); per-head figures draw the first seed's run: heads are not matched across seeds.

    norm_divergence.png      key norm and entropy of each KV head over training (the layer whose norms end most spread)
    entropy_norm_scatter.png every (layer, KV head) at every probe as a dot, key norm vs entropy,
                             coloured by training tokens, with the taxonomy thresholds
    effective_rank.png       erank of the keys (layer mean over KV heads) per layer over training
    gamma_heatmap.png        k_norm gain per dimension over training for the same layer
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize

from research.analysis.heads import (SINK_MASS, TAXONOMY_MARGIN, HeadsAnalysis, HeadsCondition, HeadSeries,
                                    LayerChoice, Taxonomy)
from research.plots.common import (decided_text, figure_line, fmt_num, fmt_p, fmt_tokens, label, message_figure, styled,
                                   subplots, tokens_axis)
from research.plots.in_short import MOST, family_text, short_line
from research.plots.keys import figure_name

FIGURE_BASES = ("norm_divergence", "entropy_norm_scatter", "effective_rank", "gamma_heatmap")
FIGURE_WHAT = {"norm_divergence": "Key norm and entropy of each KV head of one layer over training",
               "entropy_norm_scatter": "Key norm against entropy of every head at every probe",
               "effective_rank": "Effective rank of the keys per layer over training",
               "gamma_heatmap": "k_norm gain per dimension over training"}
NO_RECORDS = ("This results file has no per-probe head records ('probes'),\n"
              "only the write-ups' summary fields; per-head figures cannot be drawn.")


# ----------------------------------------------------------------------------- figures

def _head_label(h: HeadSeries, k: int) -> str:
    g = h.group
    q = f"query head {k * g}" if g == 1 else f"query heads {k * g}-{k * g + g - 1}"
    return f"KV head {k} ({q})"


@styled
def divergence_figure(cond: str, h: HeadSeries, shown: LayerChoice, seed_txt: str):
    layer, why = shown.layer, shown.why
    fig, (a, b) = subplots(1, 2, figsize=(13, 5))
    colors = colormaps["tab10"]
    for ax, metric, ylabel in ((a, "norm_mean", "mean key L2 norm"),
                               (b, "entropy", "attention entropy (nats), mean over its query heads")):
        x = tokens_axis(ax, h.tokens)
        for k in range(h.n_kv):
            ax.plot(x, h.series[metric][:, layer, k], color=colors(k % 10), lw=2, marker="o", ms=3,
                    label=_head_label(h, k))
        ax.set_ylabel(ylabel)
        ax.legend()
    if h.d_head:
        a.axhline(math.sqrt(h.d_head), color="black", ls="--", lw=1)
        a.text(0.01, math.sqrt(h.d_head), f" √d_head = {math.sqrt(h.d_head):.2f}", va="bottom", fontsize=8,
               transform=a.get_yaxis_transform())
    a.set_title("key norm per KV head")
    b.set_title("attention entropy per KV head")
    one = " (one KV head per layer: one line)" if h.n_kv == 1 and "one KV head" not in why else ""
    fig.suptitle(f"Per-head divergence in layer {layer}: {label(cond)}, {seed_txt}\n"
                 f"layer {layer} chosen: {why}{one}", fontsize=11)
    fig.tight_layout()
    return fig


@styled
def scatter_figure(cond: str, h: HeadSeries, cls: Taxonomy, seed_txt: str):
    """Key norm against attention entropy of every head at every probe; the last probe's heads marked by
    their class (the taxonomy is by attention: sink mass and entropy)."""
    P = len(h.tokens)
    norms, ents = h.series["norm_mean"].reshape(P, -1), h.series["entropy"].reshape(P, -1)
    tok = np.repeat(h.tokens[:, None], norms.shape[1], axis=1) / 1e6
    fig, ax = subplots(figsize=(9.5, 6.5))
    sc = ax.scatter(norms.ravel(), ents.ravel(), c=tok.ravel(), cmap="viridis", s=18, alpha=0.8,
                    norm=Normalize(np.nanmin(tok), max(np.nanmax(tok), np.nanmin(tok) + 1e-9)), lw=0)
    fig.colorbar(sc, ax=ax, label="training tokens (millions)")
    last = cls.classes.ravel()
    for name, col, marker in (("sink", "#c44e52", "s"), ("gatherer", "#2a9d8f", "D"), ("neither", "black", "o")):
        pick = last == name
        ax.scatter(norms[-1][pick], ents[-1][pick], facecolors="none", edgecolors=col, marker=marker, s=70, lw=1.4,
                   label=f"last probe: {name} ({int(pick.sum())})")
    ax.axhline(cls.sink_entropy, color="#c44e52", lw=1, ls="--",
               label=f"sinks: sink mass > {cls.sink_mass:g} and entropy < {cls.sink_entropy:.2f}")
    ax.axhline(cls.gatherer_entropy, color="#2a9d8f", lw=1, ls="--",
               label=f"gatherers: sink mass \u2264 {cls.sink_mass:g} and entropy > {cls.gatherer_entropy:.2f}")
    ax.set_xlabel("mean key L2 norm of the KV head")
    ax.set_ylabel("attention entropy (nats), mean over the KV head's query heads")
    ax.set_title(f"Every head at every probe: {label(cond)}, {seed_txt}\n"
                 f"one dot per (layer, KV head) per probe; entropy thresholds = median at the last probe "
                 f"\u00d7 (1 \u00b1 {cls.margin:g})")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


@styled
def erank_figure(cond: str, c: HeadsCondition, d_head: int | None):
    er = c.erank
    L = er.shape[1]
    fig, ax = subplots(figsize=(9.5, 5.5))
    x = tokens_axis(ax, c.erank_tokens)
    cmap = colormaps["viridis"]
    norm = Normalize(0, max(L - 1, 1))
    for i in range(L):
        ax.plot(x, er[:, i], color=cmap(norm(i)), lw=1.8, marker="o", ms=2.5,
                label=f"layer {i}" if L <= 8 else None)
    if L > 8:  # too many layers for a legend: a colour bar of depth instead
        fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="layer (0 = first)")
    if d_head:
        ax.axhline(d_head, color="black", ls=":", lw=1, label=f"d_head = {d_head} (largest possible)")
    ax.set_ylabel("effective rank of the keys (exp of singular-value entropy)")
    ax.set_title(f"Effective rank of the keys per layer over training: {label(cond)}, {c.erank_seeds}\n"
                 f"keys at the k_norm output (pre-RoPE), mean over the layer's KV heads")
    ax.legend(fontsize=8, ncol=2 if L > 4 else 1)
    fig.tight_layout()
    return fig


@styled
def gamma_figure(cond: str, h: HeadSeries, shown: LayerChoice, seed_txt: str):
    layer, why = shown.layer, shown.why
    cols = [(p, g[layer]) for p, g in enumerate(h.gains) if g[layer] is not None]
    if not cols:
        reason = ("this run has qk_norm = none: keys are not normalized, so there are no k_norm gains"
                  if h.qk_norm in (None, "none") else "no k_norm gain values were recorded in this run")
        return message_figure(f"k_norm gain heatmap, layer {layer}: {label(cond)}", f"Nothing to draw:\n{reason}.")
    probes = [p for p, _ in cols]
    G = np.stack([g for _, g in cols], axis=1)  # [D, n_probes]
    half = float(np.nanmax(np.abs(G - 1.0))) if np.isfinite(G).any() else 0.0
    half = max(half, 1e-3)
    fig, ax = subplots(figsize=(10, 6.5))
    im = ax.imshow(G, aspect="auto", origin="lower", cmap="RdBu_r", vmin=1 - half, vmax=1 + half,
                   interpolation="nearest")
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="k_norm gain γ (1 = initial value)")
    ticks = np.unique(np.linspace(0, len(probes) - 1, min(len(probes), 8)).round().astype(int))
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{h.tokens[probes[t]] / 1e6:.3g}" for t in ticks])
    ax.set_xlabel("training tokens (millions) at each probe")
    full = h.d_head is not None and G.shape[0] != h.d_head  # qk_norm_scope full: one gain over the whole projection
    ax.set_ylabel("k projection dimension (KV head x d_head + key dimension)" if full else
                  "key dimension (0 .. d_head - 1)")
    frozen = " (gain frozen at 1)" if h.qk_norm == "frozen" else ""
    ax.set_title(f"k_norm gain per dimension over training, layer {layer}{frozen}: {label(cond)}, {seed_txt}\n"
                 f"layer {layer}: {why}; " + ("one gain over the whole k projection" if full else
                                               "one gain vector shared by the layer's heads"))
    fig.tight_layout()
    return fig


def _seed_txt(h: HeadSeries, n: int) -> str:
    """Per-head figures show one run: which one."""
    base = f"seed {h.seed}" if h.seed is not None else "first run"
    return base + (f" (first of {n} seeds)" if n > 1 else "")


def figures(analysis: HeadsAnalysis) -> dict:
    """The four figures of every condition, by file name; per-head figures show the first seed."""
    out = {}
    for cond, c in analysis.conditions.items():
        names = [figure_name(b, cond, len(analysis.conditions)) for b in FIGURE_BASES]
        if c is None:
            for b, n in zip(FIGURE_BASES, names):
                out[n] = message_figure(f"{b.replace('_', ' ')}: {label(cond)}", NO_RECORDS)
            continue
        first = c.runs[0]
        h, seed_txt = first.heads, _seed_txt(first.heads, c.n_seeds)
        figs = (divergence_figure(cond, h, first.shown, seed_txt), scatter_figure(cond, h, first.taxonomy, seed_txt),
                erank_figure(cond, c, h.d_head), gamma_figure(cond, h, first.shown, seed_txt))
        out.update(zip(names, figs))
    return out


# ----------------------------------------------------------------------------- report

def _heads_text(pairs) -> str:
    return "; ".join(f"layer {i} KV head {k}" for i, k in pairs) if pairs else "none"


def _table(cond: str, h: HeadSeries, cls: Taxonomy) -> list[str]:
    s = h.series
    lines = ["", f"| layer ({cond}) | KV head | norm | max_abs | pr_vec | entropy | sink_mass | qk_ratio | class |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i in range(h.n_layers):
        for k in range(h.n_kv):
            lines.append(f"| {i} | {k} | {fmt_num(s['norm_mean'][-1, i, k])} | "
                         f"{fmt_num(s['max_abs'][-1, i, k])} | {fmt_num(s['pr_vec'][-1, i, k], 2)} | "
                         f"{fmt_num(s['entropy'][-1, i, k])} | {fmt_num(s['sink_mass'][-1, i, k], 4)} | "
                         f"{fmt_num(s['qk_ratio'][-1, i, k])} | {cls.classes[i, k]} |")
    return lines


def _norm_gap(c: HeadsCondition) -> list[str]:
    if c.norm_gap is None:
        return ["No seed has both a sink and a gatherer: the claim is not tested.", ""]
    d = c.norm_gap
    p = f" (p = {fmt_p(d.p_adj)})" if d.tested else ""
    return [f"Sinks' key norm against gatherers' ({d.n} seed{'' if d.n == 1 else 's'} with both): "
            f"{decided_text(d, 3)}{p}. The claim: "
            f"**{c.norm_gap_claim}**.", ""]


def _erank_text(c: HeadsCondition) -> str:
    """The keys' effective rank per layer at the last probe every seed shares (mean over the layer's KV heads and the
    seeds)."""
    if not c.erank.size:
        return "No effective rank of the keys in these runs."
    final = c.erank[-1]
    return (f"Effective rank of the keys at the last probe ({fmt_tokens(c.erank_tokens[-1])} tokens; mean over the "
            f"layer's KV heads, {c.erank_seeds}): " + ", ".join(f"layer {i} {fmt_num(v, 1)}" for i, v in
                                                                  enumerate(final)) + ".")


def report(analysis: HeadsAnalysis) -> str:
    lines = ["# Head specialization: sinks vs gatherers", "",
             "Per KV head, on the fixed evaluation batch. Key metrics at the k_norm output (pre-RoPE): norm = mean "
             "key L2 norm, max_abs = largest |key component|, pr_vec = dimensions used by one key. Attention "
             "metrics are measured per query head; the entropy (nats), sink mass (attention on position 0) and "
             "q/k norm ratio of a KV head are the MEAN over the query heads that share it "
             "(query head h -> KV head h // (n_heads / n_kv_heads)).", "",
             f"Taxonomy at the last probe, by attention alone (it works when key norms cannot move), entropy "
             f"relative to its median over all (layer, KV head) pairs of the run, margin m = {TAXONOMY_MARGIN:g}:",
             "",
             f"- **sink**: sink mass > {SINK_MASS:g} (Gu et al. 2024) and entropy < median entropy "
             f"\u00d7 {1 - TAXONOMY_MARGIN:g}",
             f"- **gatherer**: sink mass \u2264 {SINK_MASS:g} and entropy > median entropy "
             f"\u00d7 {1 + TAXONOMY_MARGIN:g}",
             "- **neither**: every other head", "",
             "The write-ups' claim that sinks have high and gatherers low key norms is tested in each condition on its "
             "seeds that have both: per seed the sinks' mean key norm against the gatherers', decided on log ratios "
             "(docs/decisions.md#ratio-quantities).", ""]
    for cond, c in analysis.conditions.items():
        lines += [f"## {label(cond)} (`{cond}`)", ""]
        names = dict(zip(FIGURE_BASES, (figure_name(b, cond, len(analysis.conditions)) for b in FIGURE_BASES)))
        if c is None:
            lines += ["No per-probe head records ('probes') in the results file(s): nothing to classify.", ""]
            lines += [line for b, what in FIGURE_WHAT.items() for line in (figure_line(names[b], what), "")]
            continue
        lines += [_erank_text(c), "", figure_line(names["effective_rank"], FIGURE_WHAT["effective_rank"]), ""]
        lines += _norm_gap(c)
        for idx, run in enumerate(c.runs):
            h, cls, widest = run.heads, run.taxonomy, run.divergence
            sinks, gath = cls.heads("sink"), cls.heads("gatherer")
            lines += [f"### {'seed ' + str(h.seed) if h.seed is not None else 'run ' + str(idx + 1)}", "",
                      f"- Last probe at {fmt_tokens(h.tokens[-1])} training tokens; {h.n_layers} layers \u00d7 "
                      f"{h.n_kv} KV heads ({h.group} query head(s) per KV head)",
                      f"- Median entropy over the {h.n_layers * h.n_kv} heads: {cls.median_entropy:.3f} nats",
                      f"- Thresholds: sink if sink mass > {cls.sink_mass:g} and entropy < {cls.sink_entropy:.3f}; "
                      f"gatherer if sink mass \u2264 {cls.sink_mass:g} and entropy > {cls.gatherer_entropy:.3f}",
                      f"- Sinks ({len(sinks)}): {_heads_text(sinks)}",
                      f"- Gatherers ({len(gath)}): {_heads_text(gath)}",
                      f"- Neither: {int((cls.classes == 'neither').sum())} heads",
                      f"- Largest head divergence in layer {widest.layer}: {widest.why}"]
            g_last = h.gains[-1][widest.layer]
            if g_last is not None:
                lines.append(f"- k_norm gain of layer {widest.layer} at the last probe: mean {np.mean(g_last):.3f}, "
                             f"min {np.min(g_last):.3f}, max {np.max(g_last):.3f}, "
                             f"cv {np.std(g_last, ddof=1) / abs(np.mean(g_last)):.4f}")
            if idx == 0:  # the per-head figures show this run
                lines += _table(cond, h, cls)
                lines += [line for b in ("entropy_norm_scatter", "norm_divergence", "gamma_heatmap")
                          for line in ("", figure_line(names[b], FIGURE_WHAT[b]))]
            lines.append("")
    return "\n".join(lines) + "\n"


def _found_text(counts: dict, several: bool) -> str:
    """The sinks and gatherers of a condition's seeds: 'no sink and no gatherer in any seed', '1 sink and 2 gatherers
    in every seed', or by seed: 'sinks 0, 1, 1 and gatherers 1, 1, 1 by seed'."""
    sinks, gatherers = counts["sink"], counts["gatherer"]
    if not any(sinks + gatherers):
        return "no sink and no gatherer" + (" in any seed" if several else "")
    if len(set(sinks)) == 1 and len(set(gatherers)) == 1:
        return (f"{sinks[0]} sink{'' if sinks[0] == 1 else 's'} and {gatherers[0]} "
                f"gatherer{'' if gatherers[0] == 1 else 's'}" + (" in every seed" if several else ""))
    return f"sinks {', '.join(map(str, sinks))} and gatherers {', '.join(map(str, gatherers))} by seed"


def in_short(analysis: HeadsAnalysis) -> list[str]:
    """What the study measured (it decides no primary question): per condition the sinks and gatherers at the last
    probe and the keys' effective rank, then the sinks' key norm against the gatherers' where a seed has both."""
    lines = []
    for cond, c in analysis.conditions.items():
        if c is None:
            lines.append(f"- {label(cond)}: no per-probe head records, nothing measured")
            continue
        heads = c.runs[0].heads.n_layers * c.runs[0].heads.n_kv
        counts = {name: [len(r.taxonomy.heads(name)) for r in c.runs] for name in ("sink", "gatherer")}
        rank = ""
        final = c.erank[-1] if c.erank.size else np.zeros(0)
        if np.isfinite(final).any():
            lo, hi = int(np.nanargmin(final)), int(np.nanargmax(final))
            d_head = c.runs[0].heads.d_head
            rank = (f"; key effective rank {fmt_num(final[lo], 1)} (layer {lo}) to {fmt_num(final[hi], 1)} "
                    f"(layer {hi})" + (f", at most d_head = {d_head}" if d_head else "") + f", {c.erank_seeds}")
        lines.append(f"- {label(cond)}, last probe: {_found_text(counts, len(c.runs) > 1)} (of {heads} KV heads)"
                     + rank)
        if c.norm_gap is not None:
            lines.append(short_line(f"{label(cond)}, sinks' mean key norm / gatherers'", c.norm_gap,
                                    family_text("its own family", [c.norm_gap]))
                         + f"; the write-ups' claim that sinks have higher key norms: **{c.norm_gap_claim}**")
    if len(lines) > MOST:
        lines = lines[:MOST - 1] + ["- more conditions: in their sections below"]
    return lines
