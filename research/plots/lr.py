"""Figures and report.md of the learning-rate study, from research.analysis.lr (it decides; this draws).

    lr_final_loss.png   final validation loss against the learning-rate multiplier, per condition
                        (seed mean and 95% CI; diverged runs marked at the initial loss)
    lr_max_logit.png    the largest attention logit over training, each condition at its highest stable rate
    lr_sensitivity.png  Wortsman et al.'s learning-rate sensitivity per condition, with its CI
    lr_keys.png         final max logit, key PR and key norm against the multiplier
"""
from __future__ import annotations

import math

import numpy as np

from research.analysis.lr import REFERENCE, LRAnalysis
from research.analysis.wording import effect_text, rule_text
from research.analysis.series import nanmean, on_shared_tokens
from research.analysis.stats import mean_ci95
from research.plots.common import color, decision_table, figure_line, fmt_num, label, styled, subplots, tokens_axis
from research.plots.in_short import family_text, short_line


FIGURES = ("lr_final_loss.png", "lr_max_logit.png", "lr_sensitivity.png", "lr_keys.png")


def _ys(ax) -> np.ndarray:
    return np.concatenate([np.asarray(line.get_ydata(), float).ravel() for line in ax.get_lines()] or [np.zeros(0)])


def _xaxis(ax, multipliers: list[float]) -> None:
    ax.set_xscale("log", base=2)
    if multipliers and not np.isfinite(_ys(ax)).any():  # nothing drawn (no run recorded the value): no data limits
        ax.set_xlim(min(multipliers) / 1.5, max(multipliers) * 1.5)
    ax.set_xticks(multipliers, [f"{m:g}x" for m in multipliers])
    ax.set_xlabel("learning rate (multiple of the preset's Muon and AdamW rates)")


def _log_y(ax) -> None:
    """A log y axis, where the plotted lines hold a positive value to show on one (files without logit_max, or
    with no positive one, keep a linear axis, which cannot fail)."""
    ys = _ys(ax)
    if (np.isfinite(ys) & (ys > 0)).any():
        ax.set_yscale("log")


def _band(ax, analysis: LRAnalysis, cond: str, value) -> None:
    """Seed mean and 95% CI of `value(run)` per multiplier, NaN-aware."""
    ms = list(analysis.grid[cond])
    stats = [mean_ci95([value(r) for r in analysis.grid[cond][m]]) for m in ms]
    mean = np.array([s[0] for s in stats])
    half = np.nan_to_num(np.array([s[1] for s in stats]))
    ax.plot(ms, mean, "o-", color=color(cond), label=label(cond), lw=1.8, ms=4)
    ax.fill_between(ms, mean - half, mean + half, color=color(cond), alpha=0.15, lw=0)


