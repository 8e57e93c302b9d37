"""Figures and report of a study of any conditions (research.analysis.conditions; a study file, research/study.py).

    trajectories.png   each quantity (layer mean) over training: mean over seeds with its 95% band, per condition
    per_layer.png      each probed quantity per layer at the last probe, mean over seeds with its 95% band
    comparisons.png    every comparison of every quantity: its estimate and interval as a share of the compared
                       values' mean, against the margin (the outcome the report names is read off these)
"""
from __future__ import annotations

import math

import numpy as np

from research.analysis.conditions import QUANTITIES, ConditionsAnalysis
from research.analysis.rules import DIFFERENT, EQUAL, UNRESOLVED, WITHIN, rule_text
from research.analysis.series import aligned, mean_band
from research.plots.common import (CONDITION_COLORS, decided_text, decision_table, fmt_at, message_figure, styled,
                                   subplots, tokens_axis)
from research.plots.qk_norm_report import provenance_text
from research.results.read import seed_of

FIGURES = ("trajectories.png", "per_layer.png", "comparisons.png")
# The config fields a study's conditions usually set (issue 40's variants, QK-norm, QK-clip): the condition table
# shows each whose value is not the same in every run, and the shared line those that are
VARIANT_FIELDS = ("qk_norm", "qk_norm_scope", "attn_softcap", "attn_gate", "z_loss", "qk_optimizer",
                  "qk_lr_multiplier", "muon_update_scale", "qk_clip")
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f")


def colors(conditions: list[str]) -> dict[str, str]:
    """A distinct colour per condition: the project's colour of a known name where no other condition took it, else
    the next unused one of PALETTE (cycled past ten)."""
    out: dict[str, str] = {}
    for c in conditions:
        known = CONDITION_COLORS.get(c)
        if known and known not in out.values():
            out[c] = known
    free = [p for p in PALETTE if p not in out.values()] or list(PALETTE)
    for i, c in enumerate(c for c in conditions if c not in out):
        out[c] = free[i % len(free)]
    return {c: out[c] for c in conditions}


def _pair(key: tuple[str, str]) -> str:
    return f"{key[0]} \u2212 {key[1]}"


# ----------------------------------------------------------------------------- figures

def _band(ax, x, y, color: str, label: str):
    mean, half = mean_band(y)
    ax.plot(x, mean, color=color, lw=1.8, marker="o", ms=2.5, label=label)
    if y.shape[0] > 1 and np.isfinite(half).any():
        ax.fill_between(x, mean - half, mean + half, color=color, alpha=0.18, lw=0)


def _grid(n: int):
    cols = 3
    rows = math.ceil(n / cols)
    fig, axes = subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n]


def _panels(a: ConditionsAnalysis, title: str, quantities, series, suptitle: str, xlabel: str | None = None):
    """One panel per quantity, one band per condition: series(runs, q) -> (x, Y[n_runs, n]) or None."""
    if not a.conditions:
        return message_figure(title, "no runs")
    col = colors(a.conditions)
    fig, axes = _grid(len(quantities))
    for ax, q in zip(axes, quantities):
        for c in a.conditions:
            xy = series(ax, a.runs[c], q)
            if xy is not None:
                _band(ax, xy[0], xy[1], col[c], f"{c} (n={xy[1].shape[0]})")
        ax.set_title(q.text)
        if xlabel:
            ax.set_xlabel(xlabel)
    axes[0].legend(fontsize=8)
    fig.suptitle(suptitle)
    fig.tight_layout()
    return fig


def _trajectory(ax, runs: list[dict], q):
    tokens, y = aligned(runs, lambda r: list(q.trajectory(r)))
    return (tokens_axis(ax, tokens), y) if tokens.size else None


def _layers(ax, runs: list[dict], q):
    rows = [q.per_layer(r) for r in runs]
    n = min((len(v) for v in rows), default=0)
    return (np.arange(n), np.stack([v[:n] for v in rows])) if n else None


@styled
def fig_trajectories(a: ConditionsAnalysis):
    return _panels(a, "Trajectories", QUANTITIES, _trajectory,
                   "Over training: the layer mean at each probe, mean over seeds with its 95% band")


@styled
def fig_per_layer(a: ConditionsAnalysis):
    return _panels(a, "Per layer", [q for q in QUANTITIES if q.site is not None], _layers,
                   f"Per layer, {fmt_at([a.budget_tokens])}: mean over seeds with its 95% band", xlabel="layer")


@styled
def fig_comparisons(a: ConditionsAnalysis):
    pairs = list(next(iter(a.decisions.values()), {}))
    if not pairs:
        return message_figure("Comparisons", "one condition: nothing to compare")
    fig, axes = _grid(len(QUANTITIES))
    for ax, q in zip(axes, QUANTITIES):
        margin = (a.loss_margin if q.loss else a.margin) * 100
        ax.axvspan(-margin, margin, color="#999999", alpha=0.2, lw=0, label=f"margin \u00b1{margin:.3g}%")
        ax.axvline(0, color="black", lw=0.8)
        for i, p in enumerate(pairs):
            d = a.decisions[q.key][p]
            if not d.tested:
                ax.plot([], [])
                ax.text(0, i, "no test" if d.n else "no data", ha="center", va="center", fontsize=8)
                continue
            lo, hi = (v * 100 for v in d.ci_rel)
            shade = {DIFFERENT: "#c44e52", EQUAL: "#4c72b0", WITHIN: "#4c72b0"}.get(d.outcome, "#555555")
            ax.plot([lo, hi], [i, i], color=shade, lw=2.2)
            ax.plot(d.rel * 100, i, "o", color=shade, ms=5)
        ax.set_yticks(range(len(pairs)), [_pair(p) for p in pairs], fontsize=8)
        ax.set_ylim(len(pairs) - 0.4, -0.6)
        ax.set_xlabel("difference, % of the compared values' mean")
        ax.set_title(q.text)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Each comparison's estimate and Bonferroni interval (one family per quantity); red: beyond the "
                 "margin, blue: inside it, grey: not decided")
    fig.tight_layout()
    return fig


