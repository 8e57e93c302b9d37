"""Figures and report of the spike-warning study, drawn from research.analysis.spikes.SpikeAnalysis alone. No torch.

1_signals_at_spikes.png   each signal (rows) against the loss around every spike, aligned at the onset, per
                          condition (columns): the median over spikes and the band between the quartiles
2_hit_vs_false_alarms.png per condition, each signal's held-out hit rate against its false alarms per 1,000 steps,
                          with their intervals over the evaluation seeds
"""
from __future__ import annotations

import math

import numpy as np

from research.analysis.spike_rule import CHECKS, HORIZON, K, LOSS_RISE, M, REL_FLOOR, STEP_RULE, WINDOW
from research.analysis.spikes import (ALIGN, FALSE_ALARM_BOUND, MIN_EXCESS, MIN_SPIKES, SpikeAnalysis, ci_text, p_text,
                                      spikes_to_rule_out)
from research.plots.common import color, label, message_figure, styled, subplots
from utils.telemetry import SIGNALS

FIGURES = ("1_signals_at_spikes.png", "2_hit_vs_false_alarms.png")


def _quartiles(a: np.ndarray):
    """(median, 25%, 75%) over spikes at each offset, NaN where no spike has a value."""
    out = np.full((3, a.shape[1]), np.nan)
    for j in range(a.shape[1]):
        col = a[:, j][np.isfinite(a[:, j])]
        if col.size:
            out[:, j] = np.percentile(col, [50, 25, 75])
    return out


@styled
def fig_aligned(analysis: SpikeAnalysis):
    conds = [c for c in analysis.conditions if analysis.spikes_of(c)]
    if not conds:
        return message_figure("Signals around the spikes", "no run of this study had a loss spike")
    names = list(SIGNALS)
    fig, axes = subplots(len(names), len(conds), figsize=(4.2 * len(conds), 2.1 * len(names)), squeeze=False)
    x = np.arange(ALIGN[0], ALIGN[1] + 1)
    for j, cond in enumerate(conds):
        loss = _quartiles(analysis.aligned[("loss", cond)])
        for i, name in enumerate(names):
            ax = axes[i][j]
            q = _quartiles(analysis.aligned[(name, cond)])
            ax.plot(x, q[0], color=color(cond), marker="." if name == "entropy" else None)
            ax.fill_between(x, q[1], q[2], color=color(cond), alpha=0.25)
            seen = q[1:][np.isfinite(q[1:])]
            if name != "entropy" and seen.size and seen.min() > 0 and seen.max() > 100 * seen.min():
                # NoQK's largest logits span decades; an entropy near 0 nats is a value, not a decade
                ax.set_yscale("log")
            twin = ax.twinx()
            twin.plot(x, loss[0], color="black", lw=0.8, ls="--")
            twin.set_ylabel("loss" if j == len(conds) - 1 else "")
            ax.axvline(0, color="red", lw=0.8)
            ax.axvspan(-HORIZON, 0, color="red", alpha=0.06)
            ax.set_ylabel(name)
            if i == 0:
                ax.set_title(f"{label(cond)} ({analysis.spikes_of(cond)} spikes)")
            if i == len(names) - 1:
                ax.set_xlabel("steps from the spike's onset")
    fig.suptitle("Signals (colour: median, quartile band) and loss (dashed: median) around each spike;\nshaded: the "
                 f"{HORIZON} steps an alarm must fall in")
    fig.tight_layout()
    return fig


@styled
def fig_hit_false(analysis: SpikeAnalysis):
    conds = analysis.conditions
    fig, axes = subplots(1, len(conds), figsize=(5.6 * len(conds), 6.4), squeeze=False)
    for ax, cond in zip(axes[0], conds):
        shown = [(analysis.results[(n, cond)], f"C{k}", "o") for k, n in enumerate(SIGNALS)]
        shown += [(analysis.checks[(n, cond)], "black", m) for n, m in ((STEP_RULE, "x"), (LOSS_RISE, "s"))
                  if (n, cond) in analysis.checks]
        for r, col, marker in shown:
            if r.hit_rate is None or not math.isfinite(r.hit_rate.mean) or not math.isfinite(r.false_alarms.mean):
                continue
            err = np.nan_to_num([[r.hit_rate.mean - r.hit_rate.lo], [r.hit_rate.hi - r.hit_rate.mean]])
            xerr = np.nan_to_num([[r.false_alarms.mean - r.false_alarms.lo], [r.false_alarms.hi - r.false_alarms.mean]])
            check = r.signal in CHECKS
            ax.errorbar(r.false_alarms.mean, r.hit_rate.mean, yerr=err, xerr=xerr, fmt=marker, capsize=3, color=col,
                        mfc="none" if check else col, label=f"{r.signal}{' (check)' if check else ''} ({r.verdict})")
            if r.chance is not None and math.isfinite(r.chance.mean):  # what the pairings hit: the bar to beat
                ax.plot(r.false_alarms.mean, r.chance.mean, marker="_", ms=14, mew=2.5, color=col, alpha=0.7)
        ax.axvline(FALSE_ALARM_BOUND, color="grey", ls=":", lw=0.8)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("false alarms per 1,000 steps (held-out)")
        ax.set_ylabel(f"hit rate: spikes with an alarm in the {HORIZON} steps before")
        ax.set_title(label(cond))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.suptitle(f"Held-out hit rate (dot, with its interval) and chance (dash: what the same alarms hit set "
                 f"against the other runs' spikes at their rate)\nThresholds chosen on seeds "
                 f"{', '.join(map(str, analysis.calibration_seeds))}, evaluated on seeds "
                 f"{', '.join(map(str, analysis.evaluation_seeds)) or '(none)'}; black: the two checks")
    fig.tight_layout()
    return fig


