"""The write-ups' claims about the QK-norm study, each decided by research.analysis.rules.

    (a) the learned gain drives key PR (A != B, B ~ C)
    (b) the normalization drives the loss (A ~ B, B != C)
    (c) key PR does not predict loss
    (d) the PR trajectory is U-shaped (falls, then recovers)
    (e) a frozen gain lowers key rank below no QK-norm (final PR B < C)

Each Claim has a status, "holds", "fails", "inconclusive" or "not tested" (missing conditions, or one
seed per condition: descriptive only), and its evidence in words.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from research.analysis.rules import DESCRIPTIVE, MARGIN, Decision, Paired, decide, runs_of
from research.analysis.series import aligned
from research.results.vocabulary import LETTERS, QK_CONDITIONS

HOLDS, FAILS, OPEN, UNTESTED = "holds", "fails", "inconclusive", "not tested"


@dataclass(frozen=True)
class Claim:
    claim: str
    status: str
    text: str  # the evidence


def fmt_decision(d: Decision, decimals: int = 1) -> str:
    """'+3.2 (12.5%, CI [+1.0, +5.4], different)' for report sentences."""
    if d.outcome == DESCRIPTIVE:
        return f"{d.diff:+.{decimals}f} (one seed: descriptive)"
    lo, hi = d.ci
    more = f"; about {d.seeds_needed} seeds would decide it" if d.seeds_needed else ""
    return f"{d.diff:+.{decimals}f} ({d.rel:+.1%}, CI [{lo:+.{decimals}f}, {hi:+.{decimals}f}], {d.outcome}{more})"


def _from_verdict(claim: str, verdict, want: str) -> Claim:
    if verdict.key in ("none", "descriptive", "qknorm"):  # qknorm: without B the gain cannot be separated
        return Claim(claim, UNTESTED, verdict.text + ".")
    if verdict.key == "inconclusive":
        return Claim(claim, OPEN, verdict.text + ".")
    return Claim(claim, HOLDS if verdict.key == want else FAILS, f"verdict: {verdict.text}.")


def _pr_and_loss(decisions: dict) -> Claim:
    """Holds when some pair shows PR and loss moving apart (one differs, the other not; or the higher-PR
    condition has the higher loss); fails when every pair is decided and higher PR goes with lower loss."""
    claim = "key PR does not predict loss"
    pr, loss = decisions["mean_pr"], decisions["loss"]
    if not pr:
        return Claim(claim, UNTESTED, "needs at least two conditions.")
    if all(d.outcome == DESCRIPTIVE for d in pr.values()):
        return Claim(claim, UNTESTED, "one seed per condition (descriptive only).")
    apart, together, parts = 0, 0, []
    for (x, y), p in pr.items():
        lo = loss[(x, y)]
        pair = f"{LETTERS[x]} vs {LETTERS[y]}"
        if not (p.decided and lo.decided):
            parts.append(f"{pair}: undecided (PR {p.outcome}, loss {lo.outcome})")
        elif p.differs and lo.differs and (p.diff > 0) == (lo.diff < 0):
            together += 1
            parts.append(f"{pair}: the higher-PR condition has the lower loss")
        elif p.differs or lo.differs:
            apart += 1
            parts.append(f"{pair}: PR {p.outcome}, loss {lo.outcome}"
                         + (" (the higher-PR condition has the higher loss)" if p.differs and lo.differs else ""))
        else:
            parts.append(f"{pair}: neither PR nor loss differs")
    status = HOLDS if apart else FAILS if together == len(pr) else OPEN
    return Claim(claim, status, "; ".join(parts) + ".")


def _u_shape(runs: dict, conds: list[str], margin: float) -> Claim:
    """Per condition the minimum of the seed-mean trajectory fixes the probe i*; per seed the fall
    (start - value at i*) and the rise (end - value at i*) are each tested against 0 (Holm over all of
    them, margin a share of the value at i*). U-shaped: both differ and are positive. Choosing i* from
    the same data favours finding a dip; the test guards only against noise of that size."""
    claim = "the PR trajectory is U-shaped (falls, then recovers)"
    family, where, untestable = {}, {}, []
    for c in conds:
        x, y = aligned(runs_of(runs, c), lambda r: r["mean_pr"])
        if y.shape[1] < 3:
            untestable.append(f"{LETTERS[c]}: fewer than 3 probes")
            continue
        mean = np.nanmean(y, axis=0)
        i = int(np.nanargmin(mean))
        where[c] = (i, x, mean)
        if 0 < i < y.shape[1] - 1:
            family[(c, "fall")] = Paired.one_sample(y[:, 0] - y[:, i], mean[i])
            family[(c, "rise")] = Paired.one_sample(y[:, -1] - y[:, i], mean[i])
    dec = decide(family, margin)
    parts, shapes = list(untestable), []
    for c, (i, x, mean) in where.items():
        head = f"{LETTERS[c]}: {mean[0]:.1f} \u2192 min {mean[i]:.1f} at {x[i] / 1e6:.3g}M tokens \u2192 {mean[-1]:.1f}"
        if (c, "fall") not in dec:
            shapes.append(FAILS)
            parts.append(f"{head}, minimum at the {'start' if i == 0 else 'end'}: not U-shaped")
            continue
        fall, rise = dec[(c, "fall")], dec[(c, "rise")]
        if DESCRIPTIVE in (fall.outcome, rise.outcome):
            shapes.append(UNTESTED)
        elif fall.differs and rise.differs and fall.diff > 0 and rise.diff > 0:
            shapes.append(HOLDS)
        elif fall.decided and rise.decided:
            shapes.append(FAILS)
        else:
            shapes.append(OPEN)
        parts.append(f"{head}; fall {fmt_decision(fall)}, rise {fmt_decision(rise)}")
    status = (UNTESTED if not shapes or UNTESTED in shapes else HOLDS if all(s == HOLDS for s in shapes)
              else FAILS if FAILS in shapes else OPEN)
    return Claim(claim, status, "; ".join(parts) + ".")


def _frozen_rank(decisions: dict) -> Claim:
    claim = "a frozen gain lowers key rank below no QK-norm (final PR B < C)"
    d = decisions["mean_pr"].get(("QK_frozen", "NoQK"))
    if d is None:
        return Claim(claim, UNTESTED, "needs QK_frozen and NoQK.")
    loss = decisions["loss"][("QK_frozen", "NoQK")]
    text = f"B \u2212 C final PR {fmt_decision(d)}; final train loss {fmt_decision(loss, 3)}."
    if d.outcome == DESCRIPTIVE:
        return Claim(claim, UNTESTED, text)
    status = HOLDS if d.differs and d.diff < 0 else OPEN if not d.decided else FAILS
    return Claim(claim, status, text)


def claims(runs: dict, decisions: dict, pr_verdict, loss_verdict, margin: float = MARGIN) -> dict[str, Claim]:
    """The write-ups' claims keyed a-e; decisions and verdicts come from research.analysis.qk_norm."""
    conds = [c for c in QK_CONDITIONS if runs.get(c)]
    return {"a": _from_verdict("the learned gain drives key PR (A\u2260B, B\u2248C)", pr_verdict, "gain"),
            "b": _from_verdict("the normalization drives the loss (A\u2248B, B\u2260C)", loss_verdict,
                               "normalization"),
            "c": _pr_and_loss(decisions), "d": _u_shape(runs, conds, margin), "e": _frozen_rank(decisions)}

