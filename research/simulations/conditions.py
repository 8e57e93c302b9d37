"""Error rates of the conditions kind's "In short", measured by simulation (docs/decisions.md, "Studies of any
conditions").

    python -m research.simulations.conditions --studies 4000 --seed 0
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from utils.cli import ArgumentParser, command

import numpy as np

from research.analysis.conditions import (BEYOND, INSIDE, LOGIT_MARGIN, QUANTITIES, REAL, ConditionRuns,
                                          ConditionsAnalysis, analyze, quantity_margin, reading)
from research.analysis.rules import ALPHA, LOSS_MARGIN, MARGIN

CONDITIONS = ("base", "B", "C", "D")  # the first is the baseline
SEEDS = 4
PRIMARY = ("pr_sv", "logit_max", "val_loss")
# The true final values of the baseline (the tiny preset's QK-norm runs of docs/study_files.md, rounded)
TRUTH = {"pr_sv": 24.0, "pr_var": 12.0, "key_norm": 8.0, "max_abs": 2.5, "logit_max": 8.2, "entropy": 2.4,
         "sink_mass": 0.2, "val_loss": 4.67, "loss": 4.6}
NOISE = 0.01  # a run's noise in the null and power scenarios: 1% of the true value (sd)
EDGE = 1.02  # the edge scenario's truth: this many margins from the baseline
EDGE_NOISE = 0.1  # and a run's noise there, in margins (sd)
EFFECT = 0.10  # the power scenario's difference: 10% of the baseline's key PR
NOISE_KINDS = ("independent", "shared")


def synthetic_run(tag: str, seed: int, finals: dict) -> dict:
    """A results dict (one a study folder could hold: research.results.validate passes it) whose final values of
    the nine quantities are `finals` ({quantity key: value}): one layer, a probe at step 0 and one at 1,000 tokens
    holding the same values."""
    means = {f"{q.site}.{q.metric}": finals[q.key] for q in QUANTITIES if q.site is not None}
    return {"tag": tag, "seed": seed, "tokens": [0, 1000], "loss": [None, finals["loss"]],
            "val_loss": [None, finals["val_loss"]], "mean_pr": [finals["pr_sv"]] * 2, "layer_pr": {},
            "gamma_cv": {}, "gamma_final": {},
            "probes": [{"tokens": t, "layers": [{"layer": 0, "means": means}]} for t in (0, 1000)]}


def draw_study(rng: np.random.Generator, truth: dict, noise: dict, shared: bool) -> dict:
    """{condition: [results dict per seed]}: truth[condition][quantity] plus normal noise of sd noise[quantity] per
    run, one draw per run for all its quantities (shared) or one per quantity (independent)."""
    runs = {}
    for cond in CONDITIONS:
        z = rng.standard_normal((SEEDS, 1 if shared else len(QUANTITIES)))
        runs[cond] = [synthetic_run(cond, s, {q.key: truth[cond][q.key] + noise[q.key] * z[s, i if not shared else 0]
                                        for i, q in enumerate(QUANTITIES)}) for s in range(SEEDS)]
    return runs


def decided(runs: dict, primary: tuple[str, ...] = PRIMARY) -> ConditionsAnalysis:
    return analyze(ConditionRuns(runs, CONDITIONS[0], primary), MARGIN, LOSS_MARGIN)


def stated(a: ConditionsAnalysis) -> list[tuple[tuple[str, str], str, str]]:
    """(comparison, quantity key, reading) of every line part "In short" states."""
    return [(p, q.key, reading(d)) for p, items in a.in_short().items() for q, d in items]


def false_differs(a: ConditionsAnalysis) -> bool:
    """Under no true difference: does "In short" say anything differs?"""
    return any(r in (BEYOND, REAL) for _, _, r in stated(a))


# ----------------------------------------------------------------------------- the scenarios

def _truth(shift: Callable[[str, str], float] = lambda cond, key: 0.0) -> dict:
    return {c: {k: v + shift(c, k) for k, v in TRUTH.items()} for c in CONDITIONS}


def _margin_of(key: str, pair_mean: float) -> float:
    q = next(q for q in QUANTITIES if q.key == key)
    return quantity_margin(q, MARGIN, LOSS_MARGIN, LOGIT_MARGIN).of(pair_mean)


def _edge_shift(key: str) -> float:
    """The true difference EDGE margins from the baseline: d = EDGE * margin(pair mean), the pair mean b + d / 2
    for a margin that is a share s of it, so d = EDGE s b / (1 - EDGE s / 2)."""
    q = next(q for q in QUANTITIES if q.key == key)
    m = quantity_margin(q, MARGIN, LOSS_MARGIN, LOGIT_MARGIN)
    return EDGE * m.value if m.absolute else EDGE * m.value * TRUTH[key] / (1 - EDGE * m.value / 2)


def null_study(rng, shared: bool) -> dict:
    """A study with no true difference anywhere, each run's noise NOISE of each true value."""
    return draw_study(rng, _truth(), {k: NOISE * v for k, v in TRUTH.items()}, shared)


def null(rng, shared: bool) -> tuple[bool, bool]:
    """(a false "differs" line with the primaries, the same without them: all nine families stated)."""
    runs = null_study(rng, shared)
    return false_differs(decided(runs)), false_differs(decided(runs, ()))