def figures(a: ConditionsAnalysis) -> dict:
    return dict(zip(FIGURES, (fig_trajectories(a), fig_per_layer(a), fig_comparisons(a))))


# ----------------------------------------------------------------------------- report

def _flat_config(res: dict) -> dict:
    cfg = res.get("config") or {}
    return {k: v for section in cfg.values() if isinstance(section, dict) for k, v in section.items()}


def _settings(a: ConditionsAnalysis) -> tuple[dict[str, str], str]:
    """({condition: the fields whose value is not the same in every run, 'field=value, ...'}, the shared line: the
    variant fields every run has at one value)."""
    configs = {c: _flat_config(a.runs[c][0]) for c in a.conditions}
    fields = list(dict.fromkeys(k for cfg in configs.values() for k in cfg))
    varying = [k for k in fields if k != "seed" and len({repr(cfg.get(k)) for cfg in configs.values()}) > 1]
    per = {c: ", ".join(f"{k}={configs[c].get(k, 'n/a')}" for k in varying) or "(the shared config)"
           for c in a.conditions}
    shared = [f"{k}={next(iter(configs.values())).get(k)}" for k in VARIANT_FIELDS
              if k not in varying and any(k in cfg for cfg in configs.values())]
    return per, ", ".join(shared)


def _value(e: dict, decimals: int) -> str:
    if e["mean"] is None:
        return "n/a"
    return f"{e['mean']:.{decimals}f}" + (f" \u00b1 {e['ci95']:.{decimals}f}" if e["ci95"] is not None else "")


def _findings(a: ConditionsAnalysis) -> list[str]:
    """One line per comparison: the quantities it decided beyond the margin and inside it, those where the difference
    is real but its size against the margin unresolved (with estimates), and those it did not decide."""
    lines = []
    for p in next(iter(a.decisions.values()), {}):
        beyond, inside, real, undecided = [], [], [], []
        for q in QUANTITIES:
            d = a.decisions[q.key][p]
            if not d.tested:
                undecided.append(q.text)
                continue
            lo, hi = d.ci_rel
            est = f"{q.text} {d.rel:+.1%} [{lo:+.1%}, {hi:+.1%}]"
            (beyond if d.differs else inside if d.same else real if d.outcome == UNRESOLVED else undecided).append(
                est if d.significant or d.same else q.text)
        parts = []
        if beyond:
            parts.append("differs beyond the margin in " + "; ".join(beyond))
        if inside:
            parts.append("lies within the margin in " + "; ".join(inside))
        if real:
            parts.append("differs, by a size the margin does not settle, in " + "; ".join(real))
        if undecided:
            parts.append("is not decided in " + ", ".join(undecided))
        lines.append(f"- **{_pair(p)}** " + ", and ".join(parts) + ".")
    return lines


def report(a: ConditionsAnalysis) -> str:
    conds = a.conditions
    against = (f"each condition against the baseline {a.baseline}" if a.baseline else "every pair of conditions")
    lines = [f"# Conditions compared: {', '.join(conds) or 'none'}", "",
             f"The study compares {against} in {len(QUANTITIES)} quantities, each taken {fmt_at([a.budget_tokens])} "
             f"(a probed quantity: its mean over layers at the last probe). Values are mean \u00b1 95% confidence "
             f"half width over seeds; n is the number of seeds.", ""]
    per, shared = _settings(a)
    lines += ["## Conditions", "", "| condition | seeds | what it sets |", "|---|---|---|"]
    for c in conds:
        seeds = ", ".join(str(seed_of(r)) for r in a.runs[c])
        lines.append(f"| {c}{' (baseline)' if c == a.baseline else ''} | {seeds} | {per[c]} |")
    if shared:
        lines += ["", f"Every run: {shared}."]
    lines += ["", "## In short", ""]
    lines += _findings(a) or ["One condition: nothing is compared."]
    lines += ["", "## Decisions", "", f"Procedure (docs/decisions.md): {rule_text(a.margin, a.loss_margin)}.", ""]
    for q in QUANTITIES:
        lines += [f"### {q.text}", "", "| condition | final | n |", "|---|---|---|"]
        lines += [f"| {c} | {_value(a.summary[q.key][c], q.decimals)} | {a.summary[q.key][c]['n']} |" for c in conds]
        if a.decisions[q.key]:
            lines += [""] + decision_table(a.decisions[q.key], q.decimals, name_of=_pair) + [""]
            lines += [f"- {_pair(p)}: {decided_text(d, q.decimals)}" for p, d in a.decisions[q.key].items()]
        lines.append("")
    lines += ["## Figures", "", "trajectories.png (each quantity over training), per_layer.png (per layer at the last "
              "probe), comparisons.png (every comparison's interval against the margin).", "", "## Provenance", ""]
    lines += [f"- {c}: {provenance_text(a.runs, c)}" for c in conds]
    return "\n".join(lines) + "\n"
