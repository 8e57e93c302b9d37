"""Figures and report sections of the inspection's dictionary sections (2A token dictionaries,
2B input lens beside the logit lens, 3 head words), from the inspect.json dict alone (no torch).
Files written before these sections existed have none of their keys and get neither."""
from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from research.plots.common import drawable, fmt_num, styled, subplots

FIGURES = ("word_similarity.png", "lenses.png", "head_words.png")
SECTIONS = ("dictionaries", "input_lens", "head_words")


def has_sections(r: dict) -> bool:
    return all(k in r for k in SECTIONS)


@styled
def plot_word_similarity(r: dict):
    w = r["dictionaries"]["words"]
    fig, axes = subplots(1, 2, figsize=(11, 4.8))
    for ax, which in zip(axes, ("input", "output")):
        ax.grid(False)
        ax.set_title(f"{which} dictionary: cosine of word embeddings")
        if not w["words"]:
            ax.text(0.5, 0.5, "no chosen word is a single token", ha="center", va="center", transform=ax.transAxes)
            continue
        im = ax.imshow(np.array(w[which]), vmin=-1, vmax=1, cmap="RdBu_r")
        ticks = range(len(w["words"]))
        ax.set_xticks(ticks, w["words"], rotation=60, ha="right")
        ax.set_yticks(ticks, w["words"])
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig


