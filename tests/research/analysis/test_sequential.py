"""The spending plan and the running intersection of research.analysis.sequential, against values worked by hand."""
import math
from fractions import Fraction

import numpy as np
import pytest

from research.analysis.rules import DIFFERENT, EQUAL, INCONCLUSIVE, Margin, Paired
from research.analysis.sequential import Design, boundaries, decide_looks, intersect, plan


def test_a_plan_looks_every_round_and_at_its_max_and_spends_a_twentieth_first_then_by_the_seeds_added():
    assert plan(4, 8, 2).looks == (4, 6, 8)
    assert plan(4, 9, 2).looks == (4, 6, 8, 9)
    assert plan(4, 4, 2).looks == (4,)
    # 0.05 x 0.05 = 0.0025 at 4 seeds; by 6, 0.05 (0.05 + 0.95 x (2/4)^0.7) = 0.0317397, so 0.0292397 at 6; the rest
    by6 = 0.05 * (0.05 + 0.95 * 0.5 ** 0.7)
    assert by6 == pytest.approx(0.0317397, abs=1e-7)
    assert plan(4, 8, 2).levels == pytest.approx((0.0025, by6 - 0.0025, 0.05 - by6), abs=1e-15)
    assert plan(4, 8, 2, rho=1.0).levels == pytest.approx((0.0025, 0.02375, 0.02375), abs=1e-15)  # linear
    assert sum(plan(3, 11, 3).levels) == pytest.approx(0.05, abs=1e-15)
    assert Design((4,)).levels == (0.05,)  # one look: the full level, today's fixed design
    # a design recorded before calibration (first None): alpha (n/8)^3, 0.05/8 = 0.00625 at 4, 0.05 x 27/64 by 6
    assert plan(4, 8, 2, rho=3, first_share=None).levels == pytest.approx((0.00625, 0.01484375, 0.02890625),
                                                                          abs=1e-15)


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
    d = decide_looks([first, both], [0.025, 0.025], Margin(0.5, absolute=True))["x"]
    assert d.ci == pytest.approx((0.2952, 3.7048), abs=1e-3) and d.outcome != INCONCLUSIVE
    # a first look whose interval lies wholly above +0.5 makes the intersection's outcome 'beyond the margin'
    narrow = {"x": Paired(np.array([2.0, 2.1, 1.9, 2.0]), 2.0, 0.0, 2.0)}
    assert decide_looks([narrow, both], [0.025, 0.025], Margin(0.5, absolute=True))["x"].outcome == DIFFERENT


# ----------------------------------------------------------------------------- against an independent computation

def t_two_sided(dof: int, t: float) -> float:
    """P(|T| <= t) for Student's t with an odd dof, in closed form (Abramowitz and Stegun 26.7.3): with theta =
    atan(t / sqrt(dof)), 2/pi (theta + sin(theta) (cos(theta) + 2/3 cos^3 + 2*4/(3*5) cos^5 + ... + cos^(dof-2)))."""
    assert dof % 2 == 1
    theta = math.atan(t / math.sqrt(dof))
    c, term, total = math.cos(theta), math.cos(theta), 0.0
    for j in range(1, dof - 1, 2):  # the terms cos^j for j = 1, 3, ..., dof - 2
        total += term
        term *= c * c * (j + 1) / (j + 2)
    return 2 / math.pi * (theta + math.sin(theta) * total)


def t_quantile(dof: int, level: float) -> float:
    """The t with P(|T| <= t) = level, by bisection of t_two_sided (no scipy)."""
    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided(dof, mid) < level else (lo, mid)
    return (lo + hi) / 2


def test_the_closed_form_t_matches_printed_tables():
    # t tables: t(1, 97.5%) = 12.706, t(3, 97.5%) = 3.182, t(3, 99.5%) = 5.841, t(5, 97.5%) = 2.571, t(7, 99.5%) = 3.499
    for dof, level, printed in ((1, 0.95, 12.706), (3, 0.95, 3.182), (3, 0.99, 5.841), (5, 0.95, 2.571),
                                (7, 0.99, 3.499)):
        assert t_quantile(dof, level) == pytest.approx(printed, abs=5e-4)


def test_the_spending_schedule_is_the_power_function_in_exact_fractions():
    """plan(3, 11, 3) looks at 3, 6, 9, 11 seeds; look j spends alpha ((n_j / 11)^3 - (n_(j-1) / 11)^3), computed
    here in exact fractions: 27, 189, 513 and 602 parts of 1331, times 0.05."""
    looks = (3, 6, 9, 11)
    spent = [Fraction(n, 11) ** 3 for n in looks]
    parts = [spent[0]] + [b - a for a, b in zip(spent, spent[1:])]
    assert [p * 1331 for p in parts] == [27, 189, 513, 602]
    design = plan(3, 11, 3, alpha=0.05, rho=3, first_share=None)
    assert design.looks == looks
    assert design.levels == pytest.approx([float(0.05 * p) for p in parts], abs=1e-15)
    assert [design.spent(j) for j in range(4)] == pytest.approx([0.05 * float(s) for s in spent], abs=1e-15)


