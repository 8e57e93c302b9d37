"""Decisions over several looks at a growing set of seeds, with the error rate of one look (docs/decisions.md).

A study that adds seeds while a question is open looks at its data more than once. Deciding every look at the full
level lets each look err at that rate, so the chance that some look errs grows with the looks. Here the level is
spent over the looks instead: a design fixed when the study starts plans its looks (the seeds analysed at each) and
gives look j a share alpha_j of the family's alpha, with the shares adding up to alpha. Look j decides each
comparison from its t interval at 1 - alpha_j / k (Bonferroni over the family's k comparisons, as
research.analysis.rules.decide does), and the outcome is read off the running intersection of the comparison's
intervals over the looks so far. By the union bound, every interval of every look covers its true difference at once
with probability at least 1 - sum(alpha_j) = 1 - alpha, and then every outcome read off an intersection is right,
whatever rule chose when to stop.

The share of a planned look follows the power spending function alpha * (n_j / n_max) ** RHO of its seeds n_j out
of the plan's last look n_max: early looks, with few seeds, spend little. A look nobody planned (a study grown by
hand with more --seeds) is decided at the full alpha, and its error bound is what the looks spent in all.

A study folder records its looks (study.json's `looks`: the seeds each analysed, the alpha it spent, planned or
not); `at_looks(looks)` decides every family of a study's analysis at those looks: each comparison's differences
restricted to a look's seeds, decided at that look's alpha, the outcome read off the intersection (decide_looks).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from research.analysis.rules import (ALPHA, INCONCLUSIVE, MARGIN, UNRESOLVED, Margin, Paired, decide_once,
                                     deciding_with, outcome_of)

RHO = 3.0  # the power of the spending function alpha * t ** RHO (t: the share of the plan's seeds analysed)


@dataclass(frozen=True)
class Design:
    """A plan of looks fixed at a study's first command: the seeds analysed at each look, ascending."""

    looks: tuple[int, ...]
    alpha: float = ALPHA
    rho: float = RHO

    def __post_init__(self):
        if not self.looks or any(b <= a for a, b in zip(self.looks, self.looks[1:])) or self.looks[0] < 2:
            raise ValueError(f"looks must rise from at least 2 seeds: {self.looks}")

    def spent(self, j: int) -> float:
        """The alpha spent by looks 0..j together."""
        return self.alpha * (self.looks[j] / self.looks[-1]) ** self.rho

    def level(self, j: int) -> float:
        """The alpha look j spends: what the spending function adds at it (the last look spends the rest)."""
        return self.spent(j) - (self.spent(j - 1) if j else 0.0)

    @property
    def levels(self) -> tuple[float, ...]:
        return tuple(self.level(j) for j in range(len(self.looks)))


def plan(first: int, max_seeds: int, round_: int, alpha: float = ALPHA, rho: float = RHO) -> Design:
    """Looks at `first` seeds, then every `round_` more, and at `max_seeds` (the last look, even if a round is cut
    short): plan(4, 8, 2) looks at 4, 6 and 8 seeds."""
    if round_ < 1 or max_seeds < first:
        raise ValueError(f"a round of at least 1 seed and max >= first: round {round_}, {first} to {max_seeds}")
    looks = list(range(first, max_seeds, round_)) + [max_seeds]
    return Design(tuple(looks), alpha, rho)


def intersect(intervals) -> tuple[float, float] | None:
    """The running intersection of intervals (lo, hi); None where they do not meet (then some interval missed its
    truth, an event the design's alpha covers)."""
    lo, hi = -math.inf, math.inf
    for a, b in intervals:
        lo, hi = max(lo, a), min(hi, b)
    return (lo, hi) if lo <= hi else None