def _lens_panel(ax, lens: dict, j: int, value: str, title: str) -> None:
    """States (rows) x rank (columns), coloured by `value`, each cell naming its token."""
    rows = [layer["positions"][j] for layer in lens["layers"]]
    vals = np.array([e[value] for e in rows], dtype=float)
    ax.imshow(vals, aspect="auto", origin="lower", cmap="viridis", vmin=0, vmax=1)
    for s, e in enumerate(rows):
        for k, tok in enumerate(e["tokens"]):
            ax.text(k, s, drawable(tok, 10), ha="center", va="center", fontsize=7, color="w")
    ax.set_title(title)
    ax.set_xlabel("rank")
    ax.set_ylabel("state (0 = embeddings)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # ranks and states are whole numbers
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(False)


@styled
def plot_lenses(r: dict):
    """Per logit-lens position, the logit lens (prob) beside the input lens (cosine)."""
    logit, inp = r["logit_lens"], r["input_lens"]
    P, S = len(inp["positions"]), len(inp["layers"])
    fig, axes = subplots(P, 2, figsize=(12, (1.5 + 0.3 * S) * P), squeeze=False)
    for j, pos in enumerate(inp["positions"]):
        tok = "'" + drawable(r["tokens"][pos], 20) + "'"
        _lens_panel(axes[j, 0], logit, j, "probs", f"logit lens at {pos} ({tok}): final norm + output, prob")
        _lens_panel(axes[j, 1], inp, j, "cos", f"input lens at {pos} ({tok}): cosine with input embeddings")
    fig.tight_layout()
    return fig


@styled
def plot_head_words(r: dict):
    """The largest projection per head, labelled with the token that has it."""
    hw = r["head_words"]
    fig, axes = subplots(1, 2, figsize=(12, 3.8), sharey=True)
    for ax, kind in zip(axes, ("query", "key")):
        heads = hw[kind]
        top = [h["projections"][0] for h in heads]
        ax.bar([h["head"] for h in heads], top, color="C0" if kind == "query" else "C1", label=f"{kind} heads")
        for h, y in zip(heads, top):
            ax.text(h["head"], y, drawable(h["tokens"][0], 10), ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_title(f"layer {hw['layer']}: {kind} heads, top word's projection")
        ax.set_xlabel(f"{kind} head" if kind == "query" else "KV head")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("|cos(top direction, input embedding)|")
    axes[0].set_ylim(0, 1.05)
    fig.tight_layout()
    return fig


def figures(r: dict) -> dict:
    return dict(zip(FIGURES, (plot_word_similarity(r), plot_lenses(r), plot_head_words(r))))


def _dictionary_lines(r: dict) -> list[str]:
    d = r["dictionaries"]
    sample = (f"all {d['vocab_size']:,} tokens" if d["exact"] else
              f"a sample of {d['sample_tokens']:,} of {d['vocab_size']:,} tokens, seed {d['seed']}")
    lines = ["## Token dictionaries", "", "![](word_similarity.png)", "",
             f"Over {d['pairs']:,} token pairs ({sample}), the share with a positive inner product: input "
             f"dictionary **{d['positive_share_input']:.1%}**, output dictionary **{d['positive_share_output']:.1%}** "
             f"(mean cosine {fmt_num(d['mean_cos_input'])} and {fmt_num(d['mean_cos_output'])}). Correlation of the "
             f"pairs' cosines read in the two dictionaries: **{fmt_num(d['input_output_correlation'])}**"
             + (" (tied embeddings: one matrix)." if d["tied"] else "."), ""]
    w = d["words"]
    if w["skipped"]:
        lines += ["Not a single token, skipped: " + ", ".join(w["skipped"]) + ".", ""]
    pairs = sorted(((w["input"][i][j], w["output"][i][j], a, b) for i, a in enumerate(w["words"])
                    for j, b in enumerate(w["words"]) if i < j), reverse=True)[:10]
    if pairs:
        lines += ["| word pair | input cosine | output cosine |", "|---|---|---|"]
        lines += [f"| {a} / {b} | {fmt_num(ci)} | {fmt_num(co)} |" for ci, co, a, b in pairs] + [""]
    return lines


def _input_lens_lines(r: dict) -> list[str]:
    lens, logit = r["input_lens"], r["logit_lens"]
    lines = ["## Input lens", "", "![](lenses.png)", "",
             f"Each state read through the input dictionary ({lens['measure']}), beside the logit lens.", ""]
    for j, pos in enumerate(lens["positions"]):
        lines += [f"Position {pos} (token {r['tokens'][pos]!r}): rank of its own token in the input lens, by state: "
                  + ", ".join(str(x) for x in lens["input_rank"][j]) + ".", "",
                  "| hidden state | input lens (cosine) | own token's rank | logit lens (prob) |", "|---|---|---|---|"]
        for a, b in zip(lens["layers"], logit["layers"]):
            e, f = a["positions"][j], b["positions"][j]
            lines.append(f"| {a['layer']} | " + ", ".join(f"{t!r} ({c:.2f})" for t, c in zip(e["tokens"], e["cos"]))
                         + f" | {e['input_rank']} | "
                         + ", ".join(f"{t!r} ({p:.2f})" for t, p in zip(f["tokens"], f["probs"])) + " |")
        lines.append("")
    return lines


def _head_lines(r: dict) -> list[str]:
    hw = r["head_words"]
    lines = [f"## What the heads look for (layer {hw['layer']})", "", "![](head_words.png)", "",
             f"Per head: the {hw['definition']}; signed cosines shown. Largest projection of any single word: "
             f"query heads **{fmt_num(hw['max_projection_query'], 2)}**, "
             f"key heads **{fmt_num(hw['max_projection_key'], 2)}**.", ""]
    for kind in ("query", "key"):
        lines += [f"| {kind} head | top tokens (cosine) | energy share of the direction |", "|---|---|---|"]
        for h in hw[kind]:
            toks = ", ".join(f"{t!r} ({s * p:+.2f})" for t, s, p in zip(h["tokens"], h["signs"], h["projections"]))
            lines.append(f"| {h['head']} | {toks} | {fmt_num(h['energy_share'], 2)} |")
        lines.append("")
    return lines


def report_lines(r: dict) -> list[str]:
    """The three sections of report.md (none for files written before they existed)."""
    return _dictionary_lines(r) + _input_lens_lines(r) + _head_lines(r) if has_sections(r) else []