@styled
def fig_final_loss(analysis: LRAnalysis):
    fig, ax = subplots(figsize=(7.5, 4.8))
    init = [r.init_loss for by_m in analysis.grid.values() for runs in by_m.values() for r in runs]
    l0 = float(np.nanmean(init)) if init else math.nan
    for cond in analysis.grid:
        _band(ax, analysis, cond, lambda r: r.final_loss)
        div = [(m, sum(r.diverged_step is not None for r in runs)) for m, runs in analysis.grid[cond].items()]
        xs = [m for m, n in div if n]
        if xs:
            ax.scatter(xs, [l0] * len(xs), marker="x", s=60, color=color(cond), zorder=5)
    if math.isfinite(l0):
        ax.axhline(l0, color="grey", ls="--", lw=1, label=f"initial loss {l0:.2f} (x: a seed diverged)")
    _xaxis(ax, analysis.multipliers)
    ax.set_ylabel("final validation loss (nats)")
    ax.set_title("Final loss against the learning rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


@styled
def fig_max_logit(analysis: LRAnalysis):
    fig, ax = subplots(figsize=(7.5, 4.5))
    for cond, m in analysis.highest_stable.items():
        if m is None:
            continue
        runs = analysis.grid[cond][m]
        tokens, y = on_shared_tokens((r.tokens, r.logit_series) for r in runs)  # seeds met by token count
        ax.plot(tokens_axis(ax, tokens), nanmean(y, axis=0), color=color(cond), lw=1.8,
                label=f"{label(cond)} at {m:g}x")
    _log_y(ax)
    ax.set_ylabel("largest attention logit (any layer, head)")
    ax.set_title("Attention logits over training, each condition at its highest stable rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


@styled
def fig_sensitivity(analysis: LRAnalysis):
    fig, ax = subplots(figsize=(6.5, 4.2))
    conds = list(analysis.sensitivity_ci)
    mean = [analysis.sensitivity_ci[c][0] for c in conds]
    half = np.nan_to_num([analysis.sensitivity_ci[c][1] for c in conds])
    ax.bar(range(len(conds)), mean, yerr=half, capsize=4, color=[color(c) for c in conds])
    ax.set_xticks(range(len(conds)), [label(c) for c in conds], rotation=15, fontsize=8)
    ax.set_ylabel("LR sensitivity (nats; 95% CI over seeds)")
    ax.set_title("Learning-rate sensitivity (Wortsman et al. 2023)")
    fig.tight_layout()
    return fig


@styled
def fig_keys(analysis: LRAnalysis):
    fig, axes = subplots(1, 3, figsize=(14, 4.2))
    panels = (("max_logit", "final largest attention logit", True), ("pr", "final key PR (k_norm pr_sv)", False),
              ("key_norm", "final key norm (k_norm)", False))
    for ax, (attr, title, log) in zip(axes, panels):
        for cond in analysis.grid:
            _band(ax, analysis, cond, lambda r, attr=attr: getattr(r, attr))
        _xaxis(ax, analysis.multipliers)
        if log:
            _log_y(ax)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def figures(analysis: LRAnalysis) -> dict:
    return dict(zip(FIGURES, (fig_final_loss(analysis), fig_max_logit(analysis), fig_sensitivity(analysis),
                              fig_keys(analysis))))


def _grid_table(analysis: LRAnalysis) -> list[str]:
    rows = ["| condition | multiplier | final val loss (mean \u00b1 95% CI) | diverged | final max logit | key PR |",
            "|---|---|---|---|---|---|"]
    for cond, by_m in analysis.grid.items():
        for m, runs in by_m.items():
            mean, half = mean_ci95([r.final_loss for r in runs])
            div = sum(r.diverged_step is not None for r in runs)
            loss = fmt_num(mean) + ("" if not math.isfinite(half) else f" \u00b1 {half:.3f}")
            rows.append(f"| {label(cond)} | {m:g}x | {loss} | {div}/{len(runs)} | "
                        f"{fmt_num(float(np.nanmean([r.max_logit for r in runs])), 1)} | "
                        f"{fmt_num(float(np.nanmean([r.pr for r in runs])), 1)} |")
    return rows


def _onset_text(analysis: LRAnalysis, decisions: dict) -> str:
    """Where a difference first lies beyond the margin, from the decided multipliers only; the others are named with
    their intervals, and an undecided one below the first decided hit means the onset may lie lower."""
    if not decisions:
        return "nothing to compare"
    first, open_ = analysis.first(decisions, +1), analysis.undecided(decisions)
    opened = ", ".join(f"{m:g}x ({effect_text(decisions[m])})" for m in open_)
    if len(open_) == len(decisions):
        return f"not decided at any multiplier ({opened})"
    if first is None:
        text = "at no multiplier whose comparison is decided"
    else:
        text = f"beyond the margin first at {first:g}x" + (
            " of the decided multipliers (an undecided lower one may be the onset)" if any(m < first for m in open_)
            else "")
    return text + (f" (not decided at {opened})" if open_ else "")


def _onsets(analysis: LRAnalysis) -> list[str]:
    """One row per condition: its highest stable rate, where its final max logit rises above its own at 1x, and
    where its final loss becomes worse than the reference condition's."""
    lines = [f"| condition (onsets) | highest rate with no diverged seed | final max logit above its own at 1x | "
             f"final loss worse than {label(REFERENCE)}'s |", "|---|---|---|---|"]
    for cond in analysis.grid:
        stable = analysis.highest_stable[cond]
        loss = ("(the reference)" if cond == REFERENCE else
                _onset_text(analysis, analysis.loss_onset.get(cond, {})))
        lines.append(f"| {label(cond)} | {f'{stable:g}x' if stable else 'none'} | "
                     f"{_onset_text(analysis, analysis.logit_onset.get(cond, {}))} | {loss} |")
    return lines


def report(analysis: LRAnalysis) -> str:
    sens = [f"| {label(c)} | {fmt_num(m)} | {fmt_num(h)} | {len(analysis.sensitivity[c])} |"
            for c, (m, h) in analysis.sensitivity_ci.items()]
    lines = ["# Learning-rate sensitivity", "",
             "Each condition trained at every multiple of the preset's Muon and AdamW learning rates (both scaled "
             "together). A run whose loss became non-finite is recorded as diverged at its step and counts at "
             "the initial loss. Sensitivity (Wortsman et al. 2023): mean over the grid of min(final loss, initial "
             "loss) minus the best final loss of the grid, per seed.", "", "## Grid", ""] + _grid_table(analysis)
    lines += ["", figure_line("lr_final_loss.png", "Final validation loss against the learning rate"), "",
              figure_line("lr_keys.png", "Final max logit, key PR and key norm against the learning rate")]
    lines += ["", "## Sensitivity", "", "| condition | mean (nats) | 95% CI half width | seeds |", "|---|---|---|---|",
              *sens, "", figure_line("lr_sensitivity.png", "Learning-rate sensitivity per condition"), "",
              f"Procedure: {rule_text(analysis.margin, analysis.loss_margin)}. Here the margin is a share "
              f"of the mean "
              f"best loss ({analysis.loss_margin:.1%}), and % is of the best loss.", ""]
    lines += decision_table(analysis.decisions, 3, lambda k: f"{label(k[0])} \u2212 {label(k[1])}")
    lines += ["", "## Where loss and logits start to move", "",
              "Per multiplier, a condition's final loss against QK-norm's (paired by seed, Bonferroni over the "
              "multipliers), and its final max logit against its own at 1x (same procedure):", ""] + _onsets(analysis)
    lines += ["", figure_line("lr_max_logit.png", "Largest attention logit over training at each highest stable rate")]
    return "\n".join(lines) + "\n"


def in_short(analysis: LRAnalysis) -> list[str]:
    """The study's question (does a condition's final loss depend less on the learning rate than another's?): each
    pair's sensitivity with its outcome, effect (a share of the best loss) and interval; then each condition's
    sensitivity in nats and its highest stable rate."""
    family = family_text("sensitivity family", analysis.decisions.values())
    lines = [short_line(f"LR sensitivity, {label(x)} \u2212 {label(y)} (share of the best loss)", d, family)
             for (x, y), d in analysis.decisions.items()]
    if analysis.sensitivity_ci:
        lines.append("- LR sensitivity in nats (mean \u00b1 95% CI over seeds): " + "; ".join(
            f"{label(c)} {fmt_num(m)}" + (f" \u00b1 {h:.3f}" if math.isfinite(h) else "")
            for c, (m, h) in analysis.sensitivity_ci.items()))
    if analysis.highest_stable:
        lines.append("- Highest rate with no diverged seed: " + "; ".join(
            f"{label(c)} {f'{m:g}x' if m else 'none'}" for c, m in analysis.highest_stable.items()))
    return lines
