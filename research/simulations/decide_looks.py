"""qk-decide's looks, measured by simulation (docs/decide.md, "Planning looks"): studies of two conditions whose runs
come from elsewhere (seeds with arbitrary names), read at 3 seeds and then after every 2 more up to 9, stopping at
the first look where every comparison is decided. Each is decided the way qk-decide decides it: the runs laid out
(research.analysis.runs.lay_out) and decided by decide_runs, at the design's calibrated looks
(research.analysis.sequential.at_looks), or, as a reader who reran the command at each look without a design would,
each look afresh at 5%. Printed: the share of studies in which some outcome is wrong, per truth.

    python -m research.simulations.decide_looks --studies 2000
"""
from __future__ import annotations

import sys
import time
from argparse import RawDescriptionHelpFormatter

from utils.cli import ArgumentParser, command, positive_int

from collections import namedtuple

import numpy as np

from research.analysis.rules import ALPHA, Margin
from research.analysis.sequential import FIRST_SHARE, RHO, Look, at_looks, plan, undecided
from research.analysis.runs import decide_runs, lay_out
from research.simulations.sequential import wrong

Run = namedtuple("Run", "condition seed values step source")  # what lay_out reads of a run (readers.Run's fields)
FIRST, MAX, ROUND = 3, 9, 2  # looks at 3, 5, 7 and 9 seeds
METRICS = ("bpb", "val_loss")  # one family of two comparisons (k = 2)
MARGIN = 1.0  # absolute, in sd of one seed's paired difference
TRUTHS = {"0": 0.0, "margin, inside": 0.98 * MARGIN, "margin, outside": 1.02 * MARGIN, "margin + 2 sd": MARGIN + 2}
WAYS = ("design", "each look at 5%")
BOUND = ALPHA  # what the design promises: some outcome wrong in at most 5% of studies


def study(rng: np.random.Generator, truth: float, way: str) -> tuple[bool, int]:
    """(some outcome wrong at the look the study stopped at, seeds used) of one simulated study."""
    design = plan(FIRST, MAX, ROUND, ALPHA, RHO, FIRST_SHARE, True)
    names = [f"s{int(x)}" for x in rng.choice(10_000, MAX, replace=False)]  # seeds named as elsewhere
    base = rng.standard_normal((MAX, len(METRICS)))
    diff = truth + rng.standard_normal((MAX, len(METRICS)))
    looks: list[Look] = []
    for j, n in enumerate(design.looks):
        runs = [Run(c, names[i], {m: float(base[i, q] + (diff[i, q] if c == "a" else 0.0)) + 100.0
                                  for q, m in enumerate(METRICS)}, None, "sim") for c in "ab" for i in range(n)]
        table = lay_out(runs)
        looks.append(Look(tuple(names[:n]), design.level(j) if way == "design" else ALPHA, way == "design"))
        if way == "design":
            with at_looks(looks, design):
                rows = decide_runs(table, [("a", "b")], {None: Margin(MARGIN, True)})
        else:
            rows = decide_runs(table, [("a", "b")], {None: Margin(MARGIN, True)})
        decided = {r.metric: r.decision for r in rows}
        if not undecided(decided) or n == design.looks[-1]:
            return any(wrong(d, truth) for d in decided.values()), n
    raise AssertionError("a design ends at its last look")


def rates(studies: int, seed: int = 0) -> dict:
    """{(truth, way): (wrong share, its standard error, mean seeds)}."""
    out = {}
    for t, (name, truth) in enumerate(TRUTHS.items()):
        for w, way in enumerate(WAYS):
            rng = np.random.default_rng([seed, t, w])
            got = [study(rng, truth, way) for _ in range(studies)]
            p = float(np.mean([g[0] for g in got]))
            out[(name, way)] = (p, float(np.sqrt(p * (1 - p) / studies)), float(np.mean([g[1] for g in got])))
    return out


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__, formatter_class=RawDescriptionHelpFormatter)
    p.add_argument("--studies", type=positive_int, default=2000, help="Simulated studies per truth and way. "
                                                                              "Default: %(default)s")
    p.add_argument("--seed", type=int, default=0, help="Seed of the random draws. Default: %(default)s")
    return p


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start = time.time()
    got = rates(args.studies, args.seed)
    print(f"qk-decide looks at {FIRST} to {MAX} seeds by {ROUND}, one family of {len(METRICS)} comparisons, margin "
          f"{MARGIN:g} sd, {args.studies} studies per row (seed {args.seed})")
    print("| truth | decided | some outcome wrong | mean seeds |\n|---|---|---|---|")
    for (truth, way), (p, se, n) in got.items():
        print(f"| {truth} | {way} | {p:.2%} \u00b1 {se:.2%} | {n:.2f} |")
    worst = max(p for (_, way), (p, _, _) in got.items() if way == "design")
    print(f"design: worst {worst:.2%}, bound {BOUND:.0%}: {'met' if worst <= BOUND else 'NOT met'}; "
          f"{time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
