"""The write-ups' claims about the QK-norm study, each decided by research.analysis.rules.

    (a) the learned gain drives key PR         (b) the normalization drives the loss (validation loss)
    (c) key PR does not predict loss           (d) the PR trajectory is U-shaped (falls, then recovers)
    (e) a frozen gain lowers key rank below no QK-norm (final PR B < C)

Each Claim has a status ("holds", "fails", "mixed", "inconclusive" or "not tested") and its evidence in words.
How each is decided, with worked examples: docs/decisions.md, "The write-ups' claims".
"""
from __future__ import annotations

from dataclasses import dataclass


from research.analysis import dips
from research.analysis.dips import dip_decisions, in_seed_order, split_seeds
from research.analysis.rules import DESCRIPTIVE, MARGIN, Decision, compared_on, runs_of
from research.analysis.wording import effect_text, needed_text, untested_text
from research.analysis.series import aligned, nanmean
from research.results.vocabulary import LETTERS, QK_CONDITIONS, QK_PAIRS

HOLDS, FAILS, MIXED, OPEN, UNTESTED = "holds", "fails", "mixed", "inconclusive", "not tested"


@dataclass(frozen=True)
class Claim:
    claim: str
    status: str
    text: str  # the evidence


def fmt_decision(d: Decision, decimals: int = 1, share: str | None = None) -> str:
    """'+3.2 (+12.5% [+4.0%, +21.0%], different, beyond the margin)' for report sentences; `share`: the shares in
    words, where they are not of the compared values' mean ('+50.0% [...] of the start')."""
    if not d.tested:
        return f"{d.diff:+.{decimals}f} ({d.outcome})" if d.n else d.outcome
    return f"{d.diff:+.{decimals}f} ({share or effect_text(d)}, {d.outcome}{needed_text(d)})"


def _driver(claim: str, verdict, dec: dict, want: str, named: str) -> Claim:
    """Holds when the verdict names `want` as the single driver (its step larger than the other's by the margin);
    fails when a step's settled size contradicts the claim (A ~ B for the gain, B ~ C for the normalization, or
    the other step beyond the margin) or the two steps are shown to differ by less than the margin (verdict
    "contribute"); else inconclusive. Its evidence is the verdict `named` (e.g. 'the key-PR verdict'), which the
    report states with its estimates once, under Verdicts: the claim names it and its head, not its estimates."""
    said = f"as {named} says (Verdicts)."
    if verdict.key in ("none", "descriptive", "qknorm"):  # qknorm: without B the gain cannot be separated
        return Claim(claim, UNTESTED, said)
    if verdict.key == want:
        return Claim(claim, HOLDS, said)
    ab, bc = dec[QK_PAIRS[0]], dec[QK_PAIRS[1]]
    contrary = verdict.key == "contribute" or ((ab.same or bc.differs) if want == "gain" else
                                                (ab.differs or bc.same))
    return Claim(claim, FAILS if contrary else OPEN, said)


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
        if any(d.outcome == DESCRIPTIVE for d in pr.values()):
            return Claim(claim, UNTESTED, "one seed per condition (descriptive only).")
        why = ("\u2212".join(LETTERS[c] for c in pair) + " " + untested_text(d, 2) for pair, d in pr.items())
        return Claim(claim, UNTESTED, "no pair has an interval: " + "; ".join(why) + ".")
    apart, signs, parts = [], set(), []
    for pair, p in pr.items():
        lo = loss[pair]
        name = "\u2212".join(LETTERS[c] for c in pair)
        head = f"{name}: PR {effect_text(p)} {p.outcome}, loss {effect_text(lo)} {lo.outcome}"
        if not (p.decided and lo.decided):
            parts.append(f"{head}: not settled")
        elif p.differs and lo.differs:
            same = (p.est > 0) == (lo.est > 0)
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


