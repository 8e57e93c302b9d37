"""A report's "In short": the section every study kind's report opens with, the answer before the tables.

At most MOST lines, each one primary question of the kind with its outcome word, the effect and its interval in units
a reader uses, and the family it was decided in (short_line); a kind that decides nothing gives its main measured
numbers instead. Then, where the report leaves an outcome open (marked wording.OPEN in its tables and sentences), the
one line on what would settle it (wording.settle_line): said there once, so that no table or verdict repeats it.
research.studies.render places the section under the report's title, for every kind alike (Kind.in_short).
"""
from __future__ import annotations

from research.analysis.rules import DESCRIPTIVE, Decision
from research.analysis.wording import OPEN, effect_text, needed_text, plural, untested_text

TITLE = "In short"
MOST = 12  # lines of "In short" at most: one screen


def outcome_words(d: Decision, unit: str = "seed") -> str:
    """The outcome word in bold, OPEN-marked where left open; why not tested, where not ('**no spread**: every seed
    differs by exactly +0.000', '**no paired values** (no seed with both values)'); one `unit`'s value, descriptive,
    has its reason in its effect (short_line)."""
    if not d.tested:
        if not d.outcome:
            return "**not tested**"
        why = untested_text(d, unit=unit)
        if d.outcome == DESCRIPTIVE or not why:
            return f"**{d.outcome}**"
        return f"**{d.outcome}**{why.removeprefix(d.outcome)}" if why.startswith(d.outcome) else \
            f"**{d.outcome}** ({why})"
    return f"**{d.outcome}**{needed_text(d, unit)}"


def short_line(question: str, d: Decision, family: str, unit: str = "seed", of: float | None = None,
               first: bool = False) -> str:
    """'- question: **different, size unresolved**‡ -4.8% [-7.2%, -2.3%] (family)': one primary comparison, its
    effect as effect_text prints it (shares of the compared values' mean, or the ratio minus 1 of one decided on log
    ratios; `of`/`first` as effect_text takes them)."""
    effect = effect_text(d, unit, of, first) if d.tested or d.outcome == DESCRIPTIVE else ""
    return f"- {question}: {outcome_words(d, unit)}" + (f" {effect}" if effect else "") + f" ({family})"


def family_text(name: str, decisions, unit: str = "seed") -> str:
    """'key PR family, k = 3, 98.3% each, 2 seeds': the family a line's comparisons were decided in, its k tested
    comparisons at their Bonferroni level, and how many of `unit` they rest on ('not tested' where none was)."""
    decisions = list(decisions)
    tested = [d for d in decisions if d.tested]
    ns = sorted({d.n for d in tested or decisions})
    n = "" if not ns else f", {ns[0]} {unit if ns[-1] == 1 else plural(unit)}" if len(ns) == 1 else \
        f", {ns[0]} to {ns[-1]} {plural(unit)}"
    if not tested:
        return f"{name}, not tested{n}"
    return f"{name}, k = {len(tested)}, {tested[0].ci_level:.1%}" + (" each" if len(tested) > 1 else "") + n


def section(lines: list[str], report: str, settle: str) -> str:
    """The "In short" section of `report`: its lines (at most MOST), then `settle` where the report or the lines mark
    an outcome open."""
    lines = [line for line in lines if line.strip()]
    if len(lines) > MOST:
        raise ValueError(f"In short holds {len(lines)} lines, at most {MOST}: {lines}")
    text = "\n".join(lines)
    marked = OPEN in report or OPEN in text
    return f"## {TITLE}\n\n{text}" + (f"\n\n{settle}" if marked else "")


ABOUT = "## About this study"  # the heading of a report's opening paragraph, once "In short" stands above it


def with_in_short(report: str, lines: list[str], settle: str) -> str:
    """`report` with its "In short" (section) right under its title; an opening paragraph that followed the title
    gets a heading of its own (ABOUT), so that "In short" ends where the answer does."""
    title, _, rest = report.partition("\n\n")
    short = section(lines, report, settle)
    if rest and not rest.startswith("#"):
        rest = f"{ABOUT}\n\n{rest}"
    return f"{title}\n\n{short}\n\n{rest}" if rest else f"{title}\n\n{short}\n"


def decided_part(what: str, d: Decision, unit: str = "seed") -> str:
    """'early 11.1 -> 9.05: **different, beyond the margin** -18.7% [-30.3%, -5.1%]': one comparison as a part of a line
    that states several (a layer group's, a metric's), its effect as effect_text prints it; untested, why, in
    untested_text's words without the outcome said twice ('**no spread** (every batch has the same ratio, +0.0%)')."""
    if not d.tested:
        why = untested_text(d, unit=unit).removeprefix(f"{d.outcome}: ")
        return f"{what}: **{d.outcome}**" + (f" ({why})" if why and why != d.outcome else "")
    return f"{what}: {outcome_words(d, unit)} {effect_text(d, unit)}"
