"""Level and power of per-seed log ratios against per-seed differences for a positive ratio quantity, measured by
simulation (docs/decisions.md, "Ratio quantities").

    python -m research.simulations.ratios --studies 20000 --seed 0
"""
from __future__ import annotations

import math
import time
from argparse import RawDescriptionHelpFormatter
from dataclasses import dataclass

from utils.cli import ArgumentParser, command  # first: Ctrl-C while the libraries import ends in one line

import numpy as np

from research.analysis.rules import ALPHA, MARGIN, log_margin
from research.analysis.stats import t_critical

K = 4  # comparisons in a family
SEEDS = (4, 8)  # the fixed designs' seeds
L = log_margin(MARGIN)  # the margin on log ratios
SD = L / 2  # the sd of one seed's log ratio: the margin is 2 SD
RUN_SD = SD / math.sqrt(2)  # a run's own noise (relative)
SEED_SD = 0.15  # a seed's part, shared by both conditions (relative): a seed moves every condition by ~15%
OUTLIER = 10.0  # the outlier run's own noise, in RUN_SD
NOISES = ("gaussian", "multiplicative", "multiplicative_0.5", "outlier")
SEED_SDS = {"multiplicative_0.5": 0.5}  # a noise whose seed part is not SEED_SD: log-normal with skewness 1.75
EDGE = 0.02  # "at the margin": this share of it inside or outside
TRUTHS = {"0": 0.0, "margin, inside": (1 - EDGE) * L, "margin, outside": (1 + EDGE) * L, "margin + 2 sd": L + 2 * SD,
          "margin + 4 sd": L + 4 * SD}
METHODS = ("raw t", "log ratio")
EQUAL, WITHIN, UNRESOLVED, DIFFERENT, INCONCLUSIVE = range(5)


def draw(rng: np.random.Generator, kind: str, studies: int, n: int, log_r: float) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) [studies, K, n] of one noise kind at the truth ln r; the same draws (one stream per kind and n) at every
    truth, which only shifts them."""
    z = SEED_SDS.get(kind, SEED_SD) * rng.standard_normal((studies, K, n, 1))
    u = RUN_SD * rng.standard_normal((studies, K, n, 2))
    if kind == "outlier":
        u[:, :, -1, 0] *= OUTLIER
    if kind.startswith("multiplicative"):
        runs = np.exp(z + u)
        return math.exp(log_r) * runs[..., 0], runs[..., 1]
    if kind not in ("gaussian", "outlier"):
        raise ValueError(f"unknown noise {kind!r}")
    runs = z + u
    return math.exp(log_r) + runs[..., 0], 1.0 + runs[..., 1]


def outcomes(d: np.ndarray, margin: np.ndarray | float, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(outcome codes, the interval's side: +1 above 0, -1 below, 0 holding it) of the t interval of mean(d) over the
    last axis at `level`, against +-margin: rules.outcome_of, vectorized."""
    n = d.shape[-1]
    est, sd = d.mean(-1), d.std(-1, ddof=1)
    half = t_critical(n - 1, level) * sd / math.sqrt(n)
    lo, hi = est - half, est + half
    excludes0, inside = (lo > 0) | (hi < 0), (-margin < lo) & (hi < margin)
    beyond = (lo >= margin) | (hi <= -margin)
    code = np.where(inside, np.where(excludes0, WITHIN, EQUAL),
                    np.where(beyond, DIFFERENT, np.where(excludes0, UNRESOLVED, INCONCLUSIVE)))
    return code, np.sign(lo) * (lo > 0) + np.sign(hi) * (hi < 0)


def wrong(code: np.ndarray, side: np.ndarray, log_r: float) -> np.ndarray:
    """Does each outcome say something the truth (ln r, against the log margin L) contradicts?"""
    t = side * log_r
    return np.select([code == EQUAL, code == WITHIN, code == DIFFERENT, code == UNRESOLVED],
                     [abs(log_r) >= L, ~((0 < t) & (t < L)), ~(t >= L), ~(t > 0)], False)


def decide_both(a: np.ndarray, b: np.ndarray) -> dict:
    """{method: (codes, sides)} of every comparison of a [..., n] draw, at 1 - ALPHA / K."""
    level = 1 - ALPHA / K
    raw = outcomes(a - b, MARGIN * (np.abs(a.mean(-1)) + np.abs(b.mean(-1))) / 2, level)
    return {METHODS[0]: raw, METHODS[1]: outcomes(np.log(a) - np.log(b), L, level)}


@dataclass(frozen=True)
class Cell:
    noise: str
    seeds: int
    truth: str
    method: str
    studies: int
    family_wrong: float  # share of studies with any wrong decision in the family
    wrong: float  # share of comparisons decided wrongly
    beyond: float  # share of comparisons decided beyond the margin with the truth's sign

    @property
    def family_se(self) -> float:
        return math.sqrt(self.family_wrong * (1 - self.family_wrong) / self.studies)

    def se(self, rate: float) -> float:
        """Monte Carlo standard error of a per-comparison rate (the K comparisons of a study are independent)."""
        return math.sqrt(rate * (1 - rate) / (self.studies * K))


