"""Decisions of runs read from anyone's files (qk-decide; research.decide.readers.Run): laid out per metric, condition
and seed, checked (one run per condition and seed, one step), paired by seed and decided by the project's rule
(research.analysis.rules: one family per call, Bonferroni, a margin, five outcomes); Welch's unpaired interval only
where asked (--unpaired) or where no seed is shared. Pure functions, no torch. docs/decide.md says why each choice.

    table = lay_out(runs, metrics)                       # DecideError for duplicates and mixed steps
    rows = decide_runs(table, pairs, margins, primary)   # one Compared per metric and pair
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
from scipy import stats

from research.analysis.rules import (DESCRIPTIVE, DIFFERENCE, LOSS_MARGIN, MARGIN, NO_DATA, RATIO, Decision, Margin,
                                     Paired, compared_on, decide, k_of, outcome_of)
from research.analysis.stats import t_critical
from utils.errors import UserError, shown

# Metrics read against the loss margin (a share of the pair's mean) by default: names that say loss, bits per byte,
# perplexity (case ignored); every other metric against MARGIN, on log ratios where rules.compared_on says so
LOSS_LIKE = re.compile(r"loss|bpb|bits|ppl|perplexity|nll", re.I)
PAIRED, UNPAIRED, DESCRIBED = "paired by seed", "unpaired (Welch)", "described"


class DecideError(UserError, ValueError):
    """Runs that cannot be decided as given (duplicates, mixed steps, a condition or metric not in the files)."""


@dataclass(frozen=True)
class Table:
    """The runs laid out: values[metric][condition][seed] (finite values only), the conditions in the order the files
    name them, each run's step, and one line per value left out (missing or not finite)."""

    values: dict[str, dict[str, dict]]
    conditions: list[str]
    metrics: list[str]
    step: int | None
    left_out: list[str] = field(default_factory=list)


def _seed_text(seed) -> str:
    return "unknown" if seed is None else str(seed)


def lay_out(runs: list, metrics: list[str] | None = None) -> Table:
    """Runs -> Table. DecideError, one line, where two runs have one condition and seed (naming them and where they
    came from), where the runs' steps differ (naming each step's runs), or where a metric asked for is in no run."""
    if not runs:
        raise DecideError("the files hold no runs. Fix: check the files, and --condition/--seed name their columns")
    seen: dict[tuple, str] = {}
    for r in runs:
        key = (r.condition, r.seed)
        if key in seen:
            raise DecideError(f"condition {shown(r.condition)} seed {_seed_text(r.seed)} appears twice ({seen[key]}; "
                              f"{r.source}): nothing is averaged in silently. Fix: keep one run of each, or pass the "
                              f"files of one step")
        seen[key] = r.source
    steps = {r.step for r in runs if r.step is not None}
    if len(steps) > 1:
        by = {s: [f"{r.condition}/{_seed_text(r.seed)}" for r in runs if r.step == s] for s in sorted(steps)}
        said = "; ".join(f"step {s}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
                         for s, names in by.items())
        raise DecideError(f"the runs are at different steps ({said}): runs compared must share a budget. Fix: pass "
                          f"--at_step N, or files of one step")
    conditions = list(dict.fromkeys(r.condition for r in runs))
    names = list(dict.fromkeys(m for r in runs for m in r.values))
    metrics = list(metrics) if metrics else names
    absent = [m for m in metrics if m not in names]
    if absent:
        raise DecideError(f"metric {shown(absent[0])} is in no run (the runs hold {', '.join(names[:8]) or 'none'}). "
                          f"Fix: name one of those with --metric")
    values: dict[str, dict[str, dict]] = {m: {c: {} for c in conditions} for m in metrics}
    left_out = []
    for r in runs:
        for m in metrics:
            v = r.values.get(m, math.nan)
            if isinstance(v, (int, float)) and math.isfinite(v):
                values[m][r.condition][r.seed] = float(v)
            else:
                why = "missing" if m not in r.values or (isinstance(v, float) and math.isnan(v)) else f"{v}"
                left_out.append(f"{m}: condition {r.condition} seed {_seed_text(r.seed)} is {why} ({r.source}): "
                                f"left out of its pairs")
    return Table(values, conditions, metrics, next(iter(steps)) if steps else None, left_out)


