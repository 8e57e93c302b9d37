"""The spending plan and the running intersection of research.analysis.sequential, against values worked by hand."""
import numpy as np
import pytest

from research.analysis.rules import DIFFERENT, INCONCLUSIVE, Paired
from research.analysis.sequential import Design, decide_looks, intersect, plan


def test_a_plan_looks_every_round_and_at_its_max_and_spends_alpha_by_the_cube_of_its_share():
    assert plan(4, 8, 2).looks == (4, 6, 8)
    assert plan(4, 9, 2).looks == (4, 6, 8, 9)
    assert plan(4, 4, 2).looks == (4,)
    # alpha (n/8)^3: 0.05/8 = 0.00625 at 4 seeds; 0.05 * 27/64 = 0.02109375 by 6, so 0.01484375 at 6; the rest at 8
    assert plan(4, 8, 2).levels == pytest.approx((0.00625, 0.01484375, 0.02890625), abs=1e-15)
    assert sum(plan(3, 11, 3).levels) == pytest.approx(0.05, abs=1e-15)
    assert Design((4,)).levels == (0.05,)  # one look: the full level, today's fixed design


@pytest.mark.parametrize("looks", [(), (4, 4), (6, 4), (1, 4)])
def test_a_design_whose_looks_do_not_rise_from_two_seeds_is_refused(looks):
    with pytest.raises(ValueError):
        Design(looks)


def test_intervals_meet_in_their_intersection_or_not_at_all():
    assert intersect([(0.0, 2.0), (1.0, 3.0), (-1.0, 2.5)]) == (1.0, 2.0)
    assert intersect([(0.0, 1.0), (2.0, 3.0)]) is None


def test_an_outcome_is_read_off_the_intersection_of_the_looks_intervals():
    # look 0: diffs 1, 3 (mean 2, sd sqrt 2); look 1 adds 2, 2 (mean 2, sd sqrt(2/3)). With margin 0.5 absolute,
    # each look alone at alpha 0.025 over one comparison: t(1, 0.9875) = 25.45 -> half 25.45 * 1 = 25.45;
    # t(3, 0.9875) = 4.177 -> half 4.177 * 0.8165 / 2 = 1.705: [0.295, 3.705], beyond 0 but reaching past +0.5.
    first = {"x": Paired(np.array([1.0, 3.0]), 2.0, 0.0, 2.0)}
    both = {"x": Paired(np.array([1.0, 3.0, 2.0, 2.0]), 2.0, 0.0, 2.0)}
    from research.analysis.rules import Margin
    d = decide_looks([first, both], [0.025, 0.025], Margin(0.5, absolute=True))["x"]
    assert d.ci == pytest.approx((0.2952, 3.7048), abs=1e-3) and d.outcome != INCONCLUSIVE
    # a first look whose interval lies wholly above +0.5 makes the intersection's outcome 'beyond the margin'
    narrow = {"x": Paired(np.array([2.0, 2.1, 1.9, 2.0]), 2.0, 0.0, 2.0)}
    assert decide_looks([narrow, both], [0.025, 0.025], Margin(0.5, absolute=True))["x"].outcome == DIFFERENT
