"""Figures and report.md of research/checkpoint_keys_study.py across seeds, from checkpoint_keys.json alone (no torch).

    figures(analysis), report(analysis)   # of research.analysis.trajectory_seeds.analyze(checkpoint_keys.json)

The same two figure files as one model's study: every metric against the training step, one panel per layer group,
one line per seed (its mean over the text batches); the attention figure adds each seed's share of sink heads and
the share of sink heads per layer. A checkpoint whose weights equal another analysed one's is a dotted vertical
line at its step, naming both.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib.ticker import MaxNLocator

from research.analysis import trajectory as A
from research.analysis import trajectory_seeds as S
from research.analysis.wording import ratio_text, reading_with, rule_text, settle_line
from research.plots.common import decision_table, drawable, fmt_num, fmt_tokens, styled, subplots
from research.plots.in_short import MOST
from research.plots.trajectory import FIGURES, mark_duplicates, metric_figures, run_lines, short_lines

SEED_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974",
               "#64b5cd")


def _seed_color(t: S.SeedTrajectory, seed: int) -> str:
    return SEED_COLORS[t.seeds.index(seed) % len(SEED_COLORS)]


def _by_seed(ax, t: S.SeedTrajectory, lines: dict, title: str, ylabel: str | None = None) -> None:
    """One line per seed over the steps it was measured at."""
    steps = np.array(t.steps)
    for seed, y in lines.items():
        ok = np.isfinite(y)
        ax.plot(steps[ok], y[ok], "o-", ms=3.5, lw=1.3, color=_seed_color(t, seed), label=f"seed {seed}")
    mark_duplicates(ax, t)
    ax.set_title(drawable(title, 60), fontsize=9)
    ax.set_xlabel("training step")
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.legend(fontsize=6.5)


def _grid(t: S.SeedTrajectory, panels: list[tuple], extra: int = 0):
    """panels: (title, {seed: [S]}) each; `extra` more axes returned for the caller to draw."""
    ncols = len(t.groups)
    nrows = math.ceil((len(panels) + extra) / ncols)
    fig, axes = subplots(nrows, ncols, figsize=(4.6 * ncols, 3.3 * nrows), squeeze=False)
    flat = list(axes.ravel())
    for ax, (title, lines) in zip(flat, panels):
        _by_seed(ax, t, lines, title)
    rest = flat[len(panels):]
    for ax in rest[extra:]:
        ax.axis("off")
    return fig, rest[:extra]


def _panels(t: S.SeedTrajectory, kinds: tuple) -> list[tuple]:
    return [(f"{m.title}, {g}", t.values[m.key][g]) for m in t.metrics if m.kind in kinds for g in t.groups]


@styled
def plot_keys(t: S.SeedTrajectory):
    fig, _ = _grid(t, _panels(t, ("keys", "gain")))
    fig.tight_layout()
    return fig


@styled
def plot_attention(t: S.SeedTrajectory):
    fig, (loss_ax, share_ax, layer_ax) = _grid(t, _panels(t, ("attn",)), extra=3)
    _by_seed(loss_ax, t, t.values[A.LOSS]["model"], "loss on the text (nats/token)")
    _by_seed(share_ax, t, {s: t.layer_share(s).mean(axis=1) for s in t.seeds},  # NaN: not measured
             f"share of the model's heads that are sinks (> {t.sink_threshold:g})")
    mean = np.nanmean(np.stack([t.layer_share(s) for s in t.seeds]), axis=0)          # [S, L]
    im = layer_ax.imshow(mean.T, aspect="auto", origin="lower", vmin=0, vmax=1, cmap="viridis")
    layer_ax.set_xticks(range(len(t.steps)), [str(s) for s in t.steps], fontsize=6.5, rotation=45)
    layer_ax.set_xlabel("revision (step)")
    layer_ax.set_ylabel("layer")
    layer_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    layer_ax.set_title("share of sink heads per layer, mean over seeds", fontsize=9)
    fig.colorbar(im, ax=layer_ax)
    fig.tight_layout()
    return fig


def figures(t: S.SeedTrajectory) -> dict:
    return dict(zip(FIGURES, (plot_keys(t), plot_attention(t))))


# ---------------------------------------------------------------------------------------------- report

def _at(t: S.SeedTrajectory, step: int) -> str:
    tokens = t.tokens.get(step)
    return f"step {step}" + (f" ({fmt_tokens(tokens)} tokens)" if tokens is not None else "")


def _header(t: S.SeedTrajectory) -> list[str]:
    return ["# Keys over training checkpoints, across seeds", "",
            f"{len(t.seeds)} seeds of one recipe, each at several saved revisions, the same text windows through "
            "every checkpoint. Within a seed a metric at a revision is its mean over the text batches; SEEDS are "
            "the unit: the change from the first to the last revision is one number per seed, decided across seeds "
            "as the training studies decide conditions (docs/decisions.md), so an interval says how another seed of "
            "this recipe would move. It says nothing of the path between the two ends, which the figures show.", "",
            *run_lines(t.file, ", one architecture and tokenizer for every seed (checked)")]


def _checkpoints(t: S.SeedTrajectory) -> list[str]:
    lines = ["## Checkpoints", "",
             "| label | seed | step | tokens | step read from | weights sha256 | loss (nats/token) | source |",
             "|---|---|---|---|---|---|---|---|"]
    for c in t.file["checkpoints"]:
        what = (f"identical to {c['duplicate_of']}: not measured, not a step" if c.get("duplicate_of") is not None
                else fmt_num(float(np.mean([b["loss"] for b in c["batches"]])), 3))
        tokens = fmt_tokens(c["tokens"]) if c.get("tokens") is not None else "not recorded"
        lines.append(f"| {c['label']} | {c['seed']} | {c['step']} | {tokens} | {c.get('step_from') or '?'} | "
                     f"{c['sha256'][:12]} | {what} | {c['source']} |")
    lines.append("")
    for d in t.duplicates:
        lines.append(f"- **{d['label']}** (seed {d['seed']}, step {d['step']}) has the same weights as "
                     f"**{d['duplicate_of']}** (step {d['duplicate_step']}): the same model saved twice, so it is "
                     f"named here, drawn as a dotted line, and not measured.")
    return lines + ["", "Duplicates are found among the checkpoints analysed only: a revision that serves the weights "
                        "of a step not analysed here matches nothing and is not detectable this way.", ""]


def _compared(t: S.SeedTrajectory) -> list[str]:
    lines = ["## What was compared", "",
             f"Revisions (steps) measured: {', '.join(_at(t, s) for s in t.steps)}. Paired first -> last: "
             f"{_at(t, t.first)} -> {_at(t, t.last)}, seeds {', '.join(map(str, t.paired)) or 'none'} "
             f"(n = {len(t.paired)}).", ""]
    lines += [f"- {line}" for line in S.missing_lines(t.file)]
    inner = {s: [x for x in lacks if x not in (t.first, t.last)] for s, lacks in t.missing.items()}
    lines += [f"- seed {s} has no measurement at {', '.join(f'step {x}' for x in lacks)}: its lines skip it"
              for s, lacks in inner.items() if lacks]
    return lines + [""]


KEYS_FIGURE = "each key metric against the training step, one panel per layer group, one line per seed"
ATTENTION_FIGURE = ("attention entropy, first-token attention and the loss by seed, and the share of sink heads, per "
                    "model and per layer")


def _metrics(t: S.SeedTrajectory) -> list[str]:
    lines = ["## Metrics by step", "",
             f"Keys at {t.site} and after RoPE; groups " + ", ".join(f"{g} = layers {ix}" for g, ix in t.groups.items())
             + ". Each cell: the mean over the seeds measured at that step of each seed's mean over text batches "
               "(n seeds), with the lowest and highest seed.", ""]
    for m in [*t.metrics, A.Metric(A.LOSS, "loss (nats/token)", "loss", "loss")]:
        by_group = t.values[m.key]
        lines += [f"**{m.title}**", "", "| step | " + " | ".join(by_group) + " |", "|---|" + "---|" * len(by_group)]
        for i, step in enumerate(t.steps):
            cells = []
            for seeds in by_group.values():
                x = np.array([v[i] for v in seeds.values() if np.isfinite(v[i])])
                cells.append(f"{x.mean():.3f} [{x.min():.3f}, {x.max():.3f}] (n {x.size})" if x.size else "n/a")
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
        lines += ["", *metric_figures(t.metrics, m, KEYS_FIGURE, ATTENTION_FIGURE)]
    return lines


def _onset_heads(t: S.SeedTrajectory, seed: int) -> str:
    o = t.onsets[seed]
    per_layer = []
    for layer in range(o.shape[0]):
        at = [f"step {t.steps[i]}: heads " + ", ".join(str(h) for h in np.flatnonzero(o[layer] == i))
              for i in sorted(set(o[layer][o[layer] >= 0].tolist()))]
        if at:
            per_layer.append(f"layer {layer}: " + "; ".join(at))
    return " | ".join(per_layer) or "no head is a sink at any revision"


def _sinks(t: S.SeedTrajectory) -> list[str]:
    lines = ["## Sink heads", "",
             f"A head is a sink at a revision when its first-token attention (queries 1..T-1, mean over the text) is "
             f"above {t.sink_threshold:g}; its onset is the first of its seed's revisions where it is one (after the "
             "previous revision analysed, at or before that one). Heads do not correspond between seeds: per head "
             "within a seed, per layer and per model across seeds. Described, not tested.", "",
             "| seed | first sink head (model onset) | sink heads per revision (of the model's) |", "|---|---|---|"]
    for s in t.seeds:
        onset = t.model_onset(s)
        counts = [f"{st}: {int(np.nansum(t.sink_mass[s][i] > t.sink_threshold))}"
                  for i, st in enumerate(t.steps) if not np.isnan(t.sink_mass[s][i]).all()]
        lines.append(f"| {s} | {_at(t, onset) if onset is not None else 'none'} | {', '.join(counts)} |")
    lines += ["", "Share of each layer's heads that are sinks, mean over the seeds measured [lowest, highest seed]:",
              "", "| layer | " + " | ".join(str(s) for s in t.steps) + " |", "|---|" + "---|" * len(t.steps)]
    shares = np.stack([t.layer_share(s) for s in t.seeds])                              # [seeds, S, L]
    for layer in range(shares.shape[2]):
        cells = []
        for i in range(len(t.steps)):
            x = shares[:, i, layer][np.isfinite(shares[:, i, layer])]
            cells.append(f"{x.mean():.2f} [{x.min():.2f}, {x.max():.2f}]" if x.size else "n/a")
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    lines += ["", "Onset per head, within each seed (the heads that first pass the threshold at each step):", ""]
    return lines + [f"- seed {s}: {_onset_heads(t, s)}" for s in t.seeds] + [""]


def _changes(t: S.SeedTrajectory) -> list[str]:
    """The section of the first-to-last decisions, worded as the analysis words them (S.SUITE)."""
    with reading_with(S.SUITE):
        return _changes_read(t)


def _changes_read(t: S.SeedTrajectory) -> list[str]:
    lines = ["## First to last revision, across seeds", ""]
    if not t.changes:
        return lines + ["Only one revision was measured: there is no change to decide."]
    lines += [f"From {_at(t, t.first)} to {_at(t, t.last)}, n = {len(t.paired)} seeds; the key and attention metrics "
              f"and the gain CV are one family (Bonferroni over its testable comparisons), the loss its own:", ""]
    lines += [f"- {c.verdict}" for c in t.changes]
    titles = {m.key: m.title for m in t.metrics}
    lines += ["", "Metrics (last against first, per seed: log ratios for pr_sv, norms and entropy, else "
                  "differences):", ""]
    lines += decision_table({(c.metric, c.group): c.decision for c in t.changes if c.metric != A.LOSS}, 3,
                            name_of=lambda k: f"{titles[k[0]]}, {k[1]}", unit="seed", what="metric, layer group")
    lines += ["", "Loss:", ""] + decision_table({"loss": c.decision for c in t.changes if c.metric == A.LOSS}, 4,
                                                unit="seed", what="loss, whole model")
    return lines + ["", "How it is decided: " + rule_text(t.margin, t.loss_margin, unit="seed") + ". "
                    + ratio_text("key PR, key norms, attention entropy where positive", "seed") + "."]


def in_short(t: S.SeedTrajectory) -> list[str]:
    """The report's "In short" (research.plots.in_short, placed first by research.studies.render): the first-to-last
    changes per metric across seeds (trajectory.short_lines), and each seed's first sink head, described; with one
    revision, what it measured."""
    titles = {m.key: m.title for m in t.metrics}
    onsets = "; ".join(f"seed {s} " + (f"by {_at(t, o)}" if (o := t.model_onset(s)) is not None else
                                       "none at any revision") for s in t.seeds)
    sinks = f"- First sink head of each seed (above {t.sink_threshold:g}; described, not tested): {onsets}."
    if not t.changes:
        return [f"- Only one revision was measured ({_at(t, t.first)}): nothing to decide.", sinks]
    lines = short_lines(t.changes, titles, _at(t, t.first), _at(t, t.last), len(t.paired), "seed")
    return lines + [sinks] if len(lines) < MOST else lines


def settle(t: S.SeedTrajectory) -> str:
    """The line on what would settle an open outcome, in the route of a suite's seeds (S.SUITE): a replication on other
    seeds, not seeds added to these."""
    with reading_with(S.SUITE):
        return settle_line("seed")


def report(t: S.SeedTrajectory) -> str:
    """report.md: provenance, checkpoints and duplicates, the seeds paired, metrics by step, sinks, the decisions."""
    return "\n".join(_header(t) + _checkpoints(t) + _compared(t) + _metrics(t) + _sinks(t) + _changes(t) + [""])
