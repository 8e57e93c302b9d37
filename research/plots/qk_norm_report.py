"""report.md of the QK-norm study, as text from the analysis (research.analysis.qk_norm): final values,
every pairwise decision with its CI, the verdicts, the gain's arithmetic against the keys' geometry,
the gain ablation, the write-ups' claims and provenance."""
from __future__ import annotations

import math

from research.analysis.qk_norm import STEP, STEP_RATIO, STEPS, SUMMARY_NAME, QkNormAnalysis
from research.analysis.rules import runs_of
from research.analysis.wording import conflict, effect_text, ratio_text, rule_text, settles_text
from research.plots.common import (decision_table, figure_line, fmt_at, fmt_ci, fmt_code, fmt_diff, fmt_rel_ci,
                                   per_seed_text, table_notes)
from research.plots.in_short import family_text, short_line
from research.plots.qk_norm import FIGURES, SITE_TEXT, name
from research.results.read import seed_of
from research.results.values import present
from research.results.vocabulary import ABLATION_TEXT, LETTERS, MAIN_SITE
from utils.hosts import host_kind


def _fmt(entry: dict, field: str, decimals: int) -> str:
    """A summary value as 'mean \u00b1 95% half width' (the half width only with several seeds)."""
    mean, half = entry[field], entry[f"{field}_ci95"]
    if mean is None:
        return "n/a"
    if half is not None:
        return f"{mean:.{decimals}f} \u00b1 {half:.{decimals}f}"
    return f"{mean:.{decimals}f}"