def _u_shape(runs: dict, conds: list[str], margin: float) -> Claim:
    """Per condition the probe i* is chosen on half of the seeds (the interior probe lowest in their mean) and
    the fall (start - value at i*) and the rise (end - value at i*) are tested against 0 on the other half
    (dip; Bonferroni over all of them, margin a share of the tested seeds' mean at i*). A condition is
    U-shaped when both are positive beyond the margin, not U-shaped when either is decided otherwise (a
    trajectory lowest at its end shows a rise inside the margin or negative there), open else; fewer than two
    seeds to test: not tested."""
    claim = "the PR trajectory is U-shaped (falls, then recovers)"
    ys, xs, parts, shapes, untested = {}, {}, [], [], {}
    for c in conds:
        xs[c], y = aligned(in_seed_order(runs_of(runs, c)), lambda r: r["mean_pr"])
        if why := dips.enough(y):
            untested.setdefault(why, []).append(LETTERS[c])  # one reason said once, for every condition it holds for
            shapes.append(UNTESTED)
        else:
            ys[c] = y
    parts += [f"{', '.join(letters)}: {why}" for why, letters in untested.items()]
    dec, where = dip_decisions(ys, margin, compared_on("mean_pr"), "key PR")
    courses = {c: f"{c} not tested" for c in conds}  # each condition's own outcome, in the claim's first sentence
    for c, y in ys.items():
        if c not in where:
            parts.append(f"{LETTERS[c]}: no PR values")
            shapes.append(UNTESTED)
            continue
        tested = split_seeds(y.shape[0])[1]
        i, mean = where[c], nanmean(y[tested], axis=0)
        fall, rise = dec[(c, "fall")], dec[(c, "rise")]
        shapes.append({dips.RISES: HOLDS, dips.NO_RISE: FAILS, dips.OPEN: OPEN}[dips.shape(fall, rise)])
        span = xs[c][-1] - xs[c][i]
        courses[c] = (f"{c}: {dips.course_text(fall, rise)} (tested on {len(tested)} seeds; the rise measured over "
                      f"{'the last ' if i == y.shape[1] - 2 else ''}{span:,.0f} tokens)")
        fall_share, rise_share = dips.fall_rise_text(fall, rise, dips.start(y))
        parts.append(f"{LETTERS[c]} (tested seeds' mean): {mean[0]:.1f} \u2192 {mean[i]:.1f} at {xs[c][i] / 1e6:.3g}M "
                     f"tokens (the probe the other seeds chose) \u2192 {mean[-1]:.1f}; fall "
                     f"{fmt_decision(fall, share=fall_share)}, rise {fmt_decision(rise, share=rise_share)}")
    status = (HOLDS if shapes and all(s == HOLDS for s in shapes) else FAILS if FAILS in shapes
              else UNTESTED if not shapes or UNTESTED in shapes else OPEN)
    return Claim(claim, status, "; ".join(courses.values()) + ". " + "; ".join(parts) + ".")


def _frozen_rank(decisions: dict) -> Claim:
    claim = "a frozen gain lowers key rank below no QK-norm (final PR B < C)"
    d = decisions["mean_pr"].get(("QK_frozen", "NoQK"))
    if d is None:
        return Claim(claim, UNTESTED, "needs QK_frozen and NoQK.")
    loss = decisions["val_loss"][("QK_frozen", "NoQK")]
    text = f"B \u2212 C final PR {fmt_decision(d)}; final validation loss {fmt_decision(loss, 3)}."
    if not d.tested:
        return Claim(claim, UNTESTED, text)
    status = HOLDS if d.differs and d.est < 0 else FAILS if d.decided else OPEN
    return Claim(claim, status, text)


def claims(runs: dict, decisions: dict, pr_verdict, loss_verdict, margin: float = MARGIN) -> dict[str, Claim]:
    """The write-ups' claims keyed a-e; decisions and verdicts come from research.analysis.qk_norm (loss_verdict:
    the validation loss's)."""
    conds = [c for c in QK_CONDITIONS if runs.get(c)]
    pr, val = decisions["mean_pr"], decisions["val_loss"]
    return {"a": _driver("the learned gain drives key PR (A\u2260B, B\u2248C)", pr_verdict, pr, "gain",
                         "the key-PR verdict"),
            "b": _driver("the normalization drives the validation loss (A\u2248B, B\u2260C)", loss_verdict, val,
                         "normalization", "the validation-loss verdict"),
            "c": _pr_and_loss(decisions), "d": _u_shape(runs, conds, margin), "e": _frozen_rank(decisions)}