def simulate(studies: int, seed: int = 0, noises=NOISES, seeds=SEEDS) -> list[Cell]:
    """Every cell's rates over `studies` simulated studies per noise and number of seeds."""
    out = []
    for kind in noises:
        for n in seeds:
            for name, log_r in TRUTHS.items():
                rng = np.random.default_rng([seed, NOISES.index(kind), n])  # the same draws at every truth
                a, b = draw(rng, kind, studies, n, log_r)
                if (a <= 0).any() or (b <= 0).any():
                    raise ValueError(f"{kind} noise drew a value of 0 or below: SEED_SD is too large")
                for method, (code, side) in decide_both(a, b).items():
                    bad = wrong(code, side, log_r)
                    beyond = (code == DIFFERENT) & (side == (np.sign(log_r) if log_r else 2))
                    out.append(Cell(kind, n, name, method, studies, float(bad.any(-1).mean()), float(bad.mean()),
                                    float(beyond.mean())))
    return out


def table(cells: list[Cell]) -> str:
    rows = [f"{'noise':<18} {'seeds':>5} {'truth':<15} {'method':<10} {'family wrong':>13} {'s.e.':>6} "
            f"{'wrong/comp.':>12} {'s.e.':>6} {'beyond':>8} {'s.e.':>6}"]
    for c in cells:
        rows.append(f"{c.noise:<18} {c.seeds:>5} {c.truth:<15} {c.method:<10} {c.family_wrong:>13.2%} "
                    f"{c.family_se:>6.2%} {c.wrong:>12.2%} {c.se(c.wrong):>6.2%} {c.beyond:>8.1%} "
                    f"{c.se(c.beyond):>6.2%}")
    return "\n".join(rows)


def checks(cells: list[Cell]) -> list[tuple[str, bool]]:
    """(what, met) of the bound the log ratio must meet where it is exact (multiplicative noise): a wrong decision in
    at most 5% of families at every truth, within 2 Monte Carlo standard errors."""
    return [(f"log ratio, multiplicative noise, {c.seeds} seeds, truth {c.truth}: {c.family_wrong:.2%} <= "
             f"{ALPHA:.0%} + 2 s.e.", c.family_wrong <= ALPHA + 2 * c.family_se)
            for c in cells if c.method == METHODS[1] and c.noise.startswith("multiplicative")]


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
Each simulated study is one family of K = 4 comparisons (the QK-norm study's family of one quantity: three pairs and
the difference of the steps), each of two conditions A and B over n seeds (4 or 8: the fixed designs), decided at one
look at 1 - 0.05/K, with the 3% margin of the pair's mean. Every comparison is decided twice on the same draws:

    raw t       the t interval of the per-seed differences A_s - B_s against 3% of the pair's mean (the rule before
                issue 64)
    log ratio   the t interval of the per-seed log ratios ln(A_s / B_s) against ln((1 + m/2) / (1 - m/2)), the same
                margin (research.analysis.rules.log_margin)

A value of B is mu = 1 times a seed's part and a run's own part; A is r times the same. Noise:

    gaussian        additive: A = r + SEED_SD z_s + RUN_SD u_A, B = 1 + SEED_SD z_s + RUN_SD u_B, z and u standard
                    normal (a seed moves both conditions by the same amount); the raw t is exact here
    multiplicative  log-normal per run: A = r exp(SEED_SD z_s + RUN_SD u_A), B = exp(SEED_SD z_s + RUN_SD u_B) (a
                    seed scales both conditions); the log ratio is exact here
    multiplicative_0.5  the same with a seed part of sd 0.5 (exp(0.5 z) has skewness 1.75, the sequential table's
                    log-normal): the per-seed differences of a real effect are skewed
    outlier         gaussian, but one seed of each comparison (the last) has its A run's own noise OUTLIER times as
                    large: one run that went wrong

RUN_SD sets the sd of one seed's log ratio, SD = sqrt(2) RUN_SD, to half the margin (the margin is 2 SD). Truths, as
ln r: 0; 2% inside and 2% outside the margin; the margin plus 2 SD and plus 4 SD. The truth's category is the same in
both scales (|A - B| <= m (A + B) / 2 exactly when |ln(A / B)| <= the log margin), so a decision is wrong in either
when the truth contradicts it: a real difference at truth 0, beyond the margin for a truth inside it, inside for a truth
outside it, or the wrong sign (research.simulations.sequential.wrong's rule).

Per noise, seeds, truth and method: the rate of studies with any wrong decision in the family (bound: 5%), the rate
of wrong comparisons (bound: 0.05 / K = 1.25% each), and the rate of comparisons decided beyond the margin with the
truth's sign (power), each with its Monte Carlo standard error. Pure numpy; the outcome of every comparison is the one
research.analysis.rules.decide reads off the same interval (a test checks the two agree).
"""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m research.simulations.ratios", description=DESCRIPTION,
                       formatter_class=RawDescriptionHelpFormatter)
    p.add_argument("--studies", type=int, default=20000, help="Simulated studies (families of 4) per noise, seeds "
                                                              "and truth. Default: 20000")
    p.add_argument("--seed", type=int, default=0, help="Seed of the random draws. Default: 0")
    return p


@command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.studies < 2:
        build_parser().error("--studies must be at least 2")
    start = time.perf_counter()
    cells = simulate(args.studies, args.seed)
    print(f"{K} comparisons a family at 1 - {ALPHA}/{K}, margin {MARGIN:.0%} of the pair's mean (log margin "
          f"{L:.6f}); one seed's log ratio sd {SD:.4f} (the margin is 2 sd), a seed's part {SEED_SD:g} (0.5 in "
          f"multiplicative_0.5), an outlier run's noise {OUTLIER:g} times a run's; {args.studies:,} studies per noise, "
          f"seeds and truth, seed {args.seed}")
    print(table(cells))
    met = True
    for what, ok in checks(cells):
        print(f"  {what}: {'meets it' if ok else 'FAILS'}")
        met &= ok
    print(f"wall time {time.perf_counter() - start:.1f} s")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
