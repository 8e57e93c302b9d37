"""Studies that add seeds until their question is decided: --until_decided MAX and --round R, the looks of a study and
their record in study.json (research.analysis.sequential decides them; research.plots.looks reports them).

    rounds = Rounds(runs, train, write_index, family)  # the study's runs of some seeds, their training, its index,
                                                       # what defines its families (family_record)
    run_looks(out, seeds, until, rounds)           # the looks, from what study.json already records (a resume)

The design (the looks, their alpha, the families' definition) is fixed at the first command and stored in study.json;
a later command that changes it is refused. docs/studies.md, "Adding seeds until decided", and docs/decisions.md.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from configs.config import SEED_LIMIT, ConfigError
from research.analysis.rules import ALPHA
from research.analysis.sequential import (FIRST_SHARE, RHO, Design, Look, family_changes, fixed_family, plan, recorded,
                                          undecided, value_text)
from research.plots.looks import bound_text, options_text, seeds_text
from research.results.layout import read_study_index
from research.studies.executors import results_paths
from research.studies.kinds import Kind
from research.studies.render import decide_study
from research.studies.study_runs import StudyRun

ROUND = 2  # --round's default: seeds added per round (plan(4, 8, 2) looks at 4, 6 and 8 seeds)


def add_until_args(p: argparse.ArgumentParser) -> None:
    """--until_decided MAX and --round R (checked by check_until)."""
    p.add_argument("--until_decided", type=int, metavar="MAX",
                   help="Add seeds in rounds while a primary comparison of the study is undecided, up to MAX seeds "
                        "in all: every look is decided at the share of the 5%% error level the design planned at the "
                        "study's first command, so the report's error bound holds whenever it stops "
                        "(docs/studies.md). Default: no rounds, the --seeds alone")
    p.add_argument("--round", type=int, metavar="R",
                   help=f"Seeds added per round of --until_decided (the next integers after the largest seed). "
                        f"Default: {ROUND}")


@dataclass(frozen=True)
class Until:
    """--until_decided MAX --round R, checked."""

    max_seeds: int
    round: int

    def record(self, seeds: list[int]) -> dict:
        """The design study.json stores at the study's first command."""
        return {"seeds": list(seeds), "max_seeds": self.max_seeds, "round": self.round, "alpha": ALPHA,
                "first": FIRST_SHARE, "rho": RHO, "calibrated": True}


def check_until(args: argparse.Namespace, kind: Kind, seeds: list[int], study: str,
                named_primary: tuple = ()) -> Until | None:
    """The options, refused in one line before anything trains: a kind with nothing to decide (or the spike study),
    a study file with no primary quantities, a round below 1, fewer than 2 seeds at the first look, a MAX below the
    seeds given. None without --until_decided."""
    if args.until_decided is None:
        if args.round is not None:
            raise ConfigError(f"--round {args.round} sets the seeds each round of --until_decided adds: add "
                              f"--until_decided MAX, or leave --round out (nothing was trained)")
        return None
    fix = "leave --until_decided out to train the --seeds alone (nothing was trained)"
    if kind.primary is None:
        why = kind.no_primary or f"a study of kind {kind.name} names no primary comparison to decide"
        raise ConfigError(f"--until_decided: {study}: {why}; {fix}")
    if kind.named_primary and not named_primary:
        raise ConfigError(f"--until_decided: {study} names no primary quantities to decide: add `primary: [...]` to "
                          f"the study file (docs/study_files.md), or {fix}")
    r = ROUND if args.round is None else args.round
    if r < 1:
        raise ConfigError(f"--round {r}: give 1 or more seeds per round (nothing was trained)")
    if len(seeds) < 2:
        raise ConfigError(f"--until_decided needs at least 2 --seeds at its first look (an interval needs two), "
                          f"found {len(seeds)}: give e.g. --seeds 0 1 2 3 (nothing was trained)")
    if args.until_decided < len(seeds):
        raise ConfigError(f"--until_decided {args.until_decided} is below the {len(seeds)} seeds given (--seeds "
                          f"{' '.join(map(str, seeds))}): give a MAX of at least {len(seeds)}, or fewer --seeds "
                          f"(nothing was trained)")
    last = max(seeds) + args.until_decided - len(seeds)  # the seeds added after the largest given (next_seeds)
    if last >= SEED_LIMIT:
        below = SEED_LIMIT - (last - max(seeds))
        raise ConfigError(f"--until_decided {args.until_decided} would add seeds up to {last}, past the largest a run "
                          f"takes ({SEED_LIMIT - 1}, 2**63 - 1): give --seeds below {below}, or a smaller MAX "
                          f"(nothing was trained)")
    return Until(args.until_decided, r)


