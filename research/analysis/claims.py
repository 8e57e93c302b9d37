"""The write-ups' claims about the QK-norm study, each decided by research.analysis.rules.

    (a) the learned gain drives key PR (A != B, B ~ C, and the gain's step larger than the other by the margin)
    (b) the normalization drives the loss (A ~ B, B != C, ...), on the validation loss
    (c) key PR does not predict loss (validation loss): PR ordering the loss, in either direction, fails it
    (d) the PR trajectory is U-shaped (falls, then recovers): the minimum chosen on half of the seeds, tested
        on the other half
    (e) a frozen gain lowers key rank below no QK-norm (final PR B < C)

"!=" is a difference beyond the margin, "~" one inside it (research.analysis.rules). Each Claim has a
status, "holds", "fails", "mixed" (the pairs disagree), "inconclusive" or "not tested" (missing
conditions, or one seed per condition: descriptive only), and its evidence in words.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from research.analysis.rules import MARGIN, Decision, Paired, decide, effect_text, needed_text, runs_of
from research.analysis.series import aligned, nanmean
from research.results.read import seed_of
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
    """Holds when the verdict names `want` as the single driver (its step larger than the other's by the margin);
    fails when a step's settled size contradicts the claim (A ~ B for the gain, B ~ C for the normalization, or
    the other step beyond the margin) or the two steps are shown to differ by less than the margin (verdict
    "contribute"); else inconclusive."""
    if verdict.key in ("none", "descriptive", "qknorm"):  # qknorm: without B the gain cannot be separated
        return Claim(claim, UNTESTED, verdict.text + ".")
    if verdict.key == want:
        return Claim(claim, HOLDS, f"verdict: {verdict.text}.")
    ab, bc = dec[QK_PAIRS[0]], dec[QK_PAIRS[1]]
    contrary = verdict.key == "contribute" or ((ab.same or bc.differs) if want == "gain" else
                                                (ab.differs or bc.same))
    return Claim(claim, FAILS if contrary else OPEN, f"verdict: {verdict.text}.")


def _pr_and_loss(decisions: dict) -> Claim:
    """Per pair, on pr_sv and the validation loss: ORDERED when both differ beyond their margins (higher PR with
    higher loss, or higher PR with lower loss: the pair's sign); APART when one differs beyond its margin and the
    other lies inside its own; both inside says nothing; anything unsettled is not settled. PR predicts the loss
    when pairs are ordered, all with one sign, and none is apart: the claim fails. It holds when some pairs are
    apart and none ordered; mixed when both occur, or when ordered pairs disagree in sign; inconclusive when no
    pair is settled either way (docs/decisions.md)."""
    claim = "key PR does not predict loss (validation loss)"
    pr, loss = decisions["mean_pr"], decisions["val_loss"]
    if not pr:
        return Claim(claim, UNTESTED, "needs at least two conditions.")
    if not any(d.tested for d in pr.values()):
        return Claim(claim, UNTESTED, "one seed per condition (descriptive only).")
    apart, signs, parts = [], set(), []
    for pair, p in pr.items():
        lo = loss[pair]
        name = "\u2212".join(LETTERS[c] for c in pair)
        head = f"{name}: PR {effect_text(p)} {p.outcome}, loss {effect_text(lo)} {lo.outcome}"
        if not (p.decided and lo.decided):
            parts.append(f"{head}: not settled")
        elif p.differs and lo.differs:
            same = (p.diff > 0) == (lo.diff > 0)
            signs.add(same)
            parts.append(f"{head}: ordered, the higher-PR condition has the {'higher' if same else 'lower'} loss")
        elif p.differs or lo.differs:
            apart.append(name)
            parts.append(f"{head}: apart, one moves beyond its margin, the other not")
        else:
            parts.append(f"{head}: neither moves beyond its margin")
    if signs and not apart and len(signs) == 1:
        status, why = FAILS, (f"PR orders the loss: in every ordered pair the higher-PR condition has the "
                              f"{'higher' if signs == {True} else 'lower'} loss, and no pair is apart")
    elif apart and signs:
        status, why = MIXED, "some pairs are apart, others ordered"
    elif len(signs) == 2:
        status, why = MIXED, "ordered pairs disagree in direction"
    else:
        status, why = (HOLDS, "pairs apart, none ordered") if apart else (OPEN, "no pair settled either way")
    return Claim(claim, status, f"{why}. " + "; ".join(parts) + ".")


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


def dip_decisions(ys: dict, margin: float) -> tuple[dict, dict]:
    """ys: condition -> Y[n_seeds, n_probes] in seed order, each with at least 3 probes and 2 seeds to test.
    ({(condition, "fall"|"rise"): Decision} decided as one family, {condition: i*}); the margin is a share of
    the tested seeds' mean at i*."""
    family, where = {}, {}
    for c, y in ys.items():
        i, fall, rise = dip(y)
        if i < 0:
            continue
        scale = float(nanmean(y[split_seeds(y.shape[0])[1], i]))
        where[c] = i
        family[(c, "fall")], family[(c, "rise")] = Paired.one_sample(fall, scale), Paired.one_sample(rise, scale)
    return decide(family, margin), where


def _in_seed_order(runs: list[dict]) -> list[dict]:
    """Runs sorted by seed (numbers before names), so which seeds choose and which test depends on the seeds only."""
    return sorted(runs, key=lambda r: (not isinstance(seed_of(r), int), str(seed_of(r)).zfill(12)))


def _u_shape(runs: dict, conds: list[str], margin: float) -> Claim:
    """Per condition the probe i* is chosen on half of the seeds (the interior probe lowest in their mean) and
    the fall (start - value at i*) and the rise (end - value at i*) are tested against 0 on the other half
    (dip; Bonferroni over all of them, margin a share of the tested seeds' mean at i*). A condition is
    U-shaped when both are positive beyond the margin, not U-shaped when either is decided otherwise (a
    trajectory lowest at its end shows a rise inside the margin or negative there), open else; fewer than two
    seeds to test: not tested."""
    claim = "the PR trajectory is U-shaped (falls, then recovers)"
    ys, xs, parts, shapes = {}, {}, [], []
    for c in conds:
        xs[c], y = aligned(_in_seed_order(runs_of(runs, c)), lambda r: r["mean_pr"])
        if y.shape[1] < 3 or len(split_seeds(y.shape[0])[1]) < 2:
            parts.append(f"{LETTERS[c]}: " + ("fewer than 3 probes" if y.shape[1] < 3 else
                                              f"{y.shape[0]} seed(s), too few to choose the minimum on some and "
                                              f"test it on at least two others"))
            shapes.append(UNTESTED)
        else:
            ys[c] = y
    dec, where = dip_decisions(ys, margin)
    for c, y in ys.items():
        if c not in where:
            parts.append(f"{LETTERS[c]}: no PR values")
            shapes.append(UNTESTED)
            continue
        i, mean = where[c], nanmean(y[split_seeds(y.shape[0])[1]], axis=0)
        fall, rise = dec[(c, "fall")], dec[(c, "rise")]
        rises = [d.differs and d.diff > 0 for d in (fall, rise)]
        if all(rises):
            shapes.append(HOLDS)
        elif any(d.decided and not up for d, up in zip((fall, rise), rises)):
            shapes.append(FAILS)
        else:
            shapes.append(OPEN)
        parts.append(f"{LETTERS[c]} (tested seeds' mean): {mean[0]:.1f} \u2192 {mean[i]:.1f} at {xs[c][i] / 1e6:.3g}M "
                     f"tokens (the probe the other seeds chose) \u2192 {mean[-1]:.1f}; fall {fmt_decision(fall)}, "
                     f"rise {fmt_decision(rise)}")
    status = (HOLDS if shapes and all(s == HOLDS for s in shapes) else FAILS if FAILS in shapes
              else UNTESTED if not shapes or UNTESTED in shapes else OPEN)
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
