"""Figures and report of a study of any conditions (research.analysis.conditions; a study file, research/study.py).

    trajectories.png   each quantity (layer mean) over training: mean over seeds with its 95% band, per condition
    per_layer.png      each probed quantity per layer at the last probe, mean over seeds with its 95% band
    comparisons.png    every comparison of every quantity: its estimate and interval against its margin
    kv_formats.png     where the runs measured the key-cache formats: loss change against bytes per key value

Each figure stands right after the paragraph that says what it shows. What the report and its "In short" (in_short,
placed under the title by research.studies.render) state, and how each difference and margin is printed:
docs/study_files.md, "What is compared".
"""
from __future__ import annotations

import math
import textwrap

import numpy as np
from matplotlib.ticker import MaxNLocator

from configs.config import variant_fields
from research.analysis.conditions import BEYOND, INSIDE, OPEN, REAL, ConditionsAnalysis, Quantity, reading
from research.analysis.rules import (ALPHA, DESCRIPTIVE, DIFFERENCE, DIFFERENT, EQUAL, NO_DATA, NO_SPREAD,
                                     RATIO_WHERE_POSITIVE, WITHIN, Decision, compared_on)
from research.analysis.wording import OPEN as MARK
from research.analysis.wording import (interval_digits, interval_text, margin_bounds, needed_text, ratio_text,
                                       rule_text, unmissable, unmissable_text, untested_text)
from research.analysis.series import aligned, mean_band
from research.plots.common import (CONDITION_COLORS, cell_text, figure_line, fmt_at, fmt_ci, fmt_diff, fmt_p,
                                   message_figure, per_seed_text, shown_effect, shown_margin, styled, subplots,
                                   table_notes, tokens_axis)
from research.plots.in_short import MOST
from research.plots.qk_norm_report import provenance_text
from research.results.read import seed_of

FIGURES = ("trajectories.png", "per_layer.png", "comparisons.png")
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
        ax.set_title(textwrap.fill(q.text, 44))
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
    return _panels(a, "Trajectories", a.quantities, _trajectory,
                   "Over training: the layer mean at each probe, mean over seeds with its 95% band")


@styled
def fig_per_layer(a: ConditionsAnalysis):
    return _panels(a, "Per layer", [q for q in a.quantities if q.layered], _layers,
                   f"Per layer, {fmt_at([a.budget_tokens])}: mean over seeds with its 95% band", xlabel="layer")


UNTESTED_LABEL = {DESCRIPTIVE: "one seed", NO_DATA: "no data", NO_SPREAD: "no spread"}


@styled
def fig_comparisons(a: ConditionsAnalysis):
    pairs = list(next(iter(a.decisions.values()), {}))
    if not pairs:
        return message_figure("Comparisons", "one condition: nothing to compare")
    fig, axes = _grid(len(a.quantities))
    for ax, q in zip(axes, a.quantities):
        ax.axvline(0, color="black", lw=0.8)
        for i, p in enumerate(pairs):
            d = a.decisions[q.key][p]
            if math.isfinite(d.margin):  # each comparison's own margin: a share of its pair's mean, or in logits
                ax.fill_betweenx([i - 0.35, i + 0.35], *shown_margin(d), color="#999999", alpha=0.25, lw=0)
            if not d.tested:
                ax.plot([], [])
                ax.text(0, i, UNTESTED_LABEL[d.outcome], ha="center", va="center", fontsize=8)
                continue
            shade = {DIFFERENT: "#c44e52", EQUAL: "#4c72b0", WITHIN: "#4c72b0"}.get(d.outcome, "#555555")
            est, lo, hi = shown_effect(d)
            ax.plot([lo, hi], [i, i], color=shade, lw=2.2)
            ax.plot(est, i, "o", color=shade, ms=5)
        ax.set_yticks(range(len(pairs)), [_pair(p) for p in pairs], fontsize=8)
        ax.set_ylim(len(pairs) - 0.4, -0.6)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # ticks of a small quantity (0.0015) would run together
        ratio = any(a.decisions[q.key][p].ratio for p in pairs)
        ax.set_xlabel("ratio \u2212 1, %" if ratio else "difference" + (f", {q.unit}" if q.unit else ""))
        ax.set_title(textwrap.fill(q.text + (" (primary)" if q.key in a.primary else ""), 44))
    fig.suptitle("Each comparison's estimate and Bonferroni interval in the quantity's units, or as a ratio minus 1 "
                 "where it is decided on log ratios, against its margin (grey)\nred: beyond the margin, blue: inside "
                 "it, dark grey: not decided")
    fig.tight_layout()
    return fig


