"""Figures and report of the spike-warning study, drawn from research.analysis.spikes.SpikeAnalysis alone. No torch.

1_signals_at_spikes.png   each signal (rows) against the loss around every spike, aligned at the onset, per
                          condition (columns): the median over spikes and the band between the quartiles
2_hit_vs_false_alarms.png per condition, each signal's held-out hit rate against its false alarms per 1,000 steps,
                          with their intervals over the evaluation seeds

The report opens with "In short" (in_short, placed by research.studies.render): per condition, the signals that warn
and that do not, with their rates and intervals. How a signal is judged is said once; each condition's table lists its
signals, and one line per verdict and reason names the signals that share them. Each figure follows what it shows.
"""
from __future__ import annotations

import math
import textwrap

import numpy as np

from research.analysis.spike_rule import CHECKS, HORIZON, LATE_LOSS_RISE, LOSS_RISE, REACTION, K, M, REL_FLOOR, WINDOW
from research.analysis.spikes import (ALIGN, FALSE_ALARM_BOUND, INCONCLUSIVE, MIN_EXCESS, MIN_SPIKES, NO_THRESHOLD,
                                      NO_WARNING, NOT_RECORDED, WARNS, SpikeAnalysis, ci_text, near_bound, p_text,
                                      spikes_to_rule_out)
from research.plots.common import color, figure_line, label, message_figure, styled, subplots
from research.plots.in_short import MOST
from utils.telemetry import STUDIED

FIGURES = ("1_signals_at_spikes.png", "2_hit_vs_false_alarms.png")
TITLE_CHARS_PER_INCH = 10  # characters of a suptitle line that fit an inch of figure at the default font


def _quartiles(a: np.ndarray):
    """(median, 25%, 75%) over spikes at each offset, NaN where no spike has a value."""
    out = np.full((3, a.shape[1]), np.nan)
    for j in range(a.shape[1]):
        col = a[:, j][np.isfinite(a[:, j])]
        if col.size:
            out[:, j] = np.percentile(col, [50, 25, 75])
    return out


def _title(fig, lines: list[str]) -> None:
    """The figure's title: each of `lines` wrapped to the figure's width."""
    per_line = int(TITLE_CHARS_PER_INCH * fig.get_figwidth())
    fig.suptitle("\n".join(textwrap.fill(t, per_line) for t in lines))


@styled
def fig_aligned(analysis: SpikeAnalysis):
    conds = [c for c in analysis.conditions if analysis.spikes_of(c)]
    if not conds:
        return message_figure("Signals around the spikes", "no run of this study had a loss spike")
    names = list(STUDIED)
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
    _title(fig, ["Signals (colour: median, quartile band) and loss (dashed: median) around each spike;",
                 f"shaded: the {HORIZON} steps before the onset, its warning window unless an earlier spike's reaction "
                 f"span (its onset to {REACTION} steps after its end) cuts it"])
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.2 / fig.get_figheight()))  # a fifth of an inch between title and panels
    return fig


