"""Decisions over several looks at a growing set of seeds, with the error rate of one look (docs/decisions.md).

A design fixed when the study starts (`plan`, `Design`) plans its looks (the seeds analysed at each) and spends
the family's alpha over them; each look's intervals are calibrated (`boundaries`, simulated once per design) so
that the chance that some interval up to a look misses is what the design has spent by then, and each outcome is
read off the running intersection of the comparison's intervals, so any stopping rule keeps the bound. A look
nobody planned is decided at the full alpha. `at_looks(looks, design)` decides a study's families at the looks
its study.json records (`decide_looks`).
The spending, the calibration and the simulations behind them: docs/decisions.md, "Sequential studies".
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
from scipy import stats

from research.analysis.rules import (ALPHA, INCONCLUSIVE, MARGIN, NO_DATA, UNRESOLVED, Margin, Paired, decide_once,
                                     deciding_with, k_of, no_spread, outcome_of)
from research.analysis.wording import Reading, reading_with, settle_text
from research.analysis.stats import t_critical
from research.results.schema import ResultsError
from utils.errors import shown

FIRST_SHARE = 0.05  # the share of alpha a design's first look spends
RHO = 0.7  # the power of the spending over the seeds added after the first look: most of it early
DRAWS = 400_000  # simulated studies that calibrate a design's intervals (boundaries)


@dataclass(frozen=True)
class Design:
    """A plan of looks fixed at a study's first command: the seeds analysed at each look, ascending; `first`: the
    share of alpha the first look spends (None: a design recorded before calibration, spending alpha (n/n_max)^rho
    from zero seeds); `calibrated`: each look's intervals set by `boundaries` (else at the look's own share)."""

    looks: tuple[int, ...]
    alpha: float = ALPHA
    rho: float = RHO
    first: float | None = FIRST_SHARE
    calibrated: bool = True

    def __post_init__(self):
        if not self.looks or any(b <= a for a, b in zip(self.looks, self.looks[1:])) or self.looks[0] < 2:
            raise ValueError(f"looks must rise from at least 2 seeds: {self.looks}")

    def spent(self, j: int) -> float:
        """The alpha spent by looks 0..j together: all of it at the last look."""
        n, n0, n_max = self.looks[j], self.looks[0], self.looks[-1]
        if j == len(self.looks) - 1:
            return self.alpha
        if self.first is None:
            return self.alpha * (n / n_max) ** self.rho
        return self.alpha * (self.first + (1 - self.first) * ((n - n0) / (n_max - n0)) ** self.rho)

    def level(self, j: int) -> float:
        """The alpha look j spends: what the spending adds at it."""
        return self.spent(j) - (self.spent(j - 1) if j else 0.0)

    @property
    def levels(self) -> tuple[float, ...]:
        return tuple(self.level(j) for j in range(len(self.looks)))


@functools.lru_cache(maxsize=256)
def boundaries(ns: tuple[int, ...], spent: tuple[float, ...], draws: int = DRAWS, seed: int = 0) -> tuple[float, ...]:
    """The two-sided levels of one comparison's t intervals at looks of ns[j] seeds such that the chance that one of
    the intervals of looks 0..j misses the true mean is spent[j] (cumulative), for normal per-seed differences.

    The first look's level is spent[0] exactly (Student's t). Each later one is set by `draws` simulated studies
    (standard normal draws, seeded: the t statistics' joint law depends on neither mean nor spread): among those
    whose intervals so far all cover, the critical value that what is left to spend exceeds, lowered by two Monte
    Carlo standard errors so that the simulation's own error errs on the strict side; or the look's own share
    spent[j] - spent[j - 1] where that is wider (the union bound holds it). A look that adds nothing to what is
    spent decides nothing (level 0)."""
    z = np.random.default_rng(seed).standard_normal((draws, max(ns)))
    total, squares = np.cumsum(z, axis=1), np.cumsum(z * z, axis=1)
    covered, levels = np.ones(draws, bool), []
    for j, n in enumerate(ns):
        mean = total[:, n - 1] / n
        sd = np.sqrt(np.maximum(squares[:, n - 1] - n * mean * mean, 0.0) / (n - 1))
        t = np.abs(mean) * math.sqrt(n) / np.maximum(sd, 1e-300)
        own = spent[j] - (spent[j - 1] if j else 0.0)  # the look's own share: its level by the union bound
        c = c_own = t_critical(n - 1, 1 - own) if own > 0 else math.inf
        share = spent[j] - (1.0 - covered.mean())
        misses = math.floor(share * draws - 2 * math.sqrt(max(share * draws, 0.0)))
        if j and own > 0 and misses >= 1:
            c = min(c, float(np.sort(t[covered])[::-1][misses]))
        covered &= t <= c
        # the look's own share where its critical value is that share's (exactly: not through t's quantile and back,
        # which scipy versions round differently), else the simulated one's level
        levels.append(0.0 if math.isinf(c) else own if c == c_own else 2.0 * float(stats.t.sf(c, n - 1)))
    return tuple(levels)


def plan(first: int, max_seeds: int, round_: int, alpha: float = ALPHA, rho: float = RHO,
         first_share: float | None = FIRST_SHARE, calibrated: bool = True) -> Design:
    """Looks at `first` seeds, then every `round_` more, and at `max_seeds` (the last look, even if a round is cut
    short): plan(4, 8, 2) looks at 4, 6 and 8 seeds."""
    if round_ < 1 or max_seeds < first:
        raise ValueError(f"a round of at least 1 seed and max >= first: round {round_}, {first} to {max_seeds}")
    looks = list(range(first, max_seeds, round_)) + [max_seeds]
    return Design(tuple(looks), alpha, rho, first_share, calibrated)


def intersect(intervals) -> tuple[float, float] | None:
    """The running intersection of intervals (lo, hi); None where they do not meet (then some interval missed its
    truth, an event the design's alpha covers)."""
    lo, hi = -math.inf, math.inf
    for a, b in intervals:
        lo, hi = max(lo, a), min(hi, b)
    return (lo, hi) if lo <= hi else None


def decide_looks(families: list[dict], alphas: list[float], margin: float | Margin = MARGIN,
                 k: int | None = None, calibrated: bool = False) -> dict:
    """Decide a family {key: Paired} seen at several looks (families[j]: the family at look j, on that look's seeds;
    alphas[j]: the alpha look j spends). Each look decides each comparison from its t interval: at 1 - alphas[j] / k
    (rules.decide), or, `calibrated`, at the level `boundaries` sets for the comparison's seeds at its looks and the
    alpha spent by each, divided by k. The Decision returned is the last look's, with its interval replaced by the
    intersection of the comparison's intervals over the looks and its outcome read off that intersection. Where the
    intervals do not meet, the last look's interval stands."""
    if len(families) != len(alphas) or not families:
        raise ValueError("one alpha per look, and at least one look")
    ks = [k_of(f) if k is None else k for f in families]
    if calibrated:
        looks = [{} for _ in families]
        for key in families[-1]:
            if any(key not in f for f in families[:-1]):  # seeds unknown: the last look alone, at its own share
                looks[-1].update(decide_once({key: families[-1][key]}, margin, alphas[-1], ks[-1]))
                continue
            tested = [j for j, f in enumerate(families) if key in f and f[key].diffs.size >= 2
                      and not no_spread(f[key])]
            spent = tuple(sum(a / max(kk, 1) for a, kk in zip(alphas[:j + 1], ks)) for j in tested)
            levels = boundaries(tuple(int(families[j][key].diffs.size) for j in tested), spent) if tested else ()
            for j, level in zip(tested, levels):
                looks[j].update(decide_once({key: families[j][key]}, margin, level * max(ks[j], 1), ks[j]))
            if not tested or tested[-1] != len(families) - 1:  # no interval at the last look: decided as it stands
                looks[-1].update(decide_once({key: families[-1][key]}, margin, alphas[-1], ks[-1]))
    else:
        looks = [decide_once(f, margin, a, kk) for f, a, kk in zip(families, alphas, ks)]
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
    return c.keep(np.array([s in seeds for s in c.seeds], bool))


def decide_at(family: dict, looks: list[Look], margin: float | Margin = MARGIN, alpha: float = ALPHA,
              k: int | None = None, design: Design | None = None) -> dict:
    """A family as the last of `looks` sees it, decided over the looks (decide_looks): at every earlier look on the
    seeds it analysed. A comparison whose seeds are unknown (a one-sample quantity built without them) is decided at
    the last look alone, at its alpha: one interval, inside the same bound. `alpha` other than ALPHA scales every
    look's share alike."""
    earlier = [{key: r for key, c in family.items() if (r := restricted(c, set(look.seeds))) is not None}
               for look in looks[:-1]]
    calibrated = bool(design and design.calibrated and all(look.planned for look in looks))
    return decide_looks([*earlier, family], [look.alpha * alpha / ALPHA for look in looks], margin, k, calibrated)


def reading(looks: list[Look], design: Design | None) -> Reading:
    """How a report of these looks words its intervals and what would settle an open question."""
    each = "every outcome is read off the intersection of the comparison's t intervals over the study's looks, "
    if design is None:
        return Reading(intervals=each + f"each look's at 1 \u2212 {ALPHA}/k: looks nobody planned, whose error bound "
                       "the Looks section states", settle=settle_text(bound=error_bound(looks)))
    how = ("at the level the design sets for it (calibrated so that with at least 95% probability every interval of "
           "every look of the family covers its true difference at once)" if design.calibrated else
           "at 1 \u2212 \u03b1_j/k for the \u03b1_j it spends (the union bound: with at least 95% probability every "
           "interval of every look of the family covers its true difference at once)")
    if looks and len(looks[-1].seeds) >= design.looks[-1]:
        settle = settle_text(bound=error_bound(looks, design))
    else:
        settle = f"the same command continues this study, whose design plans looks up to {design.looks[-1]} seeds"
    return Reading(intervals=each + "each look's " + how + "; the Looks section lists them", settle=settle)


@contextlib.contextmanager
def at_looks(looks: list[Look], design: Design | None = None) -> Iterator[None]:
    """Within the block every rules.decide decides at `looks` (decide_at), by `design`'s intervals where it planned
    them, and the reports' procedure and what would settle an open question say so (wording.reading_with); with one
    look at the full alpha and no design, as rules.decide does alone (a study of fixed seeds, decided as it always
    was)."""
    if one_full_look(looks) and design is None:
        yield
        return
    with deciding_with(lambda family, margin, alpha, k: decide_at(family, looks, margin, alpha, k, design)), \
            reading_with(reading(looks, design)):
        yield


def looks_of(index: dict) -> list[Look]:
    """The looks a study.json records (research.results.layout), or, where it records none, the one look at its seeds
    at the full level that every study folder written before looks were recorded took."""
    if index.get("looks") is not None:
        return [Look(tuple(look["seeds"]), float(look["alpha"]), bool(look["planned"])) for look in index["looks"]]
    return [Look(tuple(index["seeds"]), ALPHA)] if index.get("seeds") else []


# What study.json's top level gives that defines a study's families and their outcomes: which runs are compared with
# which, the quantities read as one family, every margin an outcome is read against. A design records them at the
# study's first command (its `family`), so that none can be chosen after the data are seen (docs/decisions.md).
FAMILY = ("conditions", "baseline", "primary", "margin", "loss_margin", "logit_margin", "kv_loss_margin")
# The fix of a study.json whose looks or design do not agree with each other or with its runs
EDITED_FIX = ("restore study.json from a copy, or run the study again into another --out (its runs stay in their "
              "folders)")


def family_in(index: dict) -> dict:
    """The FAMILY fields of a checked study.json's top level (its conditions by name; none, unset): what it is decided
    with now."""
    out = {key: index.get(key) for key in FAMILY}
    return {**out, "conditions": list(index.get("conditions") or []), "primary": list(index.get("primary") or [])}


def family_record(conditions, *, margin: float, loss_margin: float, baseline: str | None = None, primary=(),
                  logit_margin: float | None = None, kv_loss_margin: float | None = None) -> dict:
    """The FAMILY a study gives its study.json (None: the project's default margin), as its design records it."""
    return {"conditions": list(conditions), "baseline": baseline, "primary": list(primary), "margin": margin,
            "loss_margin": loss_margin, "logit_margin": logit_margin, "kv_loss_margin": kv_loss_margin}


def family_changes(fixed: dict, given: dict) -> list[tuple[str, object, object]]:
    """(field, fixed value, given value) of every FAMILY field where `given` differs from what `fixed` recorded."""
    return [(key, fixed.get(key), given.get(key)) for key in FAMILY
            if (fixed.get(key) or None) != (given.get(key) or None)]


def value_text(value) -> str:
    """A FAMILY field's value as a message shows it: a list joined, none where unset (the project's default)."""
    if value is None or value == []:
        return "none"
    return " ".join(map(str, value)) if isinstance(value, list) else shown(value)


def fixed_family(index: dict) -> dict:
    """The FAMILY a checked study.json's design fixed at the study's first command: its own record, or for a design
    recorded before it held one, the top level's."""
    return (index.get("design") or {}).get("family") or family_in(index)


def design_of(index: dict) -> Design | None:
    """The design a study.json records (planned at the study's first command with --until_decided), or None; one
    recorded before calibration (no `first`) as it was planned. ResultsError, one line, where no plan has its options
    (a MAX below its seeds: the file was edited)."""
    d = index.get("design")
    if not d:
        return None
    try:
        return plan(len(d["seeds"]), d["max_seeds"], d["round"], d["alpha"], d["rho"], d.get("first"),
                    bool(d.get("calibrated", False)))
    except ValueError:
        raise ResultsError(f"{index.get('path', 'study.json')}: design: --until_decided {d['max_seeds']} --round "
                           f"{d['round']} over {len(d['seeds'])} first seeds plans no looks (a MAX of at least the "
                           f"seeds, a first look of 2 or more): the file was edited or damaged; fix: "
                           f"{EDITED_FIX}") from None


def _seeds_listed(paths: list, seeds: list) -> set:
    """The seeds a condition's results files are for: their seed_<s> folders (one file of one seed: the study's)."""
    named = {int(p.parent.name[5:]) for p in paths if p.parent.name.startswith("seed_")
             and p.parent.name[5:].lstrip("-").isdigit()}
    return named or (set(seeds) if len(paths) == 1 and len(seeds) == 1 else set())


def recorded(index: dict) -> tuple[list[Look], Design | None]:
    """(looks_of, design_of) of a checked study.json, checked against each other and its runs, every reader's: where
    a design was planned, its FAMILY is the top level's, and its looks are the plan's, in order: each planned, at the
    seeds the design adds and the alpha it spends there; without one, a first look at the full level and any later
    one at the full level too, unplanned; the study's seeds are its last look's, and every condition lists a results
    file of each (existing, once the look is taken). ResultsError in one line names the first disagreement, as a
    study.json edited or damaged."""
    path, design, looks = index.get("path", "study.json"), design_of(index), looks_of(index)
    seeds = list(index.get("seeds") or [])

    def edited(what: str):
        return ResultsError(f"{path}: {what}: the file was edited or damaged; fix: {EDITED_FIX}")
    if design is not None:
        changes = family_changes(fixed_family(index), family_in(index))
        if changes:
            key, fixed, now = changes[0]
            raise edited(f"{key} is {value_text(now)}, not the {value_text(fixed)} its design fixed at the study's "
                         f"first command")
        first = list(index["design"]["seeds"])
        if len(looks) > len(design.looks):
            raise edited(f"{len(looks)} looks recorded, more than the {len(design.looks)} its design plans")
        for j, look in enumerate(looks):
            want = [*first, *range(max(first) + 1, max(first) + 1 + design.looks[j] - len(first))]
            if not look.planned or sorted(look.seeds) != sorted(want) or \
                    not math.isclose(look.alpha, design.level(j), rel_tol=1e-9, abs_tol=1e-15):
                raise edited(f"look {j + 1} (seeds {value_text(list(look.seeds))}, alpha {look.alpha:.5g}, planned "
                             f"{str(look.planned).lower()}) is not its design's (seeds {value_text(want)}, alpha "
                             f"{design.level(j):.5g}, planned)")
    else:
        for j, look in enumerate(looks):
            if not math.isclose(look.alpha, ALPHA, rel_tol=1e-9) or look.planned != (j == 0):
                raise edited(f"look {j + 1} (alpha {look.alpha:.5g}, planned {str(look.planned).lower()}) is not a "
                             f"look of a study without a design (the first planned, every look at alpha {ALPHA:g})")
    last = list(looks[-1].seeds) if looks else list(index["design"]["seeds"]) if design else seeds
    if sorted(seeds) != sorted(last):
        raise edited(f"seeds {value_text(seeds)} are not its last look's ({value_text(last)})")
    for cond, paths in (index.get("conditions") or {}).items():
        missing = sorted(set(last) - _seeds_listed(paths, seeds))
        if not missing and looks and index.get("looks") is not None:
            missing = sorted(seed for p in paths if not p.is_file() for seed in _seeds_listed([p], seeds))
        if missing:
            raise edited(f"condition {cond} has no results file of seed(s) {value_text(missing)} of its last look")
    return looks, design


def undecided(primary: dict) -> list[str]:
    """The labels of the primary comparisons {label: Decision} whose size is not settled: inconclusive, real with its
    size unresolved, or with no paired values at all (what was never measured is never decided). A comparison of one
    seed or no spread waits on no seed."""
    return [label for label, d in primary.items() if d.outcome in (INCONCLUSIVE, UNRESOLVED, NO_DATA)]