@pytest.mark.parametrize("j", [0, 1, 2])
def test_each_looks_interval_is_the_t_interval_at_its_share_over_k(j):
    """Looks at 4, 6, 8 seeds of a family of k = 4: look j's interval is mean +- t(n - 1, 1 - alpha_j / 4) s / sqrt(n),
    t from the closed form (dof 3, 5, 7): 11.110, 5.119 and 3.744 at the plan's 0.00625, 0.01484 and 0.02891 (scipy's
    t.ppf gives the same to 12 digits)."""
    design = plan(4, 8, 2, rho=3, first_share=None)
    diffs = np.array([0.9, 1.4, 0.2, 1.1, 0.7, 1.6, 3.4, 3.6])
    n, level = design.looks[j], design.levels[j]
    x = diffs[:n]
    family = {key: Paired(x, float(x.mean()), 0.0, 1.0) for key in "abcd"}
    d = decide_looks([family], [level], Margin(0.5, absolute=True), k=4)["a"]
    t = t_quantile(n - 1, 1 - level / 4)
    assert t == pytest.approx((11.110, 5.119, 3.744)[j], abs=5e-4)
    half = t * x.std(ddof=1) / math.sqrt(n)
    assert d.ci == pytest.approx((x.mean() - half, x.mean() + half), rel=1e-9)
    assert d.ci_level == pytest.approx(1 - level / 4, abs=1e-15)


def test_the_running_intersection_over_the_planned_looks():
    """The same seeds seen at 4, 6 and 8 (the last two far above the rest): the intervals, from the closed-form t,
    are [-1.932, +3.732], [-0.069, +2.036] and [-0.031, +3.256]. With margin 2.5 the last look alone reaches past it
    (inconclusive); their intersection [-0.031, +2.036] lies inside it: equal."""
    design = plan(4, 8, 2, rho=3, first_share=None)
    diffs = np.array([0.9, 1.4, 0.2, 1.1, 0.7, 1.6, 3.4, 3.6])
    families, bounds = [], []
    for n, level in zip(design.looks, design.levels):
        x = diffs[:n]
        families.append({"a": Paired(x, float(x.mean()), 0.0, 1.0)})
        half = t_quantile(n - 1, 1 - level / 4) * x.std(ddof=1) / math.sqrt(n)
        bounds.append((x.mean() - half, x.mean() + half))
    assert np.ravel(bounds) == pytest.approx([-1.9325, 3.7325, -0.0692, 2.0358, -0.0308, 3.2558], abs=1e-4)
    margin = Margin(2.5, absolute=True)
    d = decide_looks(families, list(design.levels), margin, k=4)["a"]
    assert d.ci == pytest.approx((bounds[2][0], bounds[1][1]), rel=1e-9) and d.outcome == EQUAL
    assert decide_looks(families[-1:], list(design.levels[-1:]), margin, k=4)["a"].outcome == INCONCLUSIVE


# ----------------------------------------------------------------------------- calibrated intervals

def miss_rates(ns: tuple, levels: tuple, draws: int, seed: int) -> list[float]:
    """An independent check of `boundaries`: the share of `draws` normal studies (another seed, each look's t
    statistic from its own slice) whose interval at one of looks 0..j misses the true mean 0, per j."""
    z = np.random.default_rng(seed).standard_normal((draws, max(ns)))
    missed, out = np.zeros(draws, bool), []
    for n, level in zip(ns, levels):
        x = z[:, :n]
        t = np.abs(x.mean(axis=1)) / (x.std(axis=1, ddof=1) / math.sqrt(n))
        missed |= t > t_quantile(n - 1, 1 - level) if level > 0 else False
        out.append(float(missed.mean()))
    return out


def test_calibrated_intervals_spend_what_the_design_spent_by_each_look():
    """Looks at 4, 6, 8 seeds spending 0.0025 / 0.02625 / 0.05 of a family of 4 (per comparison: 0.000625, 0.0065625,
    0.0125): by an independent simulation (200,000 studies, another seed), the chance that one of the intervals so
    far misses is that spent, within 3 Monte Carlo s.e. above and the calibration's own 2 s.e. + 4 below."""
    ns, spent = (4, 6, 8), (0.000625, 0.0065625, 0.0125)
    levels = boundaries(ns, spent)
    assert levels[0] == pytest.approx(0.000625, abs=1e-15)  # the first look: Student's t at its share exactly
    draws = 200_000
    for rate, target in zip(miss_rates(ns, levels, draws, seed=7), spent):
        se = math.sqrt(target * (1 - target) / draws)
        assert target - 6 * se - 4 * math.sqrt(target * 400_000) / 400_000 <= rate <= target + 3 * se
    # never below a look's own share (0.0059375 each: the union bound), and at the last look, whose seeds the earlier
    # looks share most, well above it: 0.00786 (what calibration buys)
    assert levels[1] >= 0.0059375 - 1e-15 and levels[2] == pytest.approx(0.00786, abs=2e-4)


def test_a_look_at_the_same_seeds_again_spends_only_what_it_adds():
    """Two looks at the same 5 seeds have the same t statistic: the second interval misses beyond the first exactly
    when its level exceeds the first's, so spending 0.01 and then 0.03 in all sets the second level to 0.03 (less the
    calibration's two Monte Carlo s.e. of 0.02 x 400,000 draws: 0.0003)."""
    first, second = boundaries((5, 5), (0.01, 0.03))
    assert first == pytest.approx(0.01, abs=1e-15)
    assert 0.03 - 0.0007 <= second <= 0.03


def test_a_look_that_spends_nothing_decides_nothing():
    assert boundaries((4, 6), (0.01, 0.01))[1] == 0.0
