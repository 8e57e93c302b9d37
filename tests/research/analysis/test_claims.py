"""research/analysis/claims.py on seed sets built for each rule of issue 38: claim (c) against a perfect ordering
of the loss by PR, the single driver against steps of nearly one size, and claim (d) with one seed and on flat
trajectories. Each asserts the printed outcome word and the absence of the sentence the old rules printed."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from research.analysis import qk_norm
from research.analysis.dips import dip, dip_decisions, split_seeds
from research.analysis.rules import RATIO, finals
from research.plots.qk_norm_report import report
from tests.research.synthetic import qk_runs


def claim_line(text: str, letter: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"- ({letter}) "))


def test_pr_ordering_the_loss_in_the_same_direction_fails_the_claim():
    """PR A 50 > B 40 > C 30 and validation loss A > B > C, every pair beyond both margins: PR orders the loss
    perfectly. The old rule called each pair "apart" and the claim held."""
    a = qk_norm.analyze(qk_runs((50, 40, 30), (3.70, 3.65, 3.60)))
    c = a.claims["c"]
    assert c.status == "fails", c.text
    assert c.text.count("ordered, the higher-PR condition has the higher loss") == 3
    line = claim_line(report(a), "c")
    assert "**fails**" in line and "**holds**" not in line


def test_pairs_apart_hold_and_opposite_orderings_are_mixed():
    holds = qk_norm.analyze(qk_runs((50, 40, 30), (3.60, 3.60, 3.60)))  # PR moves, the loss stays inside its margin
    assert holds.claims["c"].status == "holds" and holds.claims["c"].text.count(": apart, one moves") == 3
    # A-B: higher PR, higher loss; B-C: higher PR, lower loss; A-C: PR beyond, loss inside: apart
    mixed = qk_norm.analyze(qk_runs((50, 40, 30), (3.70, 3.60, 3.70)))
    assert mixed.claims["c"].status == "mixed"
    # all three pairs ordered, in both directions (A 50 / 3.70, B 40 / 3.60, C 20 / 3.64), none apart
    opposite = qk_norm.analyze(qk_runs((50, 40, 20), (3.70, 3.60, 3.64)))
    assert opposite.claims["c"].status == "mixed" and "disagree in direction" in opposite.claims["c"].text


def test_steps_of_nearly_one_size_are_both_contributing_not_one_driver():
    """Issue 38's case: A-B +3.3% (beyond the 3% margin) and B-C +2.6% (within it) over 4 seeds. The old rule said
    "the gain drives key PR" and claim (a) held; the steps differ by +0.7% [+0.6%, +0.9%], inside the margin. Decided
    on log ratios (issue 64) A/B is +3.3% [+3.2%, +3.5%], B/C +2.7% [+2.6%, +2.8%] and (A/B)/(B/C) +0.6% [+0.5%,
    +0.8%]: the t intervals of the per-seed log ratios at 1 - 0.05/4, mapped back (checked against scipy's t here)."""
    a = qk_norm.analyze(qk_runs((106.0, 102.6, 99.9), (3.6, 3.6, 3.6), seeds=4, own_noise=0.05))
    assert a.verdict.key == "contribute", a.verdict.text
    assert a.steps["mean_pr"].same and a.steps["mean_pr"].ci_level == 1 - 0.05 / 4  # a family of four
    assert a.decisions["mean_pr"][("QK", "QK_frozen")].ci_level == 1 - 0.05 / 4
    text = report(a)
    assert "the gain drives" not in text
    assert "both the gain and the normalization contribute to key PR" in text
    assert "the gain's effect (A/B) +3.3% [+3.2%, +3.5%] lies beyond the margin" in text
    assert "the normalization's effect (B/C) +2.7% [+2.6%, +2.8%] is real but lies within the margin" in text
    assert "the difference of the steps ((A/B)/(B/C)) +0.6% [+0.5%, +0.8%] is real but lies within the margin" in text
    pr = {c: np.array(list(finals(a.runs, c, "mean_pr").values())) for c in ("QK", "QK_frozen", "NoQK")}
    x = np.log(pr["QK"] / pr["QK_frozen"])
    half = stats.t.ppf(1 - 0.05 / 8, 3) * x.std(ddof=1) / 2
    assert a.decisions["mean_pr"][("QK", "QK_frozen")].ci_rel == pytest.approx(np.expm1([x.mean() - half,
                                                                                          x.mean() + half]))
    assert "**fails**" in claim_line(text, "a")
    # A clear driver still is one: A-B 10, B-C 0 per seed, the steps differ by 10
    gain = qk_norm.analyze(qk_runs((50, 40, 40), (3.6, 3.6, 3.6)))
    assert gain.verdict.key == "gain" and gain.verdict.text.startswith("the gain drives key PR: its step is larger")
    assert gain.claims["a"].status == "holds"


def test_u_shape_is_not_tested_with_one_or_two_seeds():
    """One seed per condition: the old rule said "fails" for a monotone fall. Two seeds: one would choose the
    minimum and one test it, no test."""
    for seeds in (1, 2):
        for shape in ("mono", "u"):
            a = qk_norm.analyze(qk_runs((50, 40, 40), (3.6, 3.6, 3.6), seeds=seeds, shape=shape))
            d = a.claims["d"]
            assert d.status == "not tested", (seeds, shape, d.text)
            assert "**not tested**" in claim_line(report(a), "d") and "fails" not in claim_line(report(a), "d")
    three = qk_norm.analyze(qk_runs((50, 40, 40), (3.6, 3.6, 3.6), seeds=3))
    assert three.claims["d"].status == "holds"  # seed 1 chooses, seeds 0 and 2 test


def test_the_choosing_seeds_are_not_the_tested_ones():
    assert [r.tolist() for r in split_seeds(5)] == [[1, 3], [0, 2, 4]]
    y = np.array([[9.0, 5.0, 7.0, 8.0, 9.0],    # tested: its own minimum at probe 1
                  [9.0, 8.0, 7.0, 2.0, 9.0],    # chooses: probe 3
                  [9.0, 5.0, 7.0, 8.0, 9.0]])
    i, fall, rise = dip(y)
    assert i == 3 and fall.tolist() == [1.0, 1.0] and rise.tolist() == [1.0, 1.0]


def test_flat_trajectories_call_the_fall_different_at_most_at_its_bonferroni_share():
    """2,000 families of three flat conditions (4 seeds, 8 probes; a seed offset and independent noise per probe,
    no true dip). The fall is called different (its interval excludes 0) in at most 0.05/6 of the tests, the
    share of one of the family's six comparisons. Choosing the minimum on the tested seeds themselves, as the
    old rule did, roughly doubles that rate here. The fast path below is checked against dip_decisions on the
    first 100 families."""
    rng = np.random.default_rng(38)
    n_seeds, n_probes, k, n_families = 4, 8, 6, 2000
    share = 0.05 / k
    crit_new = stats.t.ppf(1 - share / 2, len(split_seeds(n_seeds)[1]) - 1)
    crit_old = stats.t.ppf(1 - share / 2, n_seeds - 1)

    def t_stat(x):
        return abs(x.mean()) / (x.std(ddof=1) / np.sqrt(x.size))
    new = old = logs = 0
    test = split_seeds(n_seeds)[1]
    for f in range(n_families):
        ys = {c: 50 + rng.normal(0, 2, (n_seeds, 1)) + rng.normal(0, 1, (n_seeds, n_probes)) for c in "ABC"}
        falls = {c: dip(y)[1] for c, y in ys.items()}
        called = {c: t_stat(x) > crit_new for c, x in falls.items()}
        new += sum(called.values())
        # key PR is decided on log ratios (issue 64): the fall is ln(y[0] / y[i*]) of the same tested seeds
        on_logs = {c: t_stat(np.log(y[test, 0] / y[test, dip(y)[0]])) > crit_new for c, y in ys.items()}
        logs += sum(on_logs.values())
        if f < 100:
            dec = dip_decisions(ys, 0.03)[0]
            assert {c: dec[(c, "fall")].significant for c in ys} == called
            dec = dip_decisions(ys, 0.03, RATIO)[0]
            assert {c: dec[(c, "fall")].significant for c in ys} == on_logs
        for y in ys.values():
            j = int(np.argmin(y.mean(axis=0)))
            old += bool(0 < j < n_probes - 1 and t_stat(y[:, 0] - y[:, j]) > crit_old)
    assert new / (3 * n_families) <= share
    assert logs / (3 * n_families) <= share  # 0.73% against 0.83% with this seed
    assert old / (3 * n_families) > 1.5 * share
