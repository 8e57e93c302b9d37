"""Figures and report of the fine-tuning study (research/finetune_keys_study.py), from its analysis. No torch."""
from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from research.analysis import finetune as A
from research.analysis.dips import OPEN as RECOVERY_OPEN
from research.analysis.dips import RISES, course_text, fall_rise_text
from research.analysis.wording import OPEN, effect_text, ratio_text, rule_text
from research.analysis.series import mean_band
from research.plots.common import (color, decided_text, decision_table, figure_line, fmt_code, fmt_final, fmt_num,
                                   fmt_tokens, message_figure, styled, subplots, tokens_axis)
from research.plots.in_short import family_text, short_line
from research.results.read import last
from research.results.vocabulary import label

FIGURES = ("1_keys.png", "2_loss.png", "3_gains_and_logits.png")
TERM_TEXT = {"logit_max": "largest logit", "logit_q_norm": "|q|", "logit_k_norm": "|k|", "logit_cos": "cos(q, k)",
             "logit_q_gain": "q gain factor", "logit_k_gain": "k gain factor"}


def _band(ax, analysis: A.FinetuneAnalysis, name: str) -> None:
    for c in analysis.conditions:
        tokens, y = analysis.series[c][name]
        if not y.size:
            continue
        mean, half = mean_band(y)
        x = tokens_axis(ax, tokens)
        ax.plot(x, mean, color=color(c), label=f"{label(c)} (n={y.shape[0]})", marker="o", ms=3)
        if np.isfinite(half).any():
            ax.fill_between(x, mean - half, mean + half, color=color(c), alpha=0.2, lw=0)


@styled
def bands_figure(analysis: A.FinetuneAnalysis, panels: list[tuple[str, str]], ylabel: str, title: str) -> Figure:
    """One panel per (series name, title): each condition's mean over seeds with its 95% band."""
    fig, axes = subplots(1, len(panels), figsize=(5 * len(panels) + 0.5, 4.2), layout="constrained")
    for ax, (name, text) in zip(axes, panels):
        _band(ax, analysis, name)
        ax.set_title(text, fontsize=10)
        ax.set_ylabel(ylabel)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{title} (mean and 95% CI over seeds)")
    return fig


def keys_figure(analysis: A.FinetuneAnalysis) -> Figure:
    return bands_figure(analysis, [(name, text) for name, text, *_ in A.KEY_FIELDS], "mean over layers and KV heads",
                        "Keys while fine-tuning")


def loss_figure(analysis: A.FinetuneAnalysis) -> Figure:
    return bands_figure(analysis, [("loss", "training loss since the previous probe"), ("val_loss", A.LOSS_LABEL)],
                        "nats per token", "Loss while fine-tuning")


@styled
def gains_figure(analysis: A.FinetuneAnalysis) -> Figure:
    if not analysis.logit_split:
        return message_figure("Gains and logits", "no run with two probes or more")
    fig, (left, right) = subplots(1, 2, figsize=(13, 4.4), layout="constrained")
    for c, rows in analysis.drift.items():
        mean = np.array([m for m, _ in rows])
        half = np.array([h for _, h in rows])
        x = np.arange(len(rows))
        left.errorbar(x, mean, yerr=np.where(np.isfinite(half), half, 0), color=color(c), marker="o", ms=3,
                      capsize=2, label=label(c))
    left.set_xlabel("layer")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_ylabel("|g_end - g_start| / |g_start|")
    left.set_title("how far the k_norm gains moved", fontsize=10)
    if analysis.drift:
        left.legend(fontsize=8)
    width = 0.8 / max(len(analysis.logit_split), 1)
    for i, (c, terms) in enumerate(analysis.logit_split.items()):
        x = np.arange(len(A.LOGIT_TERMS)) + i * width
        mean = np.array([terms[t][0] for t in A.LOGIT_TERMS])
        half = np.array([terms[t][1] for t in A.LOGIT_TERMS])
        right.bar(x, np.nan_to_num(mean), width, yerr=np.where(np.isfinite(half), half, 0), color=color(c),
                  label=label(c), capsize=2)
    right.axhline(0, color="black", lw=0.6)
    right.set_xticks(np.arange(len(A.LOGIT_TERMS)) + width * (len(analysis.logit_split) - 1) / 2,
                     [TERM_TEXT[t] for t in A.LOGIT_TERMS], fontsize=8)
    right.set_ylabel("change of the mean log (last probe - first)")
    right.set_title("the largest logit per head, taken apart", fontsize=10)
    right.legend(fontsize=8)
    return fig


def figures(analysis: A.FinetuneAnalysis) -> dict[str, Figure]:
    return dict(zip(FIGURES, (keys_figure(analysis), loss_figure(analysis), gains_figure(analysis))))


