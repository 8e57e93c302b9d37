"""Figures and report.md of research/checkpoint_keys_study.py, from checkpoint_keys.json alone (no torch).

    figures(analysis), report(analysis)   # of research.analysis.trajectory.analyze(checkpoint_keys.json)

Each panel is one metric against the training step, one line per layer group with its 95% interval over
text batches. A checkpoint whose weights equal an earlier one's is no point of the line: a dotted vertical
line at its step names it and the checkpoint it repeats.
"""
from __future__ import annotations

import math

import numpy as np

from research.analysis import trajectory as A
from research.analysis.wording import plural, ratio_text, rule_text
from research.plots.common import (GROUP_COLORS, decision_table, drawable, figure_line, fmt_code, fmt_num, styled,
                                   subplots)
from research.plots.in_short import MOST, decided_part

FIGURES = ("key_trajectories.png", "attention_trajectories.png")
DUP_COLOR = "#888888"


def _line(ax, steps, mean, half, color: str, label: str) -> None:
    ax.plot(steps, mean, "o-", ms=4, lw=1.6, color=color, label=label)
    if np.isfinite(half).any():
        ax.fill_between(steps, mean - half, mean + half, color=color, alpha=0.2, lw=0)


def mark_duplicates(ax, analysis) -> None:
    """A dotted line at the step of each duplicate of `analysis` (one model's or across seeds), naming both."""
    for i, d in enumerate(analysis.duplicates):
        ax.axvline(d["step"], color=DUP_COLOR, ls=":", lw=1.2,
                   label="identical weights (not a step of training)" if i == 0 else None)
        ax.annotate(drawable(f"{d['label']} = {d['duplicate_of']}", 48), (d["step"], 1),
                    xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", fontsize=6.5,
                    color=DUP_COLOR)


def _panel(ax, analysis: A.Trajectory, key: str, title: str) -> None:
    for g, (mean, half) in analysis.series[key].items():
        _line(ax, analysis.steps, mean, half, GROUP_COLORS.get(g, "k"), g)
    mark_duplicates(ax, analysis)
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.legend(fontsize=7)


