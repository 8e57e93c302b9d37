"""Does a per-probe series fall and then rise again? The probe of the minimum is chosen on some seeds and the fall
to it and the rise after it are tested on the others (docs/decisions.md, claim (d)).

Choosing the lowest probe from the same data it is then tested on favours finding a dip: on flat, noisy series the
fall is called real far more often than its Bonferroni share. Here, in seed order, every other seed from the
second chooses the probe (the interior probe lowest in their mean) and the others test it, so the tested seeds had
no say in the choice. Used by the QK-norm study's claim (d) and the fine-tuning study's recovery of key PR.
"""
from __future__ import annotations

import numpy as np

from research.analysis.rules import DIFFERENCE, RATIO_WHERE_POSITIVE, UNRESOLVED, Decision, Paired, decide
from research.analysis.wording import effect_text
from research.analysis.series import nanmean
from research.results.read import seed_of

RISES, NO_RISE, OPEN, UNTESTED = "falls and rises again", "no fall and rise", "inconclusive", "not tested"


def split_seeds(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows that choose the probe, rows that test it) of n seeds in seed order: every other seed from the
    second chooses (n // 2 of them), the rest, from the first, test (the larger half)."""
    rows = np.arange(n)
    return rows[1::2], rows[0::2]


def dip(y: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Y[n_seeds, n_probes] (seed order, at least 3 probes): the interior probe i* lowest in the mean of the
    choosing seeds (split_seeds), and on the OTHER seeds the fall y[0] - y[i*] and the rise y[-1] - y[i*]. The
    tested seeds had no say in i*, so under no dip the fall and the rise are centred on 0 (-1: no finite value)."""
    choose, test = split_seeds(y.shape[0])
    interior = nanmean(y[choose, 1:-1], axis=0)
    i = 1 + int(np.nanargmin(interior)) if np.isfinite(interior).any() else -1
    return i, y[test, 0] - y[test, i], y[test, -1] - y[test, i]


def dip_decisions(ys: dict, margin: float, on: str = DIFFERENCE, what: str = "the value") -> tuple[dict, dict]:
    """ys: condition -> Y[n_seeds, n_probes] in seed order, each with at least 3 probes and 2 seeds to test.
    ({(condition, "fall"|"rise"): Decision} decided as one family, {condition: i*}); the margin is a share of
    the tested seeds' mean at i*. A positive ratio quantity (`on` RATIO, rules.compared_on; `what` names it in an
    error) is tested on per-seed log ratios instead, ln(y[0] / y[i*]) and ln(y[-1] / y[i*]), against the same
    relative margin: with no dip they are centred on 0 as the differences are, and a run's own scale cancels."""
    family, where = {}, {}
    for c, y in ys.items():
        i, fall, rise = dip(y)
        if i < 0:
            continue
        test = split_seeds(y.shape[0])[1]
        scale = float(nanmean(y[test, i]))
        where[c] = i
        if on == DIFFERENCE:
            family[(c, "fall")], family[(c, "rise")] = Paired.one_sample(fall, scale), Paired.one_sample(rise, scale)
            continue
        low = (f"{c}'s {what} at its probe {i}", )
        family[(c, "fall")] = Paired.ratio(y[test, 0], y[test, i], names=(f"{c}'s first {what}", *low),
                                           fallback=on == RATIO_WHERE_POSITIVE)
        family[(c, "rise")] = Paired.ratio(y[test, -1], y[test, i], names=(f"{c}'s last {what}", *low),
                                           fallback=on == RATIO_WHERE_POSITIVE)
    return decide(family, margin), where


def in_seed_order(runs: list[dict]) -> list[dict]:
    """Runs sorted by seed (numbers before names), so which seeds choose and which test depends on the seeds only."""
    return sorted(runs, key=lambda r: (not isinstance(seed_of(r), int), str(seed_of(r)).zfill(12)))


def enough(y: np.ndarray) -> str:
    """Why Y[n_seeds, n_probes] cannot be tested ('' when it can): it needs 3 probes and 2 seeds to test."""
    if y.shape[1] < 3:
        return "fewer than 3 probes"
    if len(split_seeds(y.shape[0])[1]) < 2:
        return (f"{y.shape[0]} seed(s), too few to choose the minimum on some and test it on at least two "
                f"others")
    return ""


def shape(fall: Decision, rise: Decision) -> str:
    """RISES when the fall and the rise are both positive beyond the margin, NO_RISE when either is decided
    otherwise (a series lowest at its end shows a rise inside the margin or negative), OPEN else."""
    ups = [d.differs and d.est > 0 for d in (fall, rise)]
    if all(ups):
        return RISES
    return NO_RISE if any(d.decided and not up for d, up in zip((fall, rise), ups)) else OPEN


def start(y: np.ndarray) -> float:
    """The tested seeds' mean at the first probe: what a fall is a share of (where the series started)."""
    return float(nanmean(y[split_seeds(y.shape[0])[1], 0]))


def _part(d: Decision, up: str, down: str, inside: str, open_: str) -> str:
    if d.differs:
        return up if d.est > 0 else down
    if d.same:
        return inside
    if d.outcome == UNRESOLVED:
        return f"{up if d.est > 0 else down} by a size the margin does not settle"
    return open_


def course_text(fall: Decision, rise: Decision) -> str:
    """What one series did, from what its fall and its rise each settle: 'falls and recovers', 'falls; still falls
    at the end', 'its fall is open; does not recover beyond the margin', 'open' (neither settled). A claim over
    several series names each one's course, never one word for all (docs/decisions.md)."""
    if shape(fall, rise) == RISES:
        return "falls and recovers"
    if not (fall.significant or fall.decided or rise.significant or rise.decided):
        return "open (neither its fall nor its recovery is settled)"
    went = _part(fall, "falls", "rises to the chosen probe instead of falling", "does not fall beyond the margin",
                 "its fall is open")
    back = _part(rise, "recovers", "still falls at the end, below the chosen probe",
                 "does not recover beyond the margin", "its recovery is open")
    return f"{went}; {back}"


def fall_rise_text(fall: Decision, rise: Decision, start_value: float) -> tuple[str, str]:
    """(fall, rise) as shares in words: the fall a share of where the series started (a halving is a fall of +50%,
    never a share of the low it fell to), the rise a share of the low it rises from, each with its interval
    (wording.effect_text): ('+50.0% [+45.1%, +54.9%] of the start', '+20.0% [...] of the low'). Decided on log ratios
    (a positive quantity, dip_decisions), a fall ln(y0 / y*) prints as 1 - y*/y0 and a rise ln(y_end / y*) as
    y_end/y* - 1, each interval mapped from the log interval that decided it (wording.printed: `first` for the fall),
    so printed ends and margin bounds keep the sides the decision read; on differences, shares of `start_value` (the
    fall) and of the low (the rise's scale)."""
    return (f"{effect_text(fall, of=start_value, first=True)} of the start",
            f"{effect_text(rise)} of the low")