KV_FORMATS = "kv_formats.png"  # drawn where the runs' key-cache sections hold the formats engines ship


def _format_changes(res: dict) -> dict[str, tuple[float, float]]:
    """{format case: (bytes per key value, loss change as a share of the unquantized loss)} of a run's section."""
    kv = res.get("kv_cache") or {}
    f, base = kv.get("formats") or {}, ((kv.get("loss") or {}).get("by_bits") or {}).get("16")
    if not f or not base:
        return {}
    return {c: (f["bytes"][c], f["change"][c] / base) for c in f.get("cases", []) if c in f.get("change", {})}


@styled
def fig_kv_formats(a: ConditionsAnalysis):
    """Loss change per key-cache format, the formats in order of bytes per key value (the tick labels say how many),
    each condition a colour, the format alone (circle) and with the first 4 and 32 tokens kept (square, triangle):
    mean over seeds with its 95% interval, the key-cache loss margin shaded."""
    from research.analysis.stats import mean_ci95
    per = {c: [_format_changes(r) for r in a.runs[c]] for c in a.conditions}
    seen = {name: v[0] for runs in per.values() for p in runs for name, v in p.items()}
    plain = sorted((n for n in seen if "+keep" not in n), key=lambda n: (seen[n], n))
    fig, ax = subplots(figsize=(max(8, 1.3 * len(plain)), 5))
    cols, C = colors(a.conditions), len(a.conditions)
    for i, cond in enumerate(a.conditions):
        for j, (suffix, marker) in enumerate((("", "o"), ("+keep4", "s"), ("+keep32", "^"))):
            for x, name in enumerate(plain):
                vals = [100 * p[name + suffix][1] for p in per[cond] if name + suffix in p]
                if not vals:
                    continue
                m, h = mean_ci95(vals)
                ax.errorbar([x + (i - (C - 1) / 2) * 0.18 + (j - 1) * 0.05], [m], yerr=[[h if math.isfinite(h)
                                                                                       else 0]],
                            fmt=marker, color=cols[cond], ms=4, capsize=1.5, lw=0.8,
                            label=cond if (j, x) == (0, 0) else None)
    ax.axhspan(-100 * a.kv_loss_margin, 100 * a.kv_loss_margin, color="0.88", zorder=0)
    ax.axhline(0, color="0.5", lw=0.6)
    ax.set_xticks(range(len(plain)), [f"{n}\n{seen[n]:.3g} B" for n in plain], fontsize=8)
    ax.set_ylabel("loss change, every key in the format (% of the loss)")
    ax.legend(fontsize=8)
    ax.set_title("Key-cache formats by bytes per key value: loss change, mean over seeds with its 95% interval\n"
                 "circle: the format; square, triangle: the first 4, 32 tokens kept; grey: the key-cache loss margin",
                 fontsize=9)
    fig.tight_layout()
    return fig


def figures(a: ConditionsAnalysis) -> dict:
    out = dict(zip(FIGURES, (fig_trajectories(a), fig_per_layer(a), fig_comparisons(a))))
    if any(_format_changes(r) for runs in a.runs.values() for r in runs):
        out[KV_FORMATS] = fig_kv_formats(a)
    return out


# ----------------------------------------------------------------------------- report

def _flat_config(res: dict) -> dict:
    cfg = res.get("config") or {}
    return {k: v for section in cfg.values() if isinstance(section, dict) for k, v in section.items()}