def _ci_text(mean: float, half: float, nd: int = 3) -> str:
    if not math.isfinite(mean):
        return "n/a"
    return f"{mean:+.{nd}f}" + (f" \u00b1 {half:.{nd}f}" if math.isfinite(half) else " (one seed)")


def _wall(runs: dict, analysis: A.FinetuneAnalysis) -> float:
    """Seconds of training and probing over all runs (each run's last wall_time_s)."""
    walls = [r["wall_time_s"][-1] for c in analysis.conditions for r in A.runs_of(runs, c) if r.get("wall_time_s")]
    return float(sum(w for w in walls if w is not None and math.isfinite(w)))


def _last_tokens(runs: dict, analysis: A.FinetuneAnalysis) -> list:
    return [r["tokens"][-1] for c in analysis.conditions for r in A.runs_of(runs, c) if r.get("tokens")]


def _loss_change(analysis: A.FinetuneAnalysis) -> list[str]:
    """The held-out loss from the first probe to the last, per condition: decided, or said to be open."""
    lines = ["", "Held-out loss (the probe batch's validation loss), last probe minus first, per seed (margin \u00b1"
             f"{analysis.loss_margin:.1%} of the first probe's loss):", ""]
    lines += decision_table(analysis.loss_change, 4, name_of=label) + [""]
    for c, d in analysis.loss_change.items():
        runs = A.runs_of(analysis.runs, c)
        start = float(np.nanmean([A.start_val_loss(r) for r in runs]))
        end = float(np.nanmean([last(r, "val_loss") for r in runs]))
        way = ("rose" if d.diff > 0 else "fell") if d.differs else "stayed within the margin" if d.same else ""
        said = f"{way}: {effect_text(d)}, {d.outcome}" if d.decided else decided_text(d, 4)
        lines.append(f"- {label(c)}, held-out loss: {fmt_num(start)} at the first probe, {fmt_num(end)} "
                     f"{fmt_final(_last_tokens({c: runs}, analysis))} (means over seeds); {said}.")
    return lines + ["", figure_line("2_loss.png", "Training and held-out loss while fine-tuning")]


def _recovery(analysis: A.FinetuneAnalysis) -> list[str]:
    """Does key PR rise again after its lowest point? Chosen on one half of the seeds, tested on the other."""
    lines = ["", "## Does key PR rise again after its lowest point?", "",
             "The probe of the minimum is the interior probe lowest in the mean key PR (pr_sv at k_norm) of every "
             "other seed from the second (in seed order); the fall to it (first minus it) and the rise after it "
             "(last minus it) are tested on the other seeds only, so the choice is never tested on the data that "
             "made it (research/analysis/dips.py, as for the QK-norm study's claim (d)), each on per-seed log "
             "ratios (first over it, last over it). Both beyond the margin and positive: it falls and rises again. "
             "One family over the conditions. Below the table the fall is a share of the start (1 \u2212 it/first) "
             "and the rise a share of the low (last/it \u2212 1), each from the same interval.", ""]
    tested = {(c, part): d for c, r in analysis.recovery.items() if r.fall is not None
              for part, d in (("fall", r.fall), ("rise", r.rise))}
    if tested:
        lines += decision_table(tested, 3, name_of=lambda k: f"{label(k[0])}: {k[1]}") + [""]
    for c, r in analysis.recovery.items():
        if r.fall is None:
            lines.append(f"- {label(c)}, key PR: not tested ({r.why_not}).")
            continue
        fall, rise = fall_rise_text(r.fall, r.rise, r.start)
        course = "" if r.status == RISES else f": {course_text(r.fall, r.rise)}"  # which part says otherwise
        lines.append(f"- {label(c)}, key PR: minimum chosen at {fmt_tokens(r.tokens)} tokens on seed(s) "
                     f"{', '.join(map(str, r.choose))}, tested on seed(s) {', '.join(map(str, r.test))}: "
                     f"**{r.status}**{course} (fall {fall}, {r.fall.outcome}; rise {rise}, "
                     f"{r.rise.outcome}).")
    return lines