def _grid(analysis: A.Trajectory, panels: list[tuple[str, str]], ncols: int = 3):
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = subplots(nrows, ncols, figsize=(5.2 * ncols, 3.7 * nrows), squeeze=False)
    flat = axes.ravel()
    for ax, (key, title) in zip(flat, panels):
        _panel(ax, analysis, key, title)
    for ax in flat[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    return fig


@styled
def plot_keys(analysis: A.Trajectory):
    return _grid(analysis, [(m.key, m.title) for m in analysis.metrics if m.kind in ("keys", "gain")])


@styled
def plot_attention(analysis: A.Trajectory):
    return _grid(analysis, [(m.key, m.title) for m in analysis.metrics if m.kind == "attn"]
                 + [(A.LOSS, "loss on the text (nats/token)")], ncols=3)


def figures(analysis: A.Trajectory) -> dict:
    return dict(zip(FIGURES, (plot_keys(analysis), plot_attention(analysis))))


# ---------------------------------------------------------------------------------------------- report

def _cell(mean: float, half: float) -> str:
    if not np.isfinite(half):
        return fmt_num(mean, 3)
    return f"{mean:.3f} \u00b1 {half:.3f}"


def run_lines(res: dict, checked: str = "") -> list[str]:
    """The command, provenance, model and text of checkpoint_keys.json; `checked`: said after the model's shape."""
    prov, text, model = res.get("provenance") or {}, res["text"], res["model"]
    return [f"Command: `{res.get('command', '?')}`; {fmt_code(prov)}, {prov.get('cpu', '?')}, torch "
            f"{prov.get('torch', '?')}, transformers {prov.get('transformers', '?')}, float32; "
            f"{fmt_num(res.get('wall_s'), 0)} s.", "",
            f"Model: {model.get('family', '?')} ({model.get('model_type', '?')}), {model['n_layers']} layers, "
            f"{model['n_heads']} query / {model['n_kv_heads']} KV heads of size {model['head_dim']}{checked}. Text: "
            f"{text['batches']} batches of {text['batch']} windows of {text['seq_len']} tokens of {text['source']} "
            f"(sha256 {str(text['sha256'])[:12]}, seed {text['seed']}), the same windows for every checkpoint.", ""]


def _header(analysis: A.Trajectory) -> list[str]:
    return ["# Keys over training checkpoints", "",
            "One model, several of its saved checkpoints, the same text windows through each. Intervals are over "
            "TEXT BATCHES: they say how precisely each checkpoint's keys are measured on this kind of text, not how "
            "another training run would move. The change from the first to the last measured checkpoint is decided "
            "as in docs/decisions.md, paired by batch; it says nothing about the path between them, which the "
            "figures show.", "", *run_lines(analysis.file)]


def _checkpoints(analysis: A.Trajectory) -> list[str]:
    lines = ["## Checkpoints", "",
             "| label | step | step read from | weights sha256 | loss (nats/token) | source |",
             "|---|---|---|---|---|---|"]
    loss = dict(zip(analysis.labels, analysis.series[A.LOSS]["model"][0]))
    for c in analysis.file["checkpoints"]:
        what = (f"identical to {c['duplicate_of']}: not measured, not a step" if c.get("duplicate_of") is not None
                else fmt_num(loss.get(c["label"]), 3))
        lines.append(f"| {c['label']} | {c['step']} | {c.get('step_from') or '?'} | {c['sha256'][:12]} | {what} | "
                     f"{c['source']} |")
    lines.append("")
    for d in analysis.duplicates:
        lines.append(f"- **{d['label']}** (step {d['step']}, {d['source']}) has the same weights as "
                     f"**{d['duplicate_of']}** (step {d['duplicate_step']}): the same model saved twice, so it is "
                     f"named here and drawn as a dotted line, never as progress of training.")
    if analysis.duplicates:
        lines.append("")
    return lines


KEYS_FIGURE = "each key metric against the training step, one line per layer group with its 95% interval"
ATTENTION_FIGURE = "attention entropy, first-token attention and the loss against the training step"


def metric_figures(metrics: list, m, keys: str = KEYS_FIGURE, attention: str = ATTENTION_FIGURE) -> list[str]:
    """The figure that follows metric m's table in "Metrics by step" (FIGURES: the keys' after the last key metric's,
    the attention's after the loss's), or []."""
    last_key = [x.key for x in metrics if x.kind in ("keys", "gain")][-1:]
    if m.key in last_key:
        return [figure_line(FIGURES[0], keys), ""]
    return [figure_line(FIGURES[1], attention), ""] if m.key == A.LOSS else []


def _metrics(analysis: A.Trajectory) -> list[str]:
    where = "after k_norm, before RoPE" if analysis.site == "k_norm" else "the model has no k_norm: the key projection"
    lines = ["## Metrics by step", "",
             f"Keys at {analysis.site} (where the write-ups measure them: {where}) and after RoPE; groups "
             + ", ".join(f"{g} = layers {ix}" for g, ix in analysis.groups.items())
             + ". Each cell: mean over text batches \u00b1 the half width of its 95% interval; the gain CV is exact.",
             ""]
    for m in [*analysis.metrics, A.Metric(A.LOSS, "loss (nats/token)", "loss", "loss")]:
        series = analysis.series[m.key]
        lines += [f"**{m.title}**", "", "| checkpoint | step | " + " | ".join(series) + " |",
                  "|---|---|" + "---|" * len(series)]
        for i, (lab, step) in enumerate(zip(analysis.labels, analysis.steps)):
            lines.append(f"| {lab} | {step} | " + " | ".join(_cell(mean[i], half[i]) for mean, half in series.values())
                         + " |")
        lines += ["", *metric_figures(analysis.metrics, m)]
    return lines


def _changes(analysis: A.Trajectory) -> list[str]:
    lines = ["## First to last checkpoint", ""]
    if not analysis.changes:
        return lines + [f"Only one checkpoint was measured ({analysis.labels[0]}): there is no change to decide."]
    first, last = (analysis.labels[0], analysis.steps[0]), (analysis.labels[-1], analysis.steps[-1])
    lines += [f"From {first[0]} (step {first[1]}) to {last[0]} (step {last[1]}), n = {analysis.n_batches} "
              f"text batches; the key and attention metrics are one family (Bonferroni over its "
              f"{sum(c.metric != A.LOSS for c in analysis.changes)} comparisons), the loss its own:", ""]
    lines += [f"- {c.verdict}" for c in analysis.changes]
    for g, (before, after) in A.gain_change(analysis).items():
        lines.append(f"- k_norm gain CV, {g} layers: {before:.3f} -> {after:.3f} (weights, exact: described, not "
                     f"tested).")
    titles = {m.key: m.title for m in analysis.metrics}
    lines += ["", "Metrics (last against first, per batch: log ratios for pr_sv, norms and entropy, else "
                  "differences):", ""]
    lines += decision_table({(c.metric, c.group): c.decision for c in analysis.changes if c.metric != A.LOSS}, 3,
                            name_of=lambda k: f"{titles[k[0]]}, {k[1]}", unit="batch", what="metric, layer group")
    lines += ["", "Loss:", ""] + decision_table({"loss": c.decision for c in analysis.changes if c.metric == A.LOSS},
                                                4, unit="batch", what="loss, whole model")
    return lines + ["", "How it is decided: " + rule_text(analysis.margin, analysis.loss_margin, unit="batch") + ". "
                    + ratio_text("key PR, key norms, attention entropy where positive", "batch") + "."]


def short_lines(changes: list, titles: dict, first: str, last: str, n: int, unit: str) -> list[str]:
    """"In short" of first-to-last changes (one model's over text batches, or across seeds): the family in one line,
    then one line per metric, each layer group's values, outcome, effect and interval (in_short.decided_part), then the
    loss; past in_short.MOST lines, the last counts the metrics left to the tables."""
    key = [c for c in changes if c.metric != A.LOSS]
    tested = [c.decision for c in key if c.decision.tested]
    level = f", {tested[0].ci_level:.1%} each" if tested else ""
    over = f"{n} text {plural(unit) if n != 1 else unit}" if unit == "batch" else f"{n} {plural(unit)}"
    lines = [f"- From {first} to {last}, over {over}: the key and attention metrics are one family of "
             f"{len(tested)}{level}, the loss its own."]
    by_metric: dict = {}
    for c in key:
        by_metric.setdefault(c.metric, []).append(c)
    for metric, cs in by_metric.items():
        parts = "; ".join(decided_part(f"{c.group} {c.decision.mean_b:.3g} \u2192 {c.decision.mean_a:.3g}",
                                       c.decision, unit) for c in cs)
        lines.append(f"- {titles[metric]}: {parts} (key and attention family).")
    for c in changes:
        if c.metric == A.LOSS:
            d = c.decision
            level = f", {d.ci_level:.1%}" if d.tested else ""
            values = f"{d.mean_b:.3g} \u2192 {d.mean_a:.3g}"
            lines.append(f"- loss (nats/token): {decided_part(values, d, unit)} (its own family{level}).")
    if len(lines) > MOST:
        lines = lines[:MOST - 1] + [f"- {len(lines) - MOST + 1} more: in the tables of the changes."]
    return lines


def in_short(analysis: A.Trajectory) -> list[str]:
    """The report's "In short" (research.plots.in_short, placed first by research.studies.render): the first-to-last
    changes per metric over text batches (short_lines), and the gain CV described; with one checkpoint, what it
    measured."""
    titles = {m.key: m.title for m in analysis.metrics}
    if not analysis.changes:
        pr = analysis.series[analysis.metrics[0].key]
        return [f"- Only one checkpoint was measured ({analysis.labels[0]}, step {analysis.steps[0]}): nothing to "
                f"decide; loss {fmt_num(analysis.series[A.LOSS]['model'][0][0], 3)} nats/token, "
                f"{analysis.metrics[0].title} " + ", ".join(f"{g} {fmt_num(m[0], 3)}" for g, (m, _) in pr.items())
                + "."]
    first = f"{analysis.labels[0]} (step {analysis.steps[0]})"
    last = f"{analysis.labels[-1]} (step {analysis.steps[-1]})"
    lines = short_lines(analysis.changes, titles, first, last, analysis.n_batches, "batch")
    gain = A.gain_change(analysis)
    if gain and len(lines) < MOST:
        lines.append("- k_norm gain CV (weights, exact: described, not tested): "
                     + "; ".join(f"{g} {a:.3f} \u2192 {b:.3f}" for g, (a, b) in gain.items()) + ".")
    return lines


def report(analysis: A.Trajectory) -> str:
    """report.md: the provenance, the checkpoints, every metric by step, then the decided first -> last changes."""
    return "\n".join(_header(analysis) + _checkpoints(analysis) + _metrics(analysis) + _changes(analysis) + [""])