def figures(analysis: SpikeAnalysis) -> dict:
    return dict(zip(FIGURES, (fig_aligned(analysis), fig_hit_false(analysis))))


def rule_text() -> str:
    return (f"A spike's onset is a step whose loss, and that of the {M - 1} step(s) after it, lies above the median "
            f"of the {WINDOW} steps before it plus {K:g} robust dispersions (1.4826 x their median absolute "
            f"deviation, at least {REL_FLOOR:g} of the median); none in the first {WINDOW} steps; one spike until "
            f"the loss is back under the line; a non-finite loss is a spike (divergence) at its step.")


def _row(r, name: str) -> str:
    t = "none" if r.threshold is None else f"{r.threshold:.4g}"
    perm = r.permutation
    p = f"{p_text(perm.p)}" if perm else "n/a"
    quiet = "n/a" if not math.isfinite(r.quiet_false_alarms) else f"{r.quiet_false_alarms:.1f}"
    return (f"| {name} | {t} | {ci_text(r.hit_rate)} | {ci_text(r.chance)} | {p} | {ci_text(r.false_alarms, '.1f')} | "
            f"{quiet} | {ci_text(r.lead, '.1f')} | {r.verdict} |")


def report(analysis: SpikeAnalysis) -> str:
    lines = ["# Do the keys warn before the loss spikes?", "",
             rule_text() + f" An alarm is a crossing of a threshold; it hits a spike when it falls in the {HORIZON} "
             f"steps before the onset (lead: onset minus the first such alarm), and is false when no onset follows "
             f"within {HORIZON} steps. Thresholds were chosen on the calibration seeds "
             f"({', '.join(map(str, analysis.calibration_seeds))}: the highest hit rate with at most "
             f"{FALSE_ALARM_BOUND:g} false alarms per 1,000 steps) and evaluated only on the other seeds "
             f"({', '.join(map(str, analysis.evaluation_seeds)) or 'none'}). "
             "Chance keeps time: spikes cluster in training, and so do signals that follow the schedule. Each "
             "held-out run's alarms are set against the spikes of every held-out run at the same learning rate (every "
             "pairing of alarm sequences with spike sequences within a rate, enumerated); chance is the hit rate those "
             "pairings give on average, and p the share of them that hit at least as many spikes as the runs' own "
             "alarms did. A rule that fires at the same steps in every run hits as much under every pairing: p = 1. "
             "Intervals are t intervals over the evaluation seeds (docs/spikes.md, docs/decisions.md).", "",
             "## Verdict", ""]
    lines += [f"- {analysis.summary[c]}" for c in analysis.conditions]
    lines += ["", "## Spikes", "", "| condition | runs | spikes | diverged | calibration spikes | held-out spikes |",
              "|---|---|---|---|---|---|"]
    for c in analysis.conditions:
        runs = [r for r in analysis.runs if r.condition == c]
        lines.append(f"| {label(c)} | {len(runs)} | {sum(len(r.spikes) for r in runs)} | "
                     f"{sum(1 for r in runs for s in r.spikes if s.diverged)} | "
                     f"{analysis.spikes_of(c, analysis.calibration_seeds)} | "
                     f"{analysis.spikes_of(c, analysis.evaluation_seeds)} |")
    for c in analysis.conditions:
        level, tested = analysis.level[c], analysis.family[c]
        k, alpha = max(tested, 1), (1 - level) / 2
        family = (f"{tested} signal(s) tested: each is one of a family of {tested} (Bonferroni)." if tested else
                  "No signal could be tested (each needs a threshold and held-out spikes on 2 seeds or more).")
        lines += ["", f"## {label(c)}", "",
                  f"{family} A signal warns when its "
                  f"held-out hits beat the pairings at one-sided p \u2264 {p_text(alpha)} (0.025 / {k}). It does "
                  f"not warn, at its chosen threshold, when its hit rate above chance is shown below "
                  f"{MIN_EXCESS:g} both by the t bound over the evaluation seeds and by the exact (Clopper-Pearson) "
                  f"bound on the pooled held-out hits, each at that level: with no hit and no chance that takes "
                  f"{spikes_to_rule_out(k)} held-out spikes. Any verdict needs {MIN_SPIKES} held-out spikes on 2 "
                  f"seeds or more. Intervals at level {level:.4g}.", "",
                  "| signal | threshold | hit rate | chance | p | false alarms / 1,000 steps | in runs without a spike "
                  "| lead (steps) | verdict |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += [_row(analysis.results[(name, c)], name) for name in SIGNALS]
        lines += [_row(analysis.checks[(n, c)], f"{n} (check)") for n in CHECKS if (n, c) in analysis.checks]
        lines += ["", *(f"- {analysis.results[(name, c)].text}" for name in SIGNALS), "",
                  f"Checks, outside the family and tested the same way: {STEP_RULE} fires where the calibration runs' "
                  f"spikes were densest at the run's rate (it knows only the step, so no pairing can favour it); "
                  f"{LOSS_RISE} is the loss's own rise over the median of its {WINDOW} steps before.", "",
                  *(f"- {analysis.checks[(name, c)].text}" for name in CHECKS if (name, c) in analysis.checks)]
    return "\n".join(lines) + "\n"