def _settings(a: ConditionsAnalysis) -> tuple[dict[str, str], str]:
    """({condition: 'field=value, ...'}, the shared line). A row names the fields whose value is not the same in every
    run: the baseline's row (and each row of a study without one) its value of each, any other row those where its
    value is not the baseline's, what the condition changes. The shared line: the variant fields (configs.config
    declares which) every run has at one value."""
    configs = {c: _flat_config(a.runs[c][0]) for c in a.conditions}
    fields = list(dict.fromkeys(k for cfg in configs.values() for k in cfg))
    varying = [k for k in fields if k != "seed" and len({repr(cfg.get(k)) for cfg in configs.values()}) > 1]
    ref = configs.get(a.baseline)

    def row(c: str) -> str:
        keys = varying if ref is None or c == a.baseline else \
            [k for k in varying if repr(configs[c].get(k)) != repr(ref.get(k))]
        return ", ".join(f"{k}={configs[c].get(k, 'n/a')}" for k in keys) or \
            ("(the baseline's config)" if varying else "(the shared config)")
    shared = [f"{k}={next(iter(configs.values())).get(k)}" for k in variant_fields()
              if k not in varying and any(k in cfg for cfg in configs.values())]
    return {c: row(c) for c in a.conditions}, ", ".join(shared)


def _value(e: dict, decimals: int) -> str:
    if e["mean"] is None:
        return "n/a"
    return f"{e['mean']:.{decimals}f}" + (f" \u00b1 {e['ci95']:.{decimals}f}" if e["ci95"] is not None else "")


def _pct(x: float) -> str:
    """A share as the report prints it: '+121%', '+0.6%' (one decimal below 10%); 'n/a' when not finite."""
    if not math.isfinite(x):
        return "n/a"
    return f"{x:+.1%}" if abs(x) < 0.1 else f"{x:+.0%}"


def _units(q: Quantity) -> str:
    return f" {q.unit}" if q.unit else ""


def _digits(q: Quantity, d: Decision) -> int:
    """The decimals of d's interval and margin: the quantity's, or more where an end would print on the wrong side
    of 0 or of the margin (research.analysis.wording.interval_digits)."""
    return interval_digits(d, q.decimals) if d.tested else q.decimals


def _margin(q: Quantity, d: Decision) -> str:
    """The margin in the quantity's units, and what it is a share of where it is one: '\u00b10.25 logits',
    '\u00b10.149, 3% of the pair's mean 4.950'; on log ratios the same share as a ratio's bounds: '\u00b13% of the
    pair's mean: a ratio from -2.96% to +3.05%' (at two decimals, or the interval's where it needs more); marked
    where it cannot be missed (wording.unmissable)."""
    if not math.isfinite(d.margin):
        return "n/a"
    if d.ratio:  # the bounds' asymmetry shows at two decimals; more than the interval's never moves an end across
        lo, hi = margin_bounds(d)
        n = max(_digits(q, d) if d.tested else 0, 2)
        return f"\u00b1{d.share * 100:g}% of the pair's mean: a ratio from {lo:+.{n}%} to {hi:+.{n}%}"
    n = _digits(q, d)
    m = f"\u00b1{d.margin:.{n}f}{_units(q)}"
    m = m if d.share is None else f"{m}, {d.share * 100:g}% of the pair's mean {d.scale:.{q.decimals}f}"
    return f"{m}; {unmissable_text(d, n)}" if unmissable(d) else m


def _of(a: ConditionsAnalysis, p: tuple, d: Decision) -> str:
    """'+121% of QK' ('' where the condition's mean is 0)."""
    share = a.of_reference(p, d)
    return f"{_pct(share)} of {a.reference(p)}" if math.isfinite(share) else ""


def _entry(a: ConditionsAnalysis, q: Quantity, p: tuple, d: Decision) -> str:
    """'largest attention logit +9.91 [+7.10, +12.72] logits (+121% of QK; margin \u00b10.25 logits)'; decided on log
    ratios: 'key PR (pr_sv) ratio QK/base +4.1% [+2.0%, +6.3%] (mean difference +1.23; margin ...)'. Each interval
    with the digits its ends need against 0 and the margin (wording.interval_text)."""
    est, ci = interval_text(d, q.decimals)
    if d.ratio:
        return (f"{q.text} ratio {p[0]}/{p[1]} {est} {ci} (mean difference {d.diff:+.{q.decimals}f}{_units(q)}; "
                f"margin {_margin(q, d)})")
    of = _of(a, p, d)
    return f"{q.text} {est} {ci}{_units(q)} (" + (f"{of}; " if of else "") + f"margin {_margin(q, d)})"