def edge(rng, shared: bool) -> bool:
    """A false "lies within the margin" line about a primary quantity whose truth lies beyond the margin."""
    shift = {k: _edge_shift(k) for k in PRIMARY}
    truth = _truth(lambda c, k: shift.get(k, 0.0) if c != CONDITIONS[0] else 0.0)
    noise = {k: EDGE_NOISE * _margin_of(k, v + shift.get(k, 0.0) / 2) for k, v in TRUTH.items()}
    a = decided(draw_study(rng, truth, noise, shared))
    return any(r == INSIDE for _, key, r in stated(a) if key in PRIMARY)


def power(rng, shared: bool) -> bool:
    """Does B - base read "differs beyond the margin" in key PR, B being 10% above the baseline there?"""
    truth = _truth(lambda c, k: EFFECT * TRUTH[k] if (c, k) == (CONDITIONS[1], "pr_sv") else 0.0)
    a = decided(draw_study(rng, truth, {k: NOISE * v for k, v in TRUTH.items()}, shared))
    return reading(a.decisions["pr_sv"][(CONDITIONS[1], CONDITIONS[0])]) == BEYOND


@dataclass(frozen=True)
class Rate:
    what: str
    noise: str
    hits: int
    studies: int
    bound: float | None  # None: shown, not bounded
    upper: bool = True  # the bound is a ceiling (else a floor)

    @property
    def rate(self) -> float:
        return self.hits / self.studies

    @property
    def se(self) -> float:
        """The Monte Carlo standard error of the rate."""
        return math.sqrt(self.rate * (1 - self.rate) / self.studies)

    @property
    def meets(self) -> bool | None:
        """Within 2 standard errors of its bound, on the right side (None: no bound)."""
        if self.bound is None:
            return None
        return self.rate <= self.bound + 2 * self.se if self.upper else self.rate >= self.bound - 2 * self.se


def simulate(studies: int, seed: int = 0) -> list[Rate]:
    """Every scenario's rate over `studies` simulated studies per scenario and noise kind."""
    out = []
    for i, kind in enumerate(NOISE_KINDS):
        shared = kind == "shared"
        rng = np.random.default_rng([seed, i])
        nulls = [null(rng, shared) for _ in range(studies)]
        edges = [edge(rng, shared) for _ in range(studies)]
        powers = [power(rng, shared) for _ in range(studies)]
        out += [Rate('null: a false "differs" line, primary quantities (one family)', kind,
                     sum(x for x, _ in nulls), studies, ALPHA),
                Rate('null: the same, all nine quantities stated (nine families)', kind,
                     sum(y for _, y in nulls), studies, None),
                Rate('edge: a false "lies within the margin" line', kind, sum(edges), studies, ALPHA),
                Rate('power: +10% key PR reads "differs beyond the margin"', kind, sum(powers), studies, 0.8,
                     upper=False)]
    return out


def table(rates: list[Rate]) -> str:
    rows = [f"{'scenario':<66} {'noise':<12} {'rate':>7} {'MC s.e.':>8}  bound"]
    for r in rates:
        bound = ("none (shown for comparison)" if r.bound is None else
                 f"{'at most' if r.upper else 'at least'} {r.bound:.0%}: {'meets it' if r.meets else 'FAILS'}")
        rows.append(f"{r.what:<66} {r.noise:<12} {r.rate:>7.2%} {r.se:>8.2%}  {bound}")
    return "\n".join(rows)


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
Each simulated study is drawn from a known truth: per-seed final values of the nine quantities for 4 conditions (the
first the baseline) and 4 seeds, each run's value its condition's true value plus noise. It is decided by
research.analysis.conditions.analyze, the function the report uses, and read through ConditionsAnalysis.in_short,
what the report's "In short" states; nothing of the procedure is written again here. The primary quantities
(PRIMARY: key PR, the largest attention logit, the validation loss) cover the three kinds of margin (a share of the
pair's mean, logits, the loss margin), and are one family of 9 comparisons.

Scenarios, each with the noise independent across the quantities of a run and shared by all of them (real studies
lie between):

    null    no true difference anywhere; the rate of studies whose "In short" has a false "differs" line (beyond the
            margin, or real with its size unresolved) about a primary quantity: at most 5%. Beside it, the same
            studies read without primary quantities (nine families stated together, as every study file without
            `primary` is), which the bound does not cover.
    edge    every condition's truth lies 2% of the margin beyond the baseline's margin, in every primary quantity,
            with a run's noise a tenth of the margin; the rate of studies with a false "lies within the margin" line
            about a primary quantity: at most 5%.
    power   one condition 10% above the baseline in key PR, nothing else different, 1% noise per run; the rate at
            which that line reads "differs beyond the margin": at least 80%.

Each rate is printed with its Monte Carlo standard error sqrt(r (1 - r) / studies) and the bound it must meet (a
rate meets an upper bound when it is at most bound + 2 standard errors, a lower bound when at least bound - 2).
"""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=DESCRIPTION)
    p.add_argument("--studies", type=int, default=4000, help="Simulated studies per scenario and noise kind. "
                                                             "Default: 4000")
    p.add_argument("--seed", type=int, default=0, help="Seed of the random draws. Default: 0")
    return p


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.studies < 1:
        build_parser().error("--studies must be at least 1")
    start = time.perf_counter()
    rates = simulate(args.studies, args.seed)
    print(f"conditions kind, {args.studies:,} studies per scenario and noise kind: {len(CONDITIONS)} conditions "
          f"(the first the baseline), {SEEDS} seeds, primary quantities {', '.join(PRIMARY)}; seed {args.seed}")
    print(table(rates))
    print(f"wall time {time.perf_counter() - start:.0f} s")
    return 0 if all(r.meets is not False for r in rates) else 1


if __name__ == "__main__":
    raise SystemExit(main())