@styled
def fig_hit_false(analysis: SpikeAnalysis):
    conds = analysis.conditions
    fig, axes = subplots(1, len(conds), figsize=(5.6 * len(conds), 6.4), squeeze=False)
    for ax, cond in zip(axes[0], conds):
        shown = [(analysis.results[(n, cond)], f"C{k}", "o") for k, n in enumerate(STUDIED)]
        shown += [(analysis.checks[(n, cond)], "black", m) for n, m in ((LATE_LOSS_RISE, "x"), (LOSS_RISE, "s"))
                  if (n, cond) in analysis.checks]
        for r, col, marker in shown:
            if r.hit_rate is None or not math.isfinite(r.hit_rate.mean) or not math.isfinite(r.false_alarms.mean):
                continue
            err = np.nan_to_num([[r.hit_rate.mean - r.hit_rate.lo], [r.hit_rate.hi - r.hit_rate.mean]])
            xerr = np.nan_to_num([[r.false_alarms.mean - r.false_alarms.lo], [r.false_alarms.hi - r.false_alarms.mean]])
            check = r.signal in CHECKS
            ax.errorbar(r.false_alarms.mean, r.hit_rate.mean, yerr=err, xerr=xerr, fmt=marker, capsize=3, color=col,
                        mfc="none" if check else col, label=f"{r.signal}{' (check)' if check else ''} ({r.verdict})")
            if r.chance is not None and math.isfinite(r.chance.mean):  # what the pairings hit: one bar to beat
                ax.plot(r.false_alarms.mean, r.chance.mean, marker="_", ms=14, mew=2.5, color=col, alpha=0.7)
            if r.shifts is not None and r.eval_spikes:  # what the shifted alarms hit: the other
                ax.plot(r.false_alarms.mean, r.shifts.expected / r.eval_spikes, marker="d", ms=6, mfc="none",
                        color=col, alpha=0.8, ls="none")
        ax.axvline(FALSE_ALARM_BOUND, color="grey", ls=":", lw=0.8)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("false alarms per 1,000 steps (held-out)")
        ax.set_ylabel(f"hit rate: spikes with an alarm in the {HORIZON} steps before")
        ax.set_title(label(cond))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    title = ["Held-out hit rate (dot, with its interval) and chance: dash, the same alarms set against the other "
             "runs' spikes at their rate; diamond, each run's alarms shifted in time against its own spikes.",
             f"Thresholds chosen on seeds {', '.join(map(str, analysis.calibration_seeds))}, evaluated on seeds "
             f"{', '.join(map(str, analysis.evaluation_seeds)) or '(none)'}; black: the two checks."]
    _title(fig, title)
    fig.tight_layout()
    return fig


def figures(analysis: SpikeAnalysis) -> dict:
    return dict(zip(FIGURES, (fig_aligned(analysis), fig_hit_false(analysis))))


def rule_text() -> str:
    return (f"A spike's onset is a step whose loss, and that of the {M - 1} step(s) after it, lies above the median "
            f"of the {WINDOW} steps before it plus {K:g} robust dispersions (1.4826 x their median absolute "
            f"deviation, at least {REL_FLOOR:g} of the median); none in the first {WINDOW} steps; one spike until "
            f"the loss is back under the line; a non-finite loss is a spike (divergence) at its step.")


def hit_text() -> str:
    return (f"An alarm is a crossing of a threshold. A spike's warning window is the {HORIZON} steps before its "
            f"onset, from the first armed step and after the previous spike's end + {REACTION} steps; an alarm hits a "
            f"spike when it falls in its window (lead: onset minus the first such alarm). An alarm from a spike's "
            f"onset to {REACTION} steps after its end is a reaction: neither a hit (of the next spike) nor false. A "
            f"spike with an empty window (it came too soon after the previous one, or at the first armed step) is "
            f"not counted among the spikes to warn of. An alarm is false when it lies in no window and no reaction "
            f"span.")


def null_text() -> str:
    return ("A warning must beat two nulls. Runs paired: each held-out run's alarms are set against the spikes of "
            "every held-out run at the same learning rate (every pairing within a rate, enumerated), which keeps "
            "when in training things happen (a rule that fires at the same steps in every run hits as much under "
            "every pairing). Shifted: each run's alarms are moved in time against its own spikes, circularly, by "
            f"every shift that leaves each alarm more than {HORIZON} steps from its place, which keeps what differs "
            "between runs (a run that is spikier and noisier has more alarms and more spikes under every shift). "
            "Chance is each null's mean hit rate; p the null's probability of at least as many hits as the runs' "
            "own alarms made.")


def _p_pair(r) -> str:
    return "n/a" if r.permutation is None else f"{p_text(r.permutation.p)}, {p_text(r.shifts.p)}"


def _row(r, name: str) -> str:
    t = "none" if r.threshold is None else f"{r.threshold:.4g}"
    shifted = f"{r.shifts.expected / r.eval_spikes:.2f}" if r.shifts is not None and r.eval_spikes else "n/a"
    quiet = "n/a" if not math.isfinite(r.quiet_false_alarms) else f"{r.quiet_false_alarms:.1f}"
    hits = f" ({r.permutation.observed} of {r.eval_spikes})" if r.permutation is not None else ""
    return (f"| {name} | {t} | {ci_text(r.hit_rate)}{hits} | {ci_text(r.chance)} | {shifted} | {_p_pair(r)} | "
            f"{ci_text(r.false_alarms, '.1f')} | {quiet} | {ci_text(r.lead, '.1f')} | {r.verdict} |")