def decide_looks(families: list[dict], alphas: list[float], margin: float | Margin = MARGIN,
                 k: int | None = None) -> dict:
    """Decide a family {key: Paired} seen at several looks (families[j]: the family at look j, on that look's seeds;
    alphas[j]: the alpha look j spends). Each look is decided by rules.decide at 1 - alphas[j] / k; the Decision
    returned is the last look's, with its interval replaced by the intersection of the comparison's intervals over
    the looks and its outcome read off that intersection. Where the intervals do not meet, the last look's interval
    stands."""
    if len(families) != len(alphas) or not families:
        raise ValueError("one alpha per look, and at least one look")
    looks = [decide_once(f, margin, a, k) for f, a in zip(families, alphas)]
    out = {}
    for key, last in looks[-1].items():
        if not last.tested:
            out[key] = last
            continue
        seen = [d[key].ci for d in looks if key in d and d[key].tested]
        lo, hi = intersect(seen) or last.ci
        out[key] = dataclasses.replace(last, ci=(lo, hi), outcome=outcome_of(lo, hi, last.margin))
    return out


@dataclass(frozen=True)
class Look:
    """One look of a study, as its study.json records it: the seeds analysed, the alpha it spent, and whether the
    study's design planned it (a look taken by hand is decided at the full alpha)."""

    seeds: tuple
    alpha: float
    planned: bool = True


def error_bound(looks: list[Look], design: Design | None = None) -> float:
    """The chance that some outcome of a family is wrong, at most, over these looks: what they spent in all; a
    design's planned looks count as its whole alpha (the looks it may still take included), so a study stopped
    early keeps the bound it was planned with."""
    unplanned = sum(look.alpha for look in looks if not (design and look.planned))
    return unplanned + (design.alpha if design and any(look.planned for look in looks) else 0.0)


def one_full_look(looks: list[Look]) -> bool:
    """No looks recorded, or one at the full alpha: decided as a fixed design is, with no correction."""
    return not looks or (len(looks) == 1 and looks[0].alpha == ALPHA)


def restricted(c: Paired, seeds) -> Paired | None:
    """A comparison's differences on `seeds` alone (what an earlier look saw); None where its seeds are unknown."""
    if c.seeds is None:
        return None
    keep = np.array([s in seeds for s in c.seeds], bool)
    return dataclasses.replace(c, diffs=c.diffs[keep], seeds=tuple(s for s, k in zip(c.seeds, keep) if k))


def decide_at(family: dict, looks: list[Look], margin: float | Margin = MARGIN, alpha: float = ALPHA,
              k: int | None = None) -> dict:
    """A family as the last of `looks` sees it, decided over the looks (decide_looks): at every earlier look on the
    seeds it analysed. A comparison whose seeds are unknown (a one-sample quantity built without them) is decided at
    the last look alone, at its alpha: one interval, inside the same bound. `alpha` other than ALPHA scales every
    look's share alike."""
    earlier = [{key: r for key, c in family.items() if (r := restricted(c, set(look.seeds))) is not None}
               for look in looks[:-1]]
    return decide_looks([*earlier, family], [look.alpha * alpha / ALPHA for look in looks], margin, k)


@contextlib.contextmanager
def at_looks(looks: list[Look]) -> Iterator[None]:
    """Within the block every rules.decide decides at `looks` (decide_at); with one look at the full alpha, as
    rules.decide does alone (a study of fixed seeds, decided as it always was)."""
    if one_full_look(looks):
        yield
        return
    with deciding_with(lambda family, margin, alpha, k: decide_at(family, looks, margin, alpha, k)):
        yield


def looks_of(index: dict) -> list[Look]:
    """The looks a study.json records (research.results.layout), or, where it records none, the one look at its seeds
    at the full level that every study folder written before looks were recorded took."""
    if index.get("looks") is not None:
        return [Look(tuple(look["seeds"]), float(look["alpha"]), bool(look["planned"])) for look in index["looks"]]
    return [Look(tuple(index["seeds"]), ALPHA)] if index.get("seeds") else []


def design_of(index: dict) -> Design | None:
    """The design a study.json records (planned at the study's first command with --until_decided), or None."""
    d = index.get("design")
    return plan(len(d["seeds"]), d["max_seeds"], d["round"], d["alpha"], d["rho"]) if d else None


def undecided(primary: dict) -> list[str]:
    """The labels of the primary comparisons {label: Decision} whose size is not settled: inconclusive, or real with
    its size unresolved (a comparison with no interval, one seed or no spread, waits on no seed)."""
    return [label for label, d in primary.items() if d.outcome in (INCONCLUSIVE, UNRESOLVED)]