def start(index: dict, seeds: list[int], until: Until | None, out: Path,
          family: dict) -> tuple[list[Look], Design | None, list]:
    """(the looks study.json records, the design, the seeds of this command's first look), or ConfigError in one line
    where the command does not continue the study in `out`: another design, one whose `family` (what defines the
    study's families and outcomes: sequential.FAMILY) differs from what the design fixed, a design where none was
    fixed at the study's first command, or none where one was. A study.json whose looks disagree with its design or
    its runs is refused as edited (sequential.recorded)."""
    looks, design = recorded(index)
    fix = "choose another --out (nothing was trained)"
    if design is not None:
        options = {k: v for k, v in index["design"].items() if k != "family"}
        if until is None or until.record(seeds) != options:
            given = "" if until is None else f", not {options_text(until.record(seeds))}"
            raise ConfigError(f"{out} holds a study planned with {options_text(index['design'])} at its first "
                              f"command{given}: give those "
                              f"options to continue it (python research/split_panels.py {out} redraws it), or {fix}")
        changes = family_changes(fixed_family(index), family)
        if changes:
            key, fixed, now = changes[0]
            raise ConfigError(f"{out}: the study's design fixed {key} {value_text(fixed)} at its first command, not "
                              f"{value_text(now)}. Fix: give {key} {value_text(fixed)} again to continue it, or {fix}")
        return looks, design, list(looks[-1].seeds) if looks else list(seeds)
    if until is not None and index:
        raise ConfigError(f"--until_decided: {out} holds a study of fixed seeds ({seeds_text(index['seeds'] or [])}): "
                          f"a sequential design is fixed at a study's first command; leave --until_decided out (a look "
                          f"taken by hand, its error bound stated), or {fix}")
    return looks, (None if until is None else plan(len(seeds), until.max_seeds, until.round)), list(seeds)


def with_look(looks: list[Look], seeds: list[int], design: Design | None) -> list[Look]:
    """`looks` with the look at `seeds` appended, once: a look the design planned at its level; without a design the
    study's first look at the full level (planned: one look, the fixed design), any later one at the full level
    too, unplanned."""
    if looks and sorted(looks[-1].seeds) == sorted(seeds):
        return looks
    if design is not None:
        return [*looks, Look(tuple(seeds), design.level(len(looks)), True)]
    return [*looks, Look(tuple(seeds), ALPHA, not looks)]


def next_seeds(seeds: list[int], design: Design, j: int) -> list[int]:
    """The seeds of look j + 1: `seeds` and the next integers after the largest, up to the seeds that look plans."""
    return [*seeds, *range(max(seeds) + 1, max(seeds) + 1 + design.looks[j + 1] - len(seeds))]