def comparison_pairs(conditions: list[str], baseline: str | None = None,
                     compare: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """(a, b) pairs decided as a - b: those --compare names; else each condition against --baseline; else every
    pair in the files' order. DecideError naming a condition the files do not hold."""
    named = [c for pair in (compare or []) for c in pair] + ([baseline] if baseline else [])
    for c in named:
        if c not in conditions:
            raise DecideError(f"condition {shown(c)} is not in the files (they hold {', '.join(conditions)}). Fix: "
                              f"name one of those")
    if compare:
        return [tuple(p) for p in compare]
    if baseline:
        return [(c, baseline) for c in conditions if c != baseline]
    return list(combinations(conditions, 2))


def parse_margins(specs: list[str]) -> dict[str | None, Margin]:
    """--margin specs -> {metric or None (every metric): Margin}: '0.0072' (absolute, in the metric's units), '0.5%'
    (a share of the pair's mean), 'bpb=0.0072' or 'val/loss=1%' for one metric."""
    out: dict[str | None, Margin] = {}
    for spec in specs or []:
        name, _, text = spec.rpartition("=")
        share = text.endswith("%")
        try:
            value = float(text[:-1] if share else text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise DecideError(f"--margin {shown(spec)}: give a positive number (absolute, in the metric's units) or "
                              f"percentage, optionally for one metric: 0.0072, 0.5%, bpb=0.0072")
        out[name or None] = Margin(value / 100, False) if share else Margin(value, True)
    return out


def default_margin(metric: str) -> Margin:
    """The documented default (docs/decide.md): LOSS_MARGIN of the pair's mean for a loss-like name, else MARGIN."""
    return Margin(LOSS_MARGIN if LOSS_LIKE.search(metric) else MARGIN)


def margin_of(metric: str, margins: dict[str | None, Margin]) -> Margin:
    return margins.get(metric) or margins.get(None) or default_margin(metric)


@dataclass(frozen=True)
class Compared:
    """One metric's comparison of conditions a and b: how (PAIRED, UNPAIRED or DESCRIBED), its Decision, the family
    it was decided in, Student's or Welch's t and the one-sided p in the direction of the estimate, the seeds left
    unpaired, and its runs per side."""

    metric: str
    a: str
    b: str
    how: str
    decision: Decision
    family: str
    t: float = math.nan
    p_one_sided: float = math.nan
    unpaired_seeds: tuple = ()
    runs: tuple[int, int] = (0, 0)
    k: int | None = None  # the family's k where it holds comparisons not listed (a QK-norm study's steps difference)


def _on(metric: str, margin: Margin) -> str:
    """Log ratios where rules.compared_on says so and the margin is a share (an absolute margin is in units)."""
    on = compared_on(metric)
    return DIFFERENCE if margin.absolute else on


def welch(a: np.ndarray, b: np.ndarray, margin: Margin, k: int) -> tuple[Decision, float, float]:
    """(Decision, t, one-sided p) of mean(a) - mean(b) from independent samples: Welch's t with Satterthwaite's
    degrees of freedom, the interval at 1 - 0.05 / k, read against the margin in units."""
    ma, mb = float(a.mean()), float(b.mean())
    va, vb = float(a.var(ddof=1)) / a.size, float(b.var(ddof=1)) / b.size
    se = math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1)) if se > 0 else math.inf
    diff, scale = ma - mb, (abs(ma) + abs(mb)) / 2
    level = 1 - 0.05 / max(k, 1)
    half = t_critical(dof, level) * se
    m = margin.of(scale)
    t = diff / se if se > 0 else math.copysign(math.inf, diff)
    p = float(2 * stats.t.sf(abs(t), dof)) if se > 0 else 0.0
    d = Decision(int(a.size + b.size), ma, mb, diff, math.nan, (diff - half, diff + half), level, p, min(1.0, k * p),
                 m, scale, outcome_of(diff - half, diff + half, m), None if margin.absolute else margin.value,
                 note=f"unpaired: Welch's t on {a.size} and {b.size} runs, {dof:.1f} degrees of freedom")
    return d, t, p / 2


