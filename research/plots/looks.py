"""The report's section on a study's looks: the seeds each analysed, the level it spent, why the study stopped and
the error bound that holds (research.analysis.sequential). A study of fixed seeds, decided at one look at the full
level, has no such section: its report is what it always was.
"""
from __future__ import annotations

from research.analysis.rules import ALPHA
from research.analysis.wording import both_text
from research.analysis.sequential import Design, Look, error_bound, looks_of, one_full_look, undecided

# The command of a catalog kind whose report names how its open questions would be answered (the README's first
# command's kind): a new study on new seeds planned with --until_decided from its start, into a new folder.
PLANNED_COMMANDS = {"qk_norm": "python research/qk_norm_25m_study.py"}
NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def seeds_text(seeds) -> str:
    """'0 1 2 3' of a look's seeds, shortened to a range where they run on: '0\u20137'."""
    seeds = sorted(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}\u2013{seeds[-1]}"
    return " ".join(map(str, seeds))


def options_text(record: dict) -> str:
    """The options that planned a design (study.json's `design`), as a command gives them."""
    seeds = " ".join(map(str, record["seeds"]))
    return f"--until_decided {record['max_seeds']} --round {record['round']} --seeds {seeds}"


def bound_text(looks: list[Look], design: Design | None) -> str:
    """The error bound over the looks, in a sentence: 'two looks at 5% each: the chance that some outcome of a family
    is wrong is at most 10%'."""
    bound = error_bound(looks, design)
    if design is None or not all(look.planned for look in looks):
        alphas = {look.alpha for look in looks}
        n = NUMBERS.get(len(looks), str(len(looks)))
        spent = (f"{n} looks at {looks[0].alpha:.0%} each" if len(alphas) == 1 else
                 f"{n} looks spending " + " + ".join(f"{look.alpha:.4g}" for look in looks))
        return f"{spent}: the chance that some outcome of a family is wrong is at most {bound:.0%}"
    return (f"the looks spend at most {design.alpha:.0%} in all, whenever the study stops: the chance that some "
            f"outcome of a family is wrong is at most {bound:.0%}")


def spending_text(design: Design) -> str:
    """How a design spends its alpha over the looks, and how its intervals are set, in words."""
    a, n0, n = f"{design.alpha:.0%}", design.looks[0], design.looks[-1]
    if design.first is None:
        how = f"spending \u03b1 = {a} as {a} \u00d7 (n/{n})^{design.rho:g} by the look at n seeds"
    else:
        power = "" if design.rho == 1 else f"^{design.rho:g}"
        how = (f"spending \u03b1 = {a}: {design.first:.0%} of it by the first look, then the rest in proportion to "
               f"the seeds added since ({a} \u00d7 ({design.first:g} + {1 - design.first:g} \u00d7 "
               f"((n \u2212 {n0})/{n - n0}){power}) by the look at n seeds)")
    return how + ("; each look's intervals at the level that spends exactly that, calibrated to the looks' shared "
                  "seeds (docs/decisions.md)" if design.calibrated else "; each look's intervals at its own share")


def stop_text(looks: list[Look], design: Design, primary: dict) -> str:
    """Why the study stopped at its last look, or that it has not."""
    open_ = undecided(primary)
    at = f"look {len(looks)} of at most {len(design.looks)} ({len(looks[-1].seeds)} seeds)"
    if not open_:
        return f"Stopped at {at}: every primary comparison is decided."
    which = ", ".join(open_)
    if len(looks[-1].seeds) >= design.looks[-1]:
        return f"Stopped at {at}, the most seeds the design allows, with primary comparison(s) undecided: {which}."
    return f"Not finished at {at}: undecided: {which}; the same command continues the study."


def section(looks: list[Look], design: Design | None, primary: dict, record: dict | None = None) -> str:
    """The report's "Looks" section ('' for a study decided at one look at the full level with no design): the looks,
    the design and the options that planned it (`record`, study.json's `design`), why the study stopped (`primary`:
    its primary comparisons, {label: Decision}) and the bound that holds."""
    if design is None and one_full_look(looks):
        return ""
    planned = "" if design is None else (", ".join(map(str, design.looks[:-1])) + " and " * (len(design.looks) > 1)
                                         + str(design.looks[-1]))
    head = ("The seeds were added in rounds while a primary comparison was undecided "
            f"({options_text(record)}, planned at the study's first command): looks planned at {planned} seeds, "
            f"{spending_text(design)}."
            if design else
            "The study was grown by hand (the same command run again with other --seeds, with no sequential design "
            "fixed at its start): every look is decided at the full level, and the levels spent add up.")
    rows = [f"| {j} | {seeds_text(look.seeds)} ({len(look.seeds)}) | {look.alpha:.5g} | "
            f"{'yes' if look.planned else 'no'} |" for j, look in enumerate(looks, 1)]
    tail = [("Every outcome in this report is read off the intersection of its intervals over the looks, each at its "
             f"look's level (docs/decisions.md); {bound_text(looks, design)}.")]
    if design:
        tail.append(stop_text(looks, design, primary))
    return "\n".join(["## Looks", "", head, "", "| look | seeds | \u03b1 spent | planned |", "|---|---|---|---|",
                      *rows, "", *tail]) + "\n"


def open_questions(kind: str, index: dict, primary: dict) -> str:
    """The closing section of a fixed study's report (one look at the full level, no design) whose primary comparisons
    are not all decided: which are open, and the exact command that would answer them: a new study on as many new
    seeds (the integers after this study's largest, so that no run of it is trained again), planned from its start
    with --until_decided at twice that many, in a new folder; and the error a reader of both reports then faces, the
    two studies' levels added (wording.both_text; docs/decisions.md measures it). '' for a kind without a planned
    command (PLANNED_COMMANDS), a study with a design or several looks, or nothing open."""
    open_ = undecided(primary)
    command = PLANNED_COMMANDS.get(kind)
    if not open_ or command is None or index.get("design") or not one_full_look(looks_of(index)):
        return ""
    seeds = sorted(index.get("seeds") or [])
    if len(seeds) < 2:
        return ""
    most = 2 * len(seeds)
    new = list(range(seeds[-1] + 1, seeds[-1] + 1 + len(seeds)))
    preset = f" --preset {index['preset']}" if index.get("preset") else ""
    folder = f"research_results/{index.get('study', 'study')}_new_seeds_until{most}"
    return "\n".join([
        "## Answering the open questions", "",
        f"Primary comparisons not decided at these {len(seeds)} seeds: {', '.join(open_)}. More seeds added to this "
        "folder would be a look nobody planned (docs/decisions.md#sequential-studies). A new study on new seeds "
        f"({seeds_text(new)}, then the next integers; no run of this one trained again), planned from its start, adds "
        f"seeds in rounds while one is open, up to {most} in all, its own outcomes under one {ALPHA:.0%} error bound; "
        f"{both_text(error_bound(looks_of(index)), 'this report')} (docs/decisions.md#a-reader-of-both-reports):", "",
        f"    {command}{preset} --seeds {' '.join(map(str, new))} --until_decided {most} --out {folder}",
    ]) + "\n"
