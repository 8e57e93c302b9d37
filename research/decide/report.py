"""qk-decide's report: "In short" first (research.plots.in_short, as every study's report), one line per comparison
of the family, its outcome, the estimate and interval in the metric's units (a ratio's as the ratio minus 1) and the
family it was decided in; then a table per family, the values left out and what was not decided. And the JSON
record (research.results.file_formats.DECIDE).

    text = report(rows, table, notes)      # markdown
    record = json_record(rows, table, ...)
"""
from __future__ import annotations

import math

from research.analysis.rules import RATIO
from research.analysis.wording import OPEN, interval_text, settle_line
from research.analysis.runs import UNPAIRED, Compared, Table, family_sizes
from research.plots.common import cell_text, fmt_p
from research.plots.in_short import MOST, family_text, outcome_words, section

TITLE = "# qk-decide"


def decimals(c: Compared) -> int:
    """Decimals that show about three significant digits of the interval: of its half width or its nearest end to 0,
    whichever is smaller (a mean alone: of the means' difference)."""
    d = c.decision
    sizes = [abs(x) for x in ((d.ci[1] - d.ci[0]) / 2, *d.ci) if math.isfinite(x) and x != 0] if d.tested else \
        [abs(d.diff)] if math.isfinite(d.diff) and d.diff else []
    if not sizes:
        return 3
    return int(min(8, max(1, 2 - math.floor(math.log10(min(sizes))))))


def effect(c: Compared) -> str:
    """'-0.000759 [-0.000988, -0.000529]' in the metric's units, or on log ratios 'ratio -4.9% [-8.1%, -1.6%]';
    untested, the difference of the means."""
    d = c.decision
    if not d.tested:
        return f"{d.diff:+.{decimals(c)}f}" if math.isfinite(d.diff) else "n/a"
    est, ci = interval_text(d, decimals(c))
    return f"{'ratio ' if d.on == RATIO else ''}{est} {ci}"


def line(c: Compared, k: dict[str, int]) -> str:
    """One In short line: '- bpb, pr1925 − pr1855: **different, within the margin** -0.000759 [...] (one family,
    k = 1, 95.0%, 3 seeds, paired by seed)'."""
    d = c.decision
    what = f"{c.metric}, {c.a} \u2212 {c.b}"
    unit = "run" if c.how == UNPAIRED else "seed"
    fam = family_text(c.family, [d], unit).replace(f"{c.family}, k = 1", f"{c.family}, k = {k[c.family]}")
    return f"- {what}: {outcome_words(d, unit)} {effect(c)} ({fam}, {c.how})"


def _row(c: Compared) -> str:
    d = c.decision
    margin = "n/a" if not math.isfinite(d.margin) else \
        (f"\u00b1{d.share:.1%} of the mean" + (" (log ratio)" if d.on == RATIO else "") if d.share is not None
         else f"\u00b1{d.margin:g}")
    level = f" ({d.ci_level:.1%})" if d.tested else ""
    cells = [c.metric, f"{c.a} \u2212 {c.b}", c.how, f"{c.runs[0]} / {c.runs[1]}", str(d.n),
             f"{d.mean_a:.{decimals(c) + 1}g}" if math.isfinite(d.mean_a) else "n/a",
             f"{d.mean_b:.{decimals(c) + 1}g}" if math.isfinite(d.mean_b) else "n/a",
             effect(c) + level, margin, f"**{d.outcome}**", fmt_p(c.p_one_sided),
             f"{c.t:.3g}" if math.isfinite(c.t) else "n/a"]
    return "| " + " | ".join(cell_text(x) for x in cells) + " |"


HEADER = ("| metric | comparison | how | runs (A / B) | n | mean A | mean B | difference [interval] (level) | margin | "
          "outcome | p (one-sided) | t |\n|" + "---|" * 12)