def paired_t(d: Decision) -> tuple[float, float]:
    """Student's t of a paired Decision and its one-sided p in the direction of its estimate."""
    if not d.tested or not d.sd:
        return math.nan, math.nan
    t = d.est / (d.sd / math.sqrt(d.n))
    return t, d.p / 2


def decide_runs(table: Table, pairs: list[tuple[str, str]], margins: dict[str | None, Margin] | None = None,
                primary: list[str] | None = None, unpaired: bool = False) -> list[Compared]:
    """Every pair in every metric of the table, decided: the metrics in `primary` (default: all) as ONE family
    (Bonferroni over its comparisons with an interval), each other metric an exploratory family of its own. A pair
    is compared paired on the seeds both conditions have (Paired.of), unpaired by Welch where `unpaired` or where
    they share no seed and each has two or more runs, and described (not decided) with one run a side."""
    margins = margins or {}
    primary = list(primary or table.metrics)
    families = [("primary" if len(primary) < len(table.metrics) else "one family", primary)] + \
        [(f"exploratory: {m}", [m]) for m in table.metrics if m not in primary]
    out = []
    for name, metrics in families:
        members = []  # (metric, pair, how, Paired or (a, b) arrays)
        for m in metrics:
            for a, b in pairs:
                xa, xb = table.values[m][a], table.values[m][b]
                shared = [s for s in xa if s in xb]
                alone = tuple(sorted({s for s in (*xa, *xb) if s not in shared}, key=str))
                if unpaired or (not shared and len(xa) >= 2 and len(xb) >= 2):
                    members.append((m, a, b, UNPAIRED, (np.array(list(xa.values())), np.array(list(xb.values()))),
                                    alone, (len(xa), len(xb))))
                else:
                    c = Paired.of(xa, xb, _on(m, margin_of(m, margins)), (a, b))
                    members.append((m, a, b, PAIRED if c.diffs.size >= 2 else DESCRIBED, c, alone,
                                    (len(xa), len(xb))))
        paired = {i: c for i, (_, _, _, how, c, _, _) in enumerate(members) if how != UNPAIRED}
        k = k_of(paired) + sum(1 for mm in members if mm[3] == UNPAIRED and min(x.size for x in mm[4]) >= 2)
        decided = {}
        for metric in metrics:  # each metric at its own margin, all at the family's k
            sub = {i: c for i, c in paired.items() if members[i][0] == metric}
            if sub:
                decided.update(decide(sub, margin_of(metric, margins), k=k))
        for i, (m, a, b, how, c, alone, runs) in enumerate(members):
            if how == UNPAIRED:
                x, y = c
                if x.size < 2 or y.size < 2:
                    d = _described(x, y)
                    how, t, p1 = DESCRIBED, math.nan, math.nan
                else:
                    d, t, p1 = welch(x, y, margin_of(m, margins), k)
            else:
                d = decided[i]
                t, p1 = paired_t(d)
                how = how if d.outcome not in (DESCRIPTIVE, NO_DATA) else DESCRIBED
            out.append(Compared(m, a, b, how, d, name, t, p1, alone, runs))
    return out


def _described(x: np.ndarray, y: np.ndarray) -> Decision:
    """Too few runs for an interval: the means only, not decided."""
    ma = float(x.mean()) if x.size else math.nan
    mb = float(y.mean()) if y.size else math.nan
    outcome = DESCRIPTIVE if x.size and y.size else NO_DATA
    return Decision(int(min(x.size, y.size)), ma, mb, ma - mb, math.nan, (math.nan, math.nan), math.nan, math.nan,
                    math.nan, math.nan, (abs(ma) + abs(mb)) / 2, outcome)


def family_sizes(rows: list[Compared]) -> dict[str, int]:
    """{family: its k}: comparisons with an interval (paired or Welch) in each family."""
    out: dict[str, int] = {}
    for r in rows:
        out.setdefault(r.family, 0)
        out[r.family] += r.decision.tested
    out.update({r.family: r.k for r in rows if r.k is not None})
    return out


__all__ = ["Compared", "DecideError", "DESCRIBED", "PAIRED", "RATIO", "Table", "UNPAIRED", "comparison_pairs",
           "decide_runs", "default_margin", "family_sizes", "lay_out", "margin_of", "parse_margins", "welch"]