def _exact(q: Quantity, p: tuple, d: Decision) -> str:
    """'key norm +0.010', or decided on log ratios 'key PR (pr_sv) ratio up/base +50.0% (mean difference +12.50)'."""
    if d.ratio:
        return f"{q.text} ratio {p[0]}/{p[1]} {d.rel:+.1%} (mean difference {d.diff:+.{q.decimals}f}{_units(q)})"
    return f"{q.text} {d.diff:+.{q.decimals}f}{_units(q)}"


# The parts of a comparison's line, in order: (reading, its words, how each quantity is named in it, the joint); the
# reading's words in bold, marked open (wording.OPEN) where the outcome is left open
def _short_entry(a: ConditionsAnalysis, q: Quantity, p: tuple, d: Decision) -> str:
    """'largest attention logit +9.91 [+7.10, +12.72] logits (+121% of QK)'; decided on log ratios 'key PR (pr_sv)
    ratio QK/base +4.1% [+2.0%, +6.3%]': the effect, its interval and its share of the reference (its margin and mean
    difference: the tables, _entry), and a margin that cannot be missed said so (wording.unmissable_text)."""
    est, ci = interval_text(d, q.decimals)
    if d.ratio:
        return f"{q.text} ratio {p[0]}/{p[1]} {est} {ci}"
    said = "; ".join(x for x in (_of(a, p, d), unmissable_text(d, _digits(q, d))) if x)  # an "equal" that says little
    return f"{q.text} {est} {ci}{_units(q)}" + (f" ({said})" if said else "")


PARTS = (
    (BEYOND, f"**{BEYOND}** in {{}}", _short_entry, "; "),
    (INSIDE, f"**{INSIDE}** in {{}}", _short_entry, "; "),
    (REAL, f"**{REAL}**{MARK}, in {{}}", _short_entry, "; "),
    (OPEN, f"**{OPEN}**{MARK} (inconclusive: the interval holds 0 and reaches past the margin) in {{}}",
     lambda a, q, p, d: q.text, ", "),
    (NO_SPREAD, "**shows no spread** in {}: every seed differs by exactly that, so there is no interval and it is not "
     "decided", lambda a, q, p, d: _exact(q, p, d), "; "),
    (DESCRIPTIVE, "**has one paired seed** in {}: described, not tested", lambda a, q, p, d: _exact(q, p, d), "; "),
    (NO_DATA, "**has no paired values** in {}", lambda a, q, p, d: q.text, ", "),
)


def _line(a: ConditionsAnalysis, p: tuple, items: list) -> str:
    """One comparison's line of "In short": what it decided about each stated quantity, each reason for not deciding
    said in its own words, the outcome's words in bold."""
    if a.baseline_set_aside and p[1] == a.baseline:
        return (f"- {_pair(p)}: **not compared**: every run of the baseline {a.baseline} was set aside (What was "
                f"compared says why).")
    groups: dict = {}
    for q, d in items:
        groups.setdefault(reading(d), []).append((q, d))
    if set(groups) == {DESCRIPTIVE}:
        return (f"- {_pair(p)}: **one paired seed**: nothing is tested; the differences are described in the tables "
                f"under Decisions.")
    if set(groups) == {NO_DATA}:
        return (f"- {_pair(p)}: **no paired values**: no seed has a value in both conditions (What was compared names "
                f"the runs without a seed).")
    parts = [words.format(joint.join(name(a, q, p, d) for q, d in groups[key]))
             for key, words, name, joint in PARTS if key in groups]
    return f"- {_pair(p)}: " + ", and ".join(parts) + "."


def _family_note(a: ConditionsAnalysis) -> str:
    """How far "In short" may be read at once: the primary quantities' one family, or the bound of reading each
    quantity's family together with the others."""
    if a.primary:
        k = a.family_k[a.primary[0]]
        level = (f"every interval at 1 \u2212 {ALPHA}/{k} ({1 - ALPHA / k:.1%}), so all the lines below are right at "
                 f"once with probability at least {1 - ALPHA:.0%}") if k else "none of them has an interval"
        return (f"The study's primary quantities ({', '.join(q.text for q in a.stated)}) are read as one family of "
                f"k = {k} comparisons: {level}.")
    n = sum(1 for q in a.quantities if a.family_k[q.key])
    if n < 2:
        return ""
    return (f"Read as {n} families, one per quantity, each right at once with probability at least {1 - ALPHA:.0%}; "
            f"a false line among them up to {min(1.0, n * ALPHA):.0%} (Bonferroni, {n} \u00d7 {ALPHA:.0%}). Name "
            f"`primary` quantities in the study file to read them as one family (docs/study_files.md).")