def _answer(r) -> str:
    """A signal's name with the numbers its verdict rests on, as its report's table and line state them."""
    if r.verdict == WARNS:
        return f"{r.signal} (hit rate {ci_text(r.hit_rate)} against {ci_text(r.chance)} by chance)"
    if r.verdict == NO_WARNING:
        return (f"{r.signal} (hit rate above chance {ci_text(r.excess, near=True)}, exact bound "
                f"{near_bound(r.excess_bound)})")
    return r.signal


def _condition_line(analysis: SpikeAnalysis, c: str) -> str:
    """One condition's answer: the signals that warn and that do not, with their rates and intervals, then those not
    decided, and the family they were decided in."""
    results = [analysis.results[(name, c)] for name in STUDIED]
    parts = [f"**{verdict}**: " + ", ".join(_answer(r) for r in results if r.verdict == verdict)
             for verdict in (WARNS, NO_WARNING, NO_THRESHOLD) if any(r.verdict == verdict for r in results)]
    absent = [r.signal for r in results if r.verdict == INCONCLUSIVE and r.text.endswith(f"({NOT_RECORDED}).")]
    open_ = [r.signal for r in results if r.verdict == INCONCLUSIVE and r.signal not in absent]
    n = len(analysis.calibration_seeds) + len(analysis.evaluation_seeds)
    if open_ or absent:
        parts.append(f"**{INCONCLUSIVE}**: " + "; ".join(
            x for x in ((f"{', '.join(open_)} (not decided at these {n} seeds)" if open_ else ""),
                        (f"{', '.join(absent)} ({NOT_RECORDED})" if absent else "")) if x))
    tested = analysis.family[c]
    family = (f"{tested} signal(s) tested, one family at one-sided p \u2264 {p_text((1 - analysis.level[c]) / 2)} each"
              if tested else "no signal tested")
    checks = ", ".join(f"{name} {analysis.checks[(name, c)].verdict}" for name in CHECKS
                       if (name, c) in analysis.checks)
    held = sum(int(r.warnable.sum()) for r in analysis.runs if r.condition == c and r.seed in analysis.evaluation_seeds)
    return (f"- {label(c)} ({c}), {held} held-out spike(s): " + "; ".join(parts)
            + f" ({family}" + (f"; checks: {checks}" if checks else "") + ").")


def in_short(analysis: SpikeAnalysis) -> list[str]:
    """The report's "In short" (research.plots.in_short, placed first by research.studies.render): per condition, which
    signals warn and which do not, with their rates and intervals, those not decided and why, and the family; past
    in_short.MOST conditions, the last line counts the rest, which Verdict gives."""
    lines = [_condition_line(analysis, c) for c in analysis.conditions]
    if len(lines) > MOST:
        lines = lines[:MOST - 1] + [f"- {len(lines) - MOST + 1} more conditions: under Verdict."]
    return lines or ["- No runs: nothing to judge."]


def judged_text() -> str:
    """How a signal is decided, said once for every condition."""
    return (f"Within a condition the signals tested are one family (Bonferroni over the k tested); a signal is tested "
            f"when it has a threshold and held-out spikes on 2 seeds or more. A signal warns when its held-out hits "
            f"beat both nulls at one-sided p \u2264 0.025 / k. It does not warn, at its chosen threshold, when its hit "
            f"rate above chance (runs paired) is shown below {MIN_EXCESS:g} both by the t bound over the evaluation "
            f"seeds and by the exact (Clopper-Pearson) bound on the pooled held-out hits, each at that level. Any "
            f"verdict needs {MIN_SPIKES} held-out spikes (with a warning window) on 2 seeds or more.")


def checks_text() -> str:
    """The two checks, said once for every condition."""
    return (f"Checks, outside the family and tested the same way: {LOSS_RISE} is the loss's own rise over the median "
            f"of its {WINDOW} steps before; {LATE_LOSS_RISE}, the negative control, is {LOSS_RISE} as it was "
            f"{REACTION} steps before: its rise at an onset lands in that spike's reaction span, and it knows nothing "
            f"of the loss inside a warning window, so it warns only if the loss rises {REACTION + 1} to "
            f"{REACTION + HORIZON} steps before spikes, or if the design takes a reaction, a run's alarm rate or a "
            f"time in training for a warning.")


