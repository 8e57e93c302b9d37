"""Deciding a family at a study's recorded looks (research.analysis.sequential.at_looks), against values worked by
hand: each look sees its own seeds, at its own level, and the outcome is read off the intersection."""
import numpy as np
import pytest

from research.analysis.rules import DIFFERENT, INCONCLUSIVE, Margin, Paired, decide, decide_once
from research.analysis.wording import needed_text, rule_text, settle_line
from research.analysis.sequential import (Design, Look, at_looks, boundaries, decide_at, design_of, error_bound,
                                          looks_of, plan)

# Seeds 0-3 differ by 2.0, 2.02, 1.98, 2.0; seeds 4 and 5 by -3 and 7. Look 1 (seeds 0-3) at alpha 0.025, one
# comparison: mean 2, sd sqrt(0.0008 / 3) = 0.016330, t(3, 0.9875) = 4.176535 -> half 0.034101: [1.965899,
# 2.034101]. Look 2 (all six) alone: mean 2, sd sqrt(50.0008 / 5) = 3.162303, t(5, 0.9875) = 3.163381 -> half
# 4.083941: [-2.08, 6.08], inconclusive against a margin of 0.5; the intersection is look 1's interval, beyond it.
DIFFS = [2.0, 2.02, 1.98, 2.0, -3.0, 7.0]
LOOKS = [Look((0, 1, 2, 3), 0.025), Look((0, 1, 2, 3, 4, 5), 0.025, planned=False)]
MARGIN = Margin(0.5, absolute=True)


def family(seeds=tuple(range(6))):
    return {"x": Paired(np.array(DIFFS), 2.0, 0.0, 2.0, seeds)}


def test_each_look_sees_its_own_seeds_and_the_outcome_is_read_off_the_intersection():
    d = decide_at(family(), LOOKS, MARGIN)["x"]
    assert d.ci == pytest.approx((1.965899, 2.034101), abs=1e-5) and d.outcome == DIFFERENT
    alone = decide_once(family(), MARGIN, 0.025)["x"]
    assert alone.ci == pytest.approx((2 - 4.083941, 2 + 4.083941), abs=1e-5) and alone.outcome == INCONCLUSIVE
    assert d.n == 6 and d.ci_level == pytest.approx(1 - 0.025)  # the last look's seeds and level


def test_within_at_looks_every_decide_decides_at_the_looks_and_after_it_at_one():
    with at_looks(LOOKS):
        assert decide(family(), MARGIN)["x"].ci == pytest.approx((1.965899, 2.034101), abs=1e-5)
    assert decide(family(), MARGIN)["x"].outcome == INCONCLUSIVE  # at 0.05 on all six seeds: [-1.41, 5.41]
    with at_looks([Look(tuple(range(6)), 0.05)]):  # one look at the full level: the fixed design, no correction
        assert decide(family(), MARGIN)["x"].ci == decide_once(family(), MARGIN)["x"].ci


def test_a_comparison_whose_seeds_are_unknown_is_decided_at_the_last_look_alone():
    d = decide_at(family(seeds=None), LOOKS, MARGIN)["x"]
    assert d.ci == pytest.approx((2 - 4.083941, 2 + 4.083941), abs=1e-5) and d.outcome == INCONCLUSIVE


def test_the_error_bound_adds_unplanned_looks_and_counts_a_design_whole():
    assert error_bound([Look((0, 1), 0.05), Look((0, 1, 2), 0.05, planned=False)]) == pytest.approx(0.10)
    design = plan(2, 4, 1)
    assert error_bound([Look((0, 1), design.levels[0])], design) == pytest.approx(0.05)  # stopped early: as planned


def test_looks_and_design_are_read_from_a_study_index():
    assert looks_of({"seeds": [0, 1, 2], "looks": None}) == [Look((0, 1, 2), 0.05)]  # no looks: one, at full alpha
    assert looks_of({"seeds": [0, 1], "looks": []}) == []
    assert looks_of({"looks": [{"seeds": [0, 1], "alpha": 0.00625, "planned": True}]}) == [Look((0, 1), 0.00625)]
    record = {"seeds": [0, 1], "max_seeds": 4, "round": 1, "rho": 3.0, "alpha": 0.05}  # before calibration
    old = design_of({"design": record})
    assert old.looks == (2, 3, 4) and old.first is None and not old.calibrated and design_of({"design": None}) is None
    assert old.levels[0] == pytest.approx(0.05 / 8)  # as it was planned: 0.05 (2/4)^3
    new = design_of({"design": {**record, "rho": 1.0, "first": 0.05, "calibrated": True}})
    assert new.calibrated and new.levels[0] == pytest.approx(0.0025)


def test_a_calibrated_design_decides_each_look_at_the_level_its_boundaries_set():
    """Two planned looks of a calibrated design, at seeds 0-3 and 0-5, one comparison (k = 1): each look's interval
    is the t interval at the level boundaries((4, 6), spent) gives, the outcome read off their intersection."""
    design = Design((4, 6), first=0.5)  # spends 0.025 by the first look, 0.05 by the second
    looks = [Look((0, 1, 2, 3), 0.025), Look(tuple(range(6)), 0.025)]
    levels = boundaries((4, 6), (0.025, 0.05))
    assert levels[0] == pytest.approx(0.025) and levels[1] > 0.025  # the second buys back what the looks share
    d = decide_at(family(), looks, MARGIN, design=design)["x"]
    last = decide_once(family(), MARGIN, levels[1])["x"]
    assert d.ci_level == pytest.approx(1 - levels[1]) and last.ci_level == d.ci_level
    assert d.ci == pytest.approx((1.965899, 2.034101), abs=1e-5) and d.outcome == DIFFERENT  # look 1's interval
    uncalibrated = decide_at(family(), looks, MARGIN, design=Design((4, 6), first=0.5, calibrated=False))["x"]
    assert uncalibrated.ci_level == pytest.approx(1 - 0.025)


def test_a_report_of_looks_words_its_intervals_and_what_would_settle_an_open_question_by_its_design():
    d = decide_once(family(), MARGIN, 0.025)["x"]  # inconclusive: marked, and the report's one line says the route
    assert needed_text(d) == "\u2021"
    assert "1 \u2212 0.05/k (Bonferroni" in rule_text() and "--until_decided from its start" in settle_line()
    assert "new study on new seeds" in settle_line() and "at most 10%, their levels added" in settle_line()
    design = Design((4, 6, 8))
    with at_looks([Look((0, 1, 2, 3), 0.0025)], design):  # not finished: the same command goes on
        assert "intersection of the comparison's t intervals" in rule_text() and "0.05/k" not in rule_text()
        assert "the same command continues this study" in settle_line() and "up to 8 seeds" in settle_line()
    finished = [Look((0, 1, 2, 3), 0.0025), Look(tuple(range(6)), 0.0292), Look(tuple(range(8)), 0.0183)]
    with at_looks(finished, design):  # stopped at its most seeds: a new study on new seeds, its design's 5% added
        assert "a new study on new seeds" in settle_line() and "at most 10%, their levels added" in settle_line()
        assert "continues this study" not in settle_line()
    by_hand = [Look((0, 1, 2, 3), 0.05), Look((0, 1, 2, 3, 4, 5), 0.05, planned=False)]
    with at_looks(by_hand):  # grown by hand: no design; its looks' levels added (10%), then the new study's
        assert "looks nobody planned" in rule_text() and "--until_decided from its start" in settle_line()
        assert "at most 15%, their levels added" in settle_line()