def in_short(a: ConditionsAnalysis) -> list[str]:
    """The report's "In short" (research.plots.in_short, placed first by research.studies.render): how far its lines may
    be read at once and in what units, in one line; one line per comparison (the stated quantities' outcomes, in bold);
    the exploratory quantities named. At most in_short.MOST lines: past that, the last comparison line counts the rest,
    which the tables under Decisions give."""
    rows = a.in_short()
    if not rows:
        return ["- One condition: nothing is compared."]
    ref = f"the baseline {a.baseline}" if a.baseline is not None else "the first condition of each comparison"
    note = " ".join(x for x in (_family_note(a), f"Each effect: its difference and interval in the quantity's units, "
                                f"then a share of {ref}'s value, or a ratio quantity's ratio minus 1 with the ratio's "
                                f"interval; the margins: the tables under Decisions.") if x)
    tail = ([f"Exploratory, not read here (each its own family at {1 - ALPHA:.0%}, in its table under Decisions): "
             f"{', '.join(q.text for q in a.exploratory)}."] if a.exploratory else [])
    lines = [_line(a, p, items) for p, items in rows.items()]
    room = MOST - 1 - len(tail)
    if len(lines) > room:
        lines = lines[:room - 1] + [f"- {len(lines) - room + 1} more comparisons: in the tables under Decisions."]
    return [note, *lines, *tail]


def _outcome(a: ConditionsAnalysis, p: tuple, q: Quantity, d: Decision) -> str:
    if d.outcome == NO_DATA and a.baseline_set_aside and p[1] == a.baseline:
        return "not compared: the baseline's runs were set aside"
    if not d.tested:
        return untested_text(d, q.decimals)
    return d.outcome + needed_text(d)


def _table(a: ConditionsAnalysis, q: Quantity) -> list[str]:
    """A quantity's comparisons: the difference and its interval in its units, the share of the reference, the
    margin, Bonferroni's p, the outcome and each seed's value (outliers marked). Decided on log ratios: the mean
    difference, the ratio's interval and the ratio minus 1 (docs/decisions.md#ratio-quantities). Intervals and
    estimates with the digits the interval needs against 0 and the margin (wording.interval_text). The header's first
    cell names the quantity: a report of many tables repeats no header row."""
    decisions = a.decisions[q.key]
    ratio = any(d.ratio for d in decisions.values())
    per = "per seed (ratio \u2212 1)" if ratio else "per seed"
    rows = [f"| {cell_text(q.text)}, comparison | n | {'mean difference' if ratio else 'difference'} | CI (level) | "
            f"as a share | margin | p (Bonferroni) | outcome | {per} |",
            "|---|---|---|---|---|---|---|---|---|"]
    for p, d in decisions.items():
        diff = fmt_diff(d, q.decimals)
        ci = fmt_ci(d, q.decimals) if d.tested else "n/a"
        share = f"{p[0]}/{p[1]} {_ratio_estimate(d)}" if d.ratio and d.n else _of(a, p, d) or "n/a"
        rows.append(f"| {_pair(p)} | {d.n} | {diff} | {ci} | {share} | {_margin(q, d)} | "
                    f"{fmt_p(d.p_adj)} | {_outcome(a, p, q, d)} | {per_seed_text(d, q.decimals)} |")
    return rows + table_notes(decisions.values())


def _ratio_estimate(d: Decision) -> str:
    """A ratio's estimate, ratio minus 1: at its interval's decimals where it has one (wording.interval_text)."""
    return interval_text(d, 1)[0] if d.tested else f"{d.rel:+.1%}"


def _ratios(a: ConditionsAnalysis) -> str:
    """The ratio rule, naming the quantities it decides ('' where none is compared)."""
    names = [q.text + (" where every value is positive" if compared_on(q.metric) == RATIO_WHERE_POSITIVE else "")
             for q in a.quantities if compared_on(q.metric) != DIFFERENCE]
    return f" {ratio_text(', '.join(names))}." if names else ""