def report(analysis: A.FinetuneAnalysis) -> str:
    runs = analysis.runs
    first = next(r for c in analysis.conditions for r in A.runs_of(runs, c))
    model = (first.get("config") or {}).get("model") or {}
    train = (first.get("config") or {}).get("train") or {}
    prov = first.get("provenance") or {}
    lines = ["# Fine-tuning a pretrained QK-norm model: its keys, gains and logits", "",
             f"Model: {model.get('source', '?')} ({model.get('model_type', '?')}, {model.get('n_layers', '?')} "
             f"layers, {model.get('n_heads', '?')} query / {model.get('n_kv_heads', '?')} KV heads of "
             f"{model.get('d_head', '?')}). Text: {train.get('corpus', '?')}; {fmt_tokens(first['tokens'][-1])} "
             f"training tokens per run ({train.get('steps', '?')} steps of {train.get('batch_size', '?')} x "
             f"{train.get('seq_len', '?')}), learning rate {train.get('lr', '?')}, embeddings frozen, "
             f"{train.get('precision', '?')} on {prov.get('device', '?')}. Seeds: "
             + "; ".join(f"{label(c)}: {', '.join(map(str, s))}" for c, s in analysis.seeds.items()) + ".",
             f"Code: {fmt_code(prov)}. Wall time of the runs: {_wall(runs, analysis) / 60:.1f} min (training and "
             f"probes; "
             f"loading not counted).", "",
             "## Verdict", "", analysis.verdict, "",
             f"## Trained minus frozen gains, {fmt_final(_last_tokens(runs, analysis))} (paired by seed)", ""]
    if analysis.final:
        names = {n: t for n, t, *_ in A.KEY_FIELDS}
        lines += decision_table({k: d for k, d in analysis.final.items() if k != "val_loss"}, 3, name_of=names.get)
        lines += ["", "Loss:", ""] + decision_table({A.LOSS_LABEL: analysis.final["val_loss"]}, 4)
    else:
        lines.append("Not decided: the study needs both conditions with a common seed.")
    lines += ["", "## Change over fine-tuning within each condition (last probe minus first)", ""]
    names = {n: t for n, t, *_ in A.KEY_FIELDS}
    lines += decision_table(analysis.change, 3, name_of=lambda k: f"{label(k[0])}: {names[k[1]]}")
    lines += ["", figure_line("1_keys.png", "Key PR, PR before the gain and key norm while fine-tuning")]
    lines += _loss_change(analysis) + _recovery(analysis)
    lines += ["", "## How far the k gains moved, and the largest logit taken apart", "",
              "Mean over seeds \u00b1 95% CI half width. Gain drift: |g_end - g_start| / |g_start| of the k_norm gain "
              "vector, mean over layers. Logit terms: change of the mean (over layers and query heads) of the log of "
              "each term at each head's largest logit; log logit = log scale + log|q| + log|k| + log cos, and |q| = "
              "|q_hat| x q gain factor (|q_hat| is fixed near sqrt(d_head) by the norm).", "",
              "| condition | gain drift | " + " | ".join(TERM_TEXT[t] for t in A.LOGIT_TERMS) + " |",
              "|---|---|" + "---|" * len(A.LOGIT_TERMS)]
    for c in analysis.conditions:
        lines.append(f"| {label(c)} | {_ci_text(*analysis.drift_mean.get(c, (math.nan, math.nan)), 4)} | "
                     + " | ".join(_ci_text(*analysis.logit_split.get(c, {}).get(t, (math.nan, math.nan)))
                                  for t in A.LOGIT_TERMS) + " |")
    lines += ["", figure_line("3_gains_and_logits.png", "How far the k gains moved, and the largest logit taken apart")]
    lines += ["", "How it is decided: " + rule_text(analysis.margin, analysis.loss_margin) + ". "
              + ratio_text("key PR, key norms: against the other condition, or a last value against the first") + ".",
              ""]
    return "\n".join(lines)


def in_short(analysis: A.FinetuneAnalysis) -> list[str]:
    """The study's question (trained against frozen q/k norm gains, in the final key metrics and the validation loss),
    each with its outcome, effect and interval; then each condition's held-out loss over fine-tuning and whether its
    key PR rises again after its lowest point."""
    lines = []
    if analysis.final:
        keys = {name: analysis.final[name] for name, *_ in A.KEY_FIELDS}
        family = family_text("key family", keys.values())
        lines += [short_line(f"{text}, trained / frozen gains" if keys[name].ratio else
                             f"{text}, trained \u2212 frozen gains", keys[name], family)
                  for name, text, *_ in A.KEY_FIELDS]
        d = analysis.final["val_loss"]
        lines.append(short_line(f"{A.LOSS_LABEL}, trained \u2212 frozen gains", d, family_text("its own family", [d])))
    else:
        lines.append("- Trained against frozen gains: not compared (the study needs both conditions with a common "
                     "seed)")
    family = family_text("loss-change family", analysis.loss_change.values())
    lines += [short_line(f"held-out loss over fine-tuning, {label(c)} (last \u2212 first probe, share of the first)",
                         d, family) for c, d in analysis.loss_change.items()]
    said = {c: f"**{r.status}**" + (OPEN if r.status == RECOVERY_OPEN else "")
            + (f" ({r.why_not})" if r.why_not else "") for c, r in analysis.recovery.items()}
    if len(set(said.values())) == 1 and len(said) > 1:
        lines.append(f"- Key PR rises again after its lowest point: {next(iter(said.values()))} in every condition")
    elif said:
        lines.append("- Key PR rises again after its lowest point: "
                     + "; ".join(f"{label(c)} {text}" for c, text in said.items()))
    return lines