def provenance_text(runs: dict, cond: str) -> str:
    rl = runs_of(runs, cond)
    if not any(r.get("preset") or seed_of(r) is not None or r.get("provenance") or r.get("config") for r in rl):
        return "write-up results (no provenance recorded)"
    presets = sorted({str(r.get("preset") or (r.get("config") or {}).get("preset")) for r in rl} - {"None"})
    seeds = [seed_of(r) for r in rl]
    tokens = sorted({r["tokens"][-1] for r in rl if r["tokens"]})
    codes = sorted({fmt_code(r.get("provenance")) for r in rl})  # "git 0123456789", "no git commit (qk-keys 0.1.0)"
    parts = []
    if presets:
        parts.append("preset " + ", ".join(presets))
    if any(s is not None for s in seeds):
        parts.append(("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in seeds))
    if tokens:
        parts.append("tokens " + ", ".join(f"{t:,}" for t in tokens))
    parts.append(", ".join(codes))
    corpora = sorted({f"{d.get('corpus') or 'corpus'} ({str(d.get('source_hash'))[:12]})" for d in
                      ((r.get("data") or {}) for r in rl) if d.get("source_hash")})
    if corpora:
        parts.append("data " + ", ".join(corpora))
    machines = sorted({" on ".join(str(x) for x in (p["train_precision"], host_kind(p) or p.get("device")) if x)
                       for p in ((r.get("provenance") or {}) for r in rl) if p.get("train_precision")})
    if machines:
        parts.append("trained in " + ", ".join(machines))
    return "; ".join(parts)


def _seeds_sentence(runs: dict, conds: list[str]) -> str:
    seed_sets = {c: [seed_of(r) for r in runs_of(runs, c)] for c in conds}
    known = [v for v in seed_sets.values() if all(s is not None for s in v)]
    if conds and len(known) == len(conds) and all(sorted(map(str, v)) == sorted(map(str, known[0])) for v in known):
        return f"Every condition ran seed(s) {', '.join(map(str, known[0]))}. "
    if known:
        return "Seeds differ between conditions (see Provenance); only seeds both conditions ran are compared. "
    return "Seeds not recorded. "


def _pair(key) -> str:
    x, y = key
    return f"{LETTERS.get(x, x)} \u2212 {LETTERS.get(y, y)}"


TABLES = (("mean_pr", "Final key PR, pr_sv (the write-ups' uncentered PR)", 2),
          ("mean_pr_var", "Final key PR, pr_var (centered)", 2),
          ("val_loss", "Final validation loss (the loss verdict and claims use it)", 4),
          ("loss", "Final training loss (shown beside the validation loss)", 4))
# figure -> what it shows, placed after the table it explains (common.figure_line; report.html lays it beside)
FIGURE_TEXT = dict(zip(FIGURES, (
    "train (solid) and validation (dashed) loss over tokens", "mean key PR over tokens, each condition's seeds",
    "key PR per layer at the last probe", "the gain's (A\u2212B) and the normalization's (B\u2212C) effect per layer",
    "the gains' coefficient of variation over training",
    "the A\u2212B difference split into the gain's arithmetic and the keys' geometry")))
AFTER_TABLE = {"mean_pr": FIGURES[1], "mean_pr_var": FIGURES[2], "val_loss": FIGURES[0]}


def _figure(name: str) -> list[str]:
    return [figure_line(name, FIGURE_TEXT[name]), ""]


def _pr_agreement(a: QkNormAnalysis) -> str:
    var = a.decisions["mean_pr_var"]
    if not var or not any(d.tested for d in var.values()):
        return "pr_var is not recorded in these results (files without probe records), so only pr_sv is decided."
    lines = ("The write-ups' PR is pr_sv, from the singular values of the uncentered keys; pr_var removes the "
             "keys' mean first, so a shared direction of the keys moves pr_sv but not pr_var. ")
    off, apart = a.pr_disagreements, a.pr_differences
    if not off and not apart:
        return lines + "Here the two reach the same outcome on every pair tested in both."
    sv = a.decisions["mean_pr"]

    def both(p) -> str:
        return (f"pr_sv {effect_text(sv[p])} is {settles_text(sv[p])}; pr_var {effect_text(var[p])} is "
                f"{settles_text(var[p])}")

    def open_in_one(p) -> str:
        if sv[p].decided != var[p].decided:
            done, other = ("pr_sv", "pr_var") if sv[p].decided else ("pr_var", "pr_sv")
            return f"{_pair(p)}: {done} is decided and {other} is open ({both(p)})"
        return f"{_pair(p)}: {both(p)}"
    parts = []
    if off:
        parts.append("They disagree (their outcomes differ in kind) on " + "; ".join(
            f"{_pair(p)} ({both(p)}: {conflict(sv[p], var[p])})" for p in off) + ".")
    if apart:
        parts.append("Their outcomes differ without disagreeing, one settling what the other leaves open, on "
                     + "; ".join(open_in_one(p) for p in apart) + ".")
    return lines + " ".join(parts)


def _said(verdict, what: str) -> str:
    """A verdict as the report says it: an inconclusive one names the quantity whose steps are unsettled, so that
    four verdicts in a row do not repeat one sentence (combined.json keeps the analysis' own words)."""
    head, sep, rest = verdict.text.partition("; margin ")
    if verdict.key == "inconclusive" and head.endswith(" is not settled"):
        head = f"{head.removesuffix(' is not settled')} on {what} is not settled"
    return head + sep + rest


def _decisions(a: QkNormAnalysis) -> list[str]:
    lines = ["", "## Pairwise decisions", "", f"Procedure: {rule_text(a.margin, a.loss_margin)}. "
             f"{ratio_text('key PR, pr_sv and pr_var; per layer too')}; losses by differences.", ""]
    for field, title, dec in TABLES:
        ds = a.decisions[field]
        recorded = any(e[SUMMARY_NAME[field]] is not None for e in a.summary.values())
        lines += [f"### {title}", ""] + (decision_table(ds, dec, _pair, what=title.split(" (")[0]) if recorded else
                                         ["Not recorded in these results."]) + [""]
        lines += _figure(AFTER_TABLE[field]) if field in AFTER_TABLE else []
    lines += ["## Verdicts", "",
              f"- Key PR, pr_sv (the write-ups' measure): **{_said(a.verdict, 'key PR')}**.",
              f"- Key PR, pr_var (centered): **{_said(a.verdict_pr_var, 'the centered key PR')}**.",
              f"- {_pr_agreement(a)}",
              f"- Validation loss: **{_said(a.loss_verdict, 'the validation loss')}**.",
              f"- Training loss, for comparison (the claims use the validation loss): "
              f"{_said(a.train_loss_verdict, 'the training loss')}.",
              "", "Reading: a single driver is named only when its step's interval lies wholly beyond the margin, "
              "the other step's wholly inside it, and its step is shown larger than the other's by the margin (the "
              "difference of the steps, (A\u2212B)\u2212(B\u2212C), and A\u2212C both beyond it on the driver's "
              "side); steps that differ by less than the margin both contribute. Both beyond \u2192 both (same or "
              "opposite directions); both inside \u2192 neither, unless A\u2212C lies beyond the margin (small "
              "effects that add up) or two real opposite effects cancel. Any step not settled leaves the verdict "
              "inconclusive. With all three conditions each table's family also holds the difference of the steps "
              "(k = 4); for key PR, decided on log ratios, the steps are the ratios A/B and B/C and their difference "
              "is (A/B)/(B/C). docs/decisions.md has a worked example of each.", ""]
    return lines + _figure(FIGURES[3])


def _decomposition(a: QkNormAnalysis) -> list[str]:
    if not a.decomposition:
        return ["## The gain's arithmetic and the keys' geometry", "",
                "Not available: these results carry no pre-gain key records (k_hat), or QK / QK_frozen is missing.",
                ""]
    lines = ["## The gain's arithmetic and the keys' geometry", "",
             "The final A \u2212 B difference of a key metric (mean over layers), split per seed: **gain** = A's "
             "keys minus A's normalized keys before the gain (k_norm output / gain), what multiplying by the "
             "learned gain does; **geometry** = A's normalized keys minus B's keys, how the normalized keys "
             "themselves differ. The gain part is the gain acting on A's own normalized keys, so how differently "
             "it would act on B's keys (their interaction) is counted in it, not split off: the records hold no "
             "B keys with A's gains. At k_norm the total is the headline A \u2212 B above (decided there, once); "
             "gain and geometry are a family of two. After RoPE total, gain and geometry are a family of three.", "",
             "On log ratios the parts multiply: A/B = (A/Â)(Â/B), Â A's keys before the gain. "
             "Decided on per-seed log ratios: \"mean difference\" is in effective dimensions, \"%\" is the ratio "
             "minus 1, and the interval is the ratio's.", "",
             "| site | metric | part | n | mean difference | % | CI (level) | outcome | per seed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (site, metric), parts in a.decomposition.items():
        for part, d in parts.items():
            ci, rel = (fmt_ci(d, 2), fmt_rel_ci(d)[0]) if d.tested else ("n/a", f"{d.rel:+.1%}")
            name = f"{part} (headline)" if part == "total" and site == MAIN_SITE else part
            lines.append(f"| {site} | {metric} | {name} | {d.n} | {fmt_diff(d, 2)} | {rel} | {ci} | {d.outcome} "
                         f"| {per_seed_text(d, 2)} |")
    return lines + table_notes([d for parts in a.decomposition.values() for d in parts.values()], ratios=False) + [
        ""] + _figure(FIGURES[5])


def _ablation(a: QkNormAnalysis, runs: dict) -> list[str]:
    lines = ["## The gain ablation: how much the trained model relies on its trained gains", ""]
    if not a.ablation:
        return lines + ["Not available: no learned-gain run recorded it.", ""]
    qk = [r["gain_ablation"] for r in runs_of(runs, "QK") if r.get("gain_ablation")]
    measured = present([g["learned"]["val_loss"] for g in qk])  # null: not measured
    learned = float(measured.mean()) if measured.size else math.nan
    lines += [f"After training, each learned-gain run was evaluated on its validation batches with its q_norm and "
              f"k_norm gains as trained ({learned:.4f} nats, mean over {len(qk)} seed(s)) and with the gains a row "
              f"names replaced by 1, or by each layer's own mean (a scalar: the gain's scale without its shape); "
              f"computed in {qk[0].get('precision', 'fp32')}. \"q and k gains \u2192 1\" is the frozen-gain "
              f"condition's forward pass on the learned-gain model's weights. This measures how much the trained "
              f"model relies on the gains it learned, not whether learning a gain matters: that is A vs B above, "
              f"whose other weights adapted to gains held at 1. Differences are ablated minus trained:", ""]
    for quantity, title, dec in (("val_loss", "validation loss", 4), ("mean_pr", "mean key PR (pr_sv)", 2)):
        lines += [f"**{title}**", ""] + decision_table(a.ablation[quantity], dec, ABLATION_TEXT.get,
                                                      what=f"ablation, {title}") + [""]
    return lines + _figure(FIGURES[4])


def _probe_bias(a: QkNormAnalysis) -> list[str]:
    b = a.probe_bias
    if not b:
        return []
    return [f"Probe batch: {b['tokens']:,} tokens per probe. Isotropic keys of size {b['d_head']} would read "
            f"pr_var = {b['isotropic_pr_var']:.2f} at this batch if its tokens were independent (d / (1 + d / N): "
            f"a finite-sample shortfall of {b['shortfall']:.1%}). Tokens of one sequence are correlated, so the "
            f"effective N is smaller and the shortfall larger: this is the least bias, not its size.", ""]


def report(analysis: QkNormAnalysis) -> str:
    """The text of report.md."""
    runs = analysis.runs
    conds = analysis.conditions
    ns = {c: len(runs_of(runs, c)) for c in conds}
    lines = ["# QK-norm study: does the gain or the normalization drive key rank?", ""]
    lines.append("Conditions: " + "; ".join(name(c) for c in conds) + ". " + _seeds_sentence(runs, conds) +
             "PR is the participation ratio (sum s)\u00b2 / sum s\u00b2 of the singular values of the keys "
             f"({SITE_TEXT}), averaged over KV heads and layers; 'final' = the last probe, "
             f"{fmt_at([r['tokens'][-1] for c in conds for r in runs_of(runs, c) if r.get('tokens')])}.")
    lines.append("")
    if analysis.descriptive:
        lines.append("One seed per condition: the numbers below are descriptive only. No comparison is tested and "
                 "no verdict is drawn; run several seeds (--seeds) to decide.")
    else:
        lines.append("Values are mean \u00b1 95% confidence half width over seeds (Student t, n\u22121 degrees of "
                 "freedom); n is the number of seeds.")
    lines += ["", "## Final values", "",
          "| condition | final PR (pr_sv) | final PR (pr_var) | final val loss | final train loss | n |",
          "|---|---|---|---|---|---|"]
    for c in conds:
        e = analysis.summary[c]
        lines.append(f"| {name(c)} | {_fmt(e, 'final_pr', 1)} | {_fmt(e, 'final_pr_var', 1)} "
                 f"| {_fmt(e, 'final_val_loss', 3)} | {_fmt(e, 'final_loss', 3)} | {ns[c]} |")
    lines += _decisions(analysis) + _decomposition(analysis) + _ablation(analysis, runs) + _probe_bias(analysis)
    lines += ["## The write-ups' claims at this scale", ""]
    for k, cl in analysis.claims.items():
        lines.append(f"- ({k}) {cl.claim}: **{cl.status}**. {cl.text}")
    lines += ["", "## Provenance", ""]
    for c in conds:
        lines.append(f"- {c}: {provenance_text(runs, c)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# In short: the write-ups' two questions answered first (research.plots.in_short)

_ANSWER = {"gain": "the learned gain does", "normalization": "the normalization does",
           "both": "both do, in the same direction", "contribute": "both contribute, in the same direction",
           "opposite": "both do, in opposite directions", "small": "QK-norm as a whole does, neither step alone",
           "cancel": "the two change it a little, in opposite directions, and cancel",
           "neither": "neither: QK-norm changes it by less than the margin"}


def _answer(question: str, verdict, n: int) -> str:
    """The plain-words answer to one of the write-ups' questions, from its verdict; "not decided at these seeds"
    where the verdict is inconclusive."""
    head = verdict.text.split("; margin ")[0]
    if verdict.key == "inconclusive":  # why: the lines below, pair by pair, and the verdict under Verdicts
        said = f"not decided at these {n} seeds: the lines below say which step is open"
    else:
        said = _ANSWER.get(verdict.key) or head
    return f"- **{question}** {said[0].upper()}{said[1:]}."


def in_short(a: QkNormAnalysis) -> list[str]:
    """The write-ups' questions (does the gain or the normalization drive key rank, and the validation loss?) in
    plain words, each pair and the difference of the steps with its outcome, effect and interval, and the claims'
    outcomes."""
    n = min((len(runs_of(a.runs, c)) for c in a.conditions), default=0)
    lines = [_answer("Which drives key rank (final key PR), the gain or the normalization?", a.verdict, n),
             _answer("Which drives the validation loss?", a.loss_verdict, n)]
    if not any(d.tested for field in ("mean_pr", "val_loss") for d in a.decisions[field].values()):
        return lines + [f"- {what}, final (nothing tested, the values described): " + "; ".join(
            f"{c} {_fmt(a.summary[c], key, dec)}" for c in a.conditions) for what, key, dec in (
            ("Key PR (pr_sv)", "final_pr", 1), ("Validation loss", "final_val_loss", 3))]
    for field, what in (("mean_pr", "key PR"), ("val_loss", "validation loss")):
        decided = {**a.decisions[field], **({STEPS: a.steps[field]} if a.steps.get(field) is not None else {})}
        family = family_text(f"{what} family", decided.values())
        for pair, d in decided.items():
            lines.append(short_line(f"{what}, {(STEP_RATIO if d.ratio else STEP)[pair]}", d, family))
    if a.claims:
        lines.append("- The write-ups' claims at this scale: " + "; ".join(
            f"({k}) **{c.status}**" for k, c in a.claims.items()) + " (The write-ups' claims, below).")
    return lines