@dataclass(frozen=True)
class Rounds:
    """What a study gives the looks: its runs of some seeds, their training (one round's runs handed to its executor
    together), and its study.json written with the seeds, their results files, the looks and the design."""

    runs: Callable[[list[int]], list[StudyRun]]
    # train(runs, done): the runs of a look; `done`, the folders of those this command trained at its earlier looks,
    # kept as they are (the executor's `finished`), so that a round hands its executor only its new runs
    train: Callable[[list[StudyRun], set], None]
    write_index: Callable[[list[int], dict, list[dict], dict | None], None]
    # what defines its families and their outcomes, as its study.json gives them (sequential.family_record: its
    # conditions, baseline, primary quantities and margins): a design fixes it at the study's first command
    family: dict


def primary_of(out: Path) -> dict:
    """{label: Decision} of the study's primary comparisons, decided at the looks its study.json records."""
    kind, _, _, analysis = decide_study(out, read_study_index(out))
    return kind.primary(analysis) if kind.primary else {}


def run_looks(out: Path, seeds: list[int], until: Until | None, rounds: Rounds, log=print) -> list[Look]:
    """Train and decide look after look (one look without --until_decided), from what study.json records in `out`;
    returns the looks. Every look is recorded once, after its runs trained: a study killed inside or between looks
    continues with the same command, its finished runs kept."""
    index = read_study_index(out)
    looks, design, seeds = start(index, seeds, until, out, rounds.family)
    record = index.get("design") or ({**until.record(seeds), "family": rounds.family} if until else None)
    if design is not None and not index:  # the design is fixed at the study's first command, before anything trains
        rounds.write_index(seeds, results_paths(rounds.runs(seeds), out), [], record)
    done: set = set()  # the run folders trained (or found finished) at this command's earlier looks
    while True:
        runs = rounds.runs(seeds)
        rounds.train(runs, set(done))
        done |= {run.run_dir for run in runs}
        looks = with_look(looks, seeds, design)
        rounds.write_index(seeds, results_paths(runs, out), [asdict(look) for look in looks], record)
        if design is None:
            if not looks[-1].planned:
                log(f"look {len(looks)} ({len(seeds)} seeds) was taken by hand, at the full level: "
                    f"{bound_text(looks, None)}", flush=True)
            return looks
        open_ = undecided(primary_of(out))
        at = (f"look {len(looks)} of at most {len(design.looks)} ({len(seeds)} seeds: {seeds_text(seeds)}, alpha "
              f"{looks[-1].alpha:.5g})")
        if not open_:
            log(f"{at}: every primary comparison is decided: stopping", flush=True)
            return looks
        if len(seeds) >= design.looks[-1]:
            log(f"{at}: --until_decided {design.looks[-1]} reached with primary comparison(s) undecided: "
                f"{', '.join(open_)}: stopping", flush=True)
            return looks
        seeds = next_seeds(seeds, design, len(looks) - 1)
        log(f"{at}: undecided: {', '.join(open_)}; the next round trains seed(s) "
            f"{' '.join(map(str, seeds[len(looks[-1].seeds):]))}", flush=True)


def rounds_text(design: Design, runs_per_seed: int, run_s: list[float]) -> str:
    """What --plan says of the rounds: the looks, each round's runs, and the worst case (every round trained), in
    minutes where finished runs of the study in its folder time one run (`run_s`: their wall times)."""
    counts = [design.looks[0], *(b - a for a, b in zip(design.looks, design.looks[1:]))]
    rounds = "; ".join(f"round {j} trains {n * runs_per_seed} runs ({n} seed(s))" for j, n in enumerate(counts, 1))
    total = design.looks[-1] * runs_per_seed
    worst = (f"{total * sum(run_s) / len(run_s) / 60:.0f} minutes one run at a time, at {sum(run_s) / len(run_s):.0f} "
             f"s per run (the mean of the {len(run_s)} finished run(s) in the study's folder)" if run_s else
             f"{design.looks[-1] / design.looks[0]:.1f} times the first round's wall time (no finished run in the "
             f"study's folder to time one run by)")
    return (f"until decided: looks at {', '.join(map(str, design.looks))} seeds; {rounds}. Worst case (every round "
            f"trained): {total} runs, {worst}")