def _family(a: ConditionsAnalysis, q: Quantity) -> str:
    k = a.family_k[q.key]
    if q.key in a.primary:
        return f"Primary: one family with the other primary quantities, k = {k}."
    return f"Exploratory: its own family, k = {k}." if a.primary else ""


def report(a: ConditionsAnalysis) -> str:
    conds = a.conditions
    against = (f"each condition against the baseline {a.baseline}" if a.baseline else "every pair of conditions")
    primary = (f" Its primary quantities, named in the study file: {', '.join(q.text for q in a.stated)}; the others "
               f"are exploratory." if a.primary else "")
    lines = [f"# Conditions compared: {', '.join(conds) or 'none'}", "",
             f"The study compares {against} in {len(a.quantities)} quantities, each taken {fmt_at([a.budget_tokens])} "
             f"(a probed quantity: its mean over layers at the last probe). Values are mean \u00b1 95% confidence "
             f"half width over seeds; n is the number of seeds.{primary}", ""]
    per, shared = _settings(a)
    lines += ["## Conditions", "", "| condition | seeds | what it sets |", "|---|---|---|"]
    for c in conds:
        seeds = ", ".join(str(seed_of(r)) for r in a.runs[c])
        lines.append(f"| {c}{' (baseline)' if c == a.baseline else ''} | {seeds} | {per[c]} |")
    if a.baseline_set_aside:
        lines.append(f"| {a.baseline} (baseline) | none left | every run set aside (What was compared) |")
    if a.baseline in a.conditions and len(conds) > 1:
        lines += ["", f"The baseline's row gives its value of every field that differs between conditions; each other "
                      f"row the fields where its value is not {a.baseline}'s."]
    if shared:
        lines += ["", f"Every run: {shared}."]
    at = fmt_at([a.budget_tokens])
    lines += ["", "## Over training and per layer", "",
              f"Each quantity's mean over layers at every probe, mean over seeds with its 95% band; its last point, "
              f"{at}, is the final value the tables under Decisions compare.", "",
              figure_line("trajectories.png", "each quantity over training, per condition"), "",
              f"Each probed quantity per layer {at}, mean over seeds with its 95% band: its mean over layers is that "
              f"final value.", "",
              figure_line("per_layer.png", f"each probed quantity per layer {at}, per condition")]
    family = ("The primary quantities' tables are one family of k comparisons together; every other table is one "
              "family of its own" if a.primary else None)
    absolute = (f"\u00b1{a.logit_margin:g} logits for the largest attention logit (an absolute margin: it can sit "
                f"near 0)")
    if any(q.margin == "loss_share" for q in a.quantities):
        absolute += (f"; \u00b1{a.kv_loss_margin:g} for a loss change with quantized keys, itself a share of the loss "
                     f"(docs/decisions.md says why)")
    lines += ["", "## Decisions", "",
              f"Procedure (docs/decisions.md): {rule_text(a.margin, a.loss_margin, family=family, absolute=absolute)}."
              + _ratios(a), "",
              "Every comparison's estimate and interval against its margin (grey), in the quantity's units or as a "
              "ratio minus 1: red beyond the margin, blue inside it, dark grey not decided.", "",
              figure_line("comparisons.png", "every comparison's interval against its margin"), ""]
    if any(_format_changes(r) for runs in a.runs.values() for r in runs):
        lines += ["Every key-cache format's loss change (every key in it, after RoPE, a share of the loss) against its "
                  "bytes per key value, per condition: mean over seeds with its 95% interval, the key-cache loss "
                  "margin shaded; each run's fewest bytes within it is its results.json's usable_k_format.", "",
                  figure_line(KV_FORMATS, "loss change against bytes per key value, every format"), ""]
    for q in a.quantities:
        lines += [f"### {q.text}", ""] + ([_family(a, q), ""] if _family(a, q) else [])
        lines += ["| condition | final | n |", "|---|---|---|"]
        lines += [f"| {c} | {_value(a.summary[q.key][c], q.decimals)} | {a.summary[q.key][c]['n']} |" for c in conds]
        if a.decisions[q.key]:
            lines += [""] + _table(a, q)
        lines.append("")
    lines += ["## Provenance", ""]
    lines += [f"- {c}: {provenance_text(a.runs, c)}" for c in conds]
    return "\n".join(lines) + "\n"