def _family_text(analysis: SpikeAnalysis, c: str) -> str:
    """The condition's family: how many signals were tested, their level, and the spikes "does not warn" takes."""
    tested = analysis.family[c]
    if not tested:
        return f"In {c}, no signal could be tested."
    alpha = (1 - analysis.level[c]) / 2
    return (f"In {c}, {tested} signal(s) tested, one family: each warns at one-sided p \u2264 {p_text(alpha)} (0.025 / "
            f"{tested}), intervals at level {analysis.level[c]:.4g}; with no hit and no chance, \"does not warn\" "
            f"takes {spikes_to_rule_out(tested)} held-out spikes.")


def _bullets(results: list) -> list[str]:
    """One line per verdict and its reason, the signals that share them named together ('key_norm, entropy in QK:
    inconclusive (not recorded in its runs).')."""
    grouped: dict = {}
    for r in results:
        named, _, rest = r.text.partition(f" in {r.condition}: ")
        grouped.setdefault((r.condition, rest), []).append(named)
    return [f"- {', '.join(names)} in {cond}: {rest}" for (cond, rest), names in grouped.items()]


def report(analysis: SpikeAnalysis) -> str:
    lines = ["# Do the keys warn before the loss spikes?", "",
             rule_text(), "", "## How a signal is judged", "",
             hit_text() + " Thresholds were chosen on the calibration seeds "
             f"({', '.join(map(str, analysis.calibration_seeds))}: the highest hit rate with at most "
             f"{FALSE_ALARM_BOUND:g} false alarms per 1,000 steps) and evaluated only on the other seeds "
             f"({', '.join(map(str, analysis.evaluation_seeds)) or 'none'}).", "", null_text() +
             " Intervals are t intervals over the evaluation seeds (docs/spikes.md, docs/decisions.md).", "",
             judged_text(), "", checks_text(), "",
             "## Verdict", ""]
    lines += [f"- {analysis.summary[c]}" for c in analysis.conditions]
    lines += ["", "Each signal's held-out hit rate against its false alarms, per condition, with the chance each null "
                  "gives:", "",
              figure_line(FIGURES[1], "held-out hit rate against false alarms per 1,000 steps, per condition"),
              "", "## Spikes", "", "| condition | runs | spikes | diverged | calibration spikes | held-out spikes | "
              "held-out, with a warning window |", "|---|---|---|---|---|---|---|"]
    for c in analysis.conditions:
        runs = [r for r in analysis.runs if r.condition == c]
        held = [r for r in runs if r.seed in analysis.evaluation_seeds]
        lines.append(f"| {label(c)} | {len(runs)} | {sum(len(r.spikes) for r in runs)} | "
                     f"{sum(1 for r in runs for s in r.spikes if s.diverged)} | "
                     f"{analysis.spikes_of(c, analysis.calibration_seeds)} | "
                     f"{analysis.spikes_of(c, analysis.evaluation_seeds)} | "
                     f"{sum(int(r.warnable.sum()) for r in held)} |")
    lines += ["", figure_line(FIGURES[0], "each signal and the loss around every spike, aligned at its onset")]
    for c in analysis.conditions:
        lines += ["", f"## {label(c)}", "", _family_text(analysis, c), "",
                  f"| signal ({c}) | threshold | hit rate (hits of spikes) | chance, runs paired | chance, shifted | "
                  "p: paired, shifted | false alarms / 1,000 steps | in runs without a spike | lead (steps) "
                  "| verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [_row(analysis.results[(name, c)], name) for name in STUDIED]
        lines += [_row(analysis.checks[(n, c)], f"{n} (check)") for n in CHECKS if (n, c) in analysis.checks]
        lines += ["", *_bullets([analysis.results[(name, c)] for name in STUDIED])]
        checks = [analysis.checks[(name, c)] for name in CHECKS if (name, c) in analysis.checks]
        if checks:
            lines += ["", "Checks:", "", *_bullets(checks)]
    return "\n".join(lines) + "\n"
