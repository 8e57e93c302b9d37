"""The write-ups' claims about the QK-norm study, each decided by research.analysis.rules.

    (a) the learned gain drives key PR (A != B, B ~ C)
    (b) the normalization drives the loss (A ~ B, B != C), on the validation loss
    (c) key PR does not predict loss (validation loss)
    (d) the PR trajectory is U-shaped (falls, then recovers)
    (e) a frozen gain lowers key rank below no QK-norm (final PR B < C)

"!=" is a difference beyond the margin, "~" one inside it (research.analysis.rules). Each Claim has a
status, "holds", "fails", "mixed" (the pairs disagree), "inconclusive" or "not tested" (missing
conditions, or one seed per condition: descriptive only), and its evidence in words.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from research.analysis.rules import MARGIN, Decision, Paired, decide, effect_text, needed_text, runs_of
from research.analysis.series import aligned
from research.results.vocabulary import LETTERS, QK_CONDITIONS, QK_PAIRS

HOLDS, FAILS, MIXED, OPEN, UNTESTED = "holds", "fails", "mixed", "inconclusive", "not tested"


@dataclass(frozen=True)
class Claim:
    claim: str
    status: str
    text: str  # the evidence


def fmt_decision(d: Decision, decimals: int = 1) -> str:
    """'+3.2 (+12.5% [+4.0%, +21.0%], different, beyond the margin)' for report sentences."""
    if not d.tested:
        return f"{d.diff:+.{decimals}f} ({d.outcome})" if d.n else d.outcome
    more = needed_text(d)
    return f"{d.diff:+.{decimals}f} ({effect_text(d)}, {d.outcome}{'; ' + more if more else ''})"


def _driver(claim: str, verdict, dec: dict, want: str) -> Claim:
    """Holds when the verdict names `want`; fails when a step's settled size contradicts the claim (A ~ B for
    the gain, B ~ C for the normalization, or the other step beyond the margin); else inconclusive."""
    if verdict.key in ("none", "descriptive", "qknorm"):  # qknorm: without B the gain cannot be separated
        return Claim(claim, UNTESTED, verdict.text + ".")
    if verdict.key == want:
        return Claim(claim, HOLDS, f"verdict: {verdict.text}.")
    ab, bc = dec[QK_PAIRS[0]], dec[QK_PAIRS[1]]
    contrary = (ab.same or bc.differs) if want == "gain" else (ab.differs or bc.same)
    return Claim(claim, FAILS if contrary else OPEN, f"verdict: {verdict.text}.")


def _pr_and_loss(decisions: dict) -> Claim:
    """Per pair: PR and validation loss move APART (one beyond the margin, the other inside it; or both beyond
    it with higher PR going with higher loss) or TOGETHER (both beyond it, higher PR with lower loss); both
    inside the margin says nothing. Holds when some pairs are apart and none together, fails when the
    reverse, mixed when both occur, inconclusive when no pair is settled either way."""
    claim = "key PR does not predict loss (validation loss)"
    pr, loss = decisions["mean_pr"], decisions["val_loss"]
    if not pr:
        return Claim(claim, UNTESTED, "needs at least two conditions.")
    if not any(d.tested for d in pr.values()):
        return Claim(claim, UNTESTED, "one seed per condition (descriptive only).")
    apart, together, parts = [], [], []
    for pair, p in pr.items():
        lo = loss[pair]
        name = "\u2212".join(LETTERS[c] for c in pair)
        head = f"{name}: PR {effect_text(p)} {p.outcome}, loss {effect_text(lo)} {lo.outcome}"
        if not (p.decided and lo.decided):
            parts.append(f"{head}: not settled")
        elif p.differs and lo.differs and (p.diff > 0) == (lo.diff < 0):
            together.append(name)
            parts.append(f"{head}: the higher-PR condition has the lower loss")
        elif p.differs or lo.differs:
            apart.append(name)
            parts.append(head + (": the higher-PR condition has the higher loss" if p.differs and lo.differs else
                                 ": one moves beyond the margin, the other not"))
        else:
            parts.append(f"{head}: neither moves beyond the margin")
    status = (MIXED if apart and together else HOLDS if apart else FAILS if together else OPEN)
    return Claim(claim, status, "; ".join(parts) + ".")


def _u_shape(runs: dict, conds: list[str], margin: float) -> Claim:
    """Per condition the minimum of the seed-mean trajectory fixes the probe i*; per seed the fall
    (start - value at i*) and the rise (end - value at i*) are each tested against 0 (Bonferroni over all of
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
        if not (fall.tested and rise.tested):
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
    loss = decisions["val_loss"][("QK_frozen", "NoQK")]
    text = f"B \u2212 C final PR {fmt_decision(d)}; final validation loss {fmt_decision(loss, 3)}."
    if not d.tested:
        return Claim(claim, UNTESTED, text)
    status = HOLDS if d.differs and d.diff < 0 else FAILS if d.decided else OPEN
    return Claim(claim, status, text)


def claims(runs: dict, decisions: dict, pr_verdict, loss_verdict, margin: float = MARGIN) -> dict[str, Claim]:
    """The write-ups' claims keyed a-e; decisions and verdicts come from research.analysis.qk_norm (loss_verdict:
    the validation loss's)."""
    conds = [c for c in QK_CONDITIONS if runs.get(c)]
    pr, val = decisions["mean_pr"], decisions["val_loss"]
    return {"a": _driver("the learned gain drives key PR (A\u2260B, B\u2248C)", pr_verdict, pr, "gain"),
            "b": _driver("the normalization drives the validation loss (A\u2248B, B\u2260C)", loss_verdict, val,
                         "normalization"),
            "c": _pr_and_loss(decisions), "d": _u_shape(runs, conds, margin), "e": _frozen_rank(decisions)}