def report(rows: list[Compared], table: Table, notes: list[str], sources: list[str], looks: str = "") -> str:
    """The report in markdown: In short (the stated family's comparisons, at most MOST lines), the rule, a table per
    family, what was left out and why."""
    k = family_sizes(rows)
    stated = [r for r in rows if not r.family.startswith("exploratory")]
    lines = [line(r, k) for r in stated[:MOST]]
    if len(stated) > MOST:
        lines[-1] = f"- ... and {len(stated) - MOST + 1} more comparisons of the family: the table below"
    explo = sorted({r.family for r in rows if r.family.startswith("exploratory")})
    body = [f"{TITLE}\n\nRuns from {', '.join(sources)}: {len(table.conditions)} conditions "
            f"({', '.join(table.conditions)}), metrics {', '.join(table.metrics)}"
            + (f", at step {table.step}" if table.step is not None else "") + "."]
    rule = ("Each comparison is paired by seed (the per-seed differences A \u2212 B, or log ratios ln(A/B) of a "
            "positive ratio quantity) and decided from one Student-t interval at 1 \u2212 0.05/k, k the comparisons "
            "of its family with an interval (Bonferroni), read against its margin: equal, different within the "
            "margin, different beyond it, different of unresolved size, or inconclusive (docs/decisions.md). "
            "Unpaired comparisons (Welch) are labelled so; one run a side is described, not decided.")
    if explo:
        rule += f" Exploratory families (one per metric, not stated above): {len(explo)}."
    body.append(f"## How it was decided\n\n{rule}" + (f"\n\n{looks}" if looks else ""))
    for fam in dict.fromkeys(r.family for r in rows):
        body.append(f"## {fam[0].upper()}{fam[1:]} (k = {k[fam]})\n\n{HEADER}\n"
                    + "\n".join(_row(r) for r in rows if r.family == fam))
    unpaired = [f"- {r.metric}, {r.a} \u2212 {r.b}: seed(s) {', '.join(map(str, r.unpaired_seeds))} in one "
                f"condition only, left out of the pairs" for r in rows if r.unpaired_seeds and r.how != UNPAIRED]
    if notes or unpaired or table.left_out:
        body.append("## Left out\n\n" + "\n".join([*(f"- {n}" for n in (*table.left_out, *notes)), *unpaired]))
    text = "\n\n".join(body) + "\n"
    settle = settle_line() if any(OPEN in x for x in lines) else ""
    title, _, rest = text.partition("\n\n")
    return f"{title}\n\n{section(lines, text, settle)}\n\n{rest}"


def json_record(rows: list[Compared], table: Table, sources: list[str], family: dict, notes: list[str],
                looks: list | None = None) -> dict:
    """What --json writes (research.results.file_formats.DECIDE)."""
    k = family_sizes(rows)

    def num(x):
        return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None
    out = []
    for r in rows:
        d = r.decision
        out.append({"metric": r.metric, "a": r.a, "b": r.b, "how": r.how, "family": r.family, "k": k[r.family],
                    "n": d.n, "runs": list(r.runs), "mean_a": num(d.mean_a), "mean_b": num(d.mean_b),
                    "difference": num(d.diff), "on": d.on, "estimate": num(d.est),
                    "ci": [num(d.ci[0]), num(d.ci[1])], "ci_level": num(d.ci_level), "margin": num(d.margin),
                    "margin_share": d.share, "outcome": d.outcome, "t": num(r.t), "p": num(d.p),
                    "p_one_sided": num(r.p_one_sided),
                    "seeds": None if d.seeds is None else [s for s in d.seeds],
                    "unpaired_seeds": list(r.unpaired_seeds), "note": d.note})
    return {"tool": "qk-decide", "sources": sources, "conditions": table.conditions, "metrics": table.metrics,
            "step": table.step, "family": family, "comparisons": out, "left_out": [*table.left_out, *notes],
            "looks": looks}


__all__ = ["json_record", "line", "report"]
