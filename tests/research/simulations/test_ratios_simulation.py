"""research/simulations/ratios.py in a few seconds: its vectorized outcomes are research.analysis.rules.decide's, its
wrong-decision rule reads the truth as the sequential simulation does, the log ratio keeps its level where it is exact
(multiplicative noise), and the check can fail: per-seed differences lose most of their power where a seed's skewed
factor scales a real effect."""
from __future__ import annotations

import math

import numpy as np
import pytest

from research.analysis.rules import DIFFERENT, EQUAL, INCONCLUSIVE, RATIO, UNRESOLVED, WITHIN, Paired, decide
from research.simulations import ratios as sim

CODES = {EQUAL: sim.EQUAL, WITHIN: sim.WITHIN, UNRESOLVED: sim.UNRESOLVED, DIFFERENT: sim.DIFFERENT,
         INCONCLUSIVE: sim.INCONCLUSIVE}


@pytest.mark.parametrize("kind", sim.NOISES)
def test_the_vectorized_outcomes_are_what_rules_decide_reads(kind):
    for n in sim.SEEDS:
        for log_r in (0.0, sim.TRUTHS["margin, outside"], sim.TRUTHS["margin + 2 sd"]):
            a, b = sim.draw(np.random.default_rng(7), kind, 25, n, log_r)
            both = sim.decide_both(a, b)
            for i in range(25):
                for on, method in ((None, sim.METHODS[0]), (RATIO, sim.METHODS[1])):
                    family = {c: Paired.of(dict(enumerate(a[i, c])), dict(enumerate(b[i, c])),
                                           *((on,) if on else ())) for c in range(sim.K)}
                    got = decide(family, sim.MARGIN, k=sim.K)
                    assert [CODES[got[c].outcome] for c in range(sim.K)] == list(both[method][0][i]), (kind, n, i)


def test_a_decision_is_wrong_where_the_truth_contradicts_it():
    codes = np.array([sim.EQUAL, sim.WITHIN, sim.DIFFERENT, sim.UNRESOLVED, sim.INCONCLUSIVE])
    up = np.ones(5)
    inside, outside = 0.5 * sim.L, 1.5 * sim.L
    assert sim.wrong(codes, up * np.array([0, 1, 1, 1, 0]), 0.0).tolist() == [False, True, True, True, False]
    assert sim.wrong(codes, up * np.array([0, 1, 1, 1, 0]), inside).tolist() == [False, False, True, False, False]
    assert sim.wrong(codes, up * np.array([0, 1, 1, 1, 0]), outside).tolist() == [True, True, False, False, False]
    assert sim.wrong(codes, -up, outside)[1:4].tolist() == [True, True, True]  # the wrong sign


def test_the_log_ratio_keeps_its_level_under_multiplicative_noise():
    studies = 400
    cells = sim.simulate(studies, seed=1, noises=("multiplicative", "multiplicative_0.5"))
    for c in cells:
        if c.method == sim.METHODS[1]:
            assert c.family_wrong <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / studies), c
    assert all(ok for _, ok in sim.checks(cells))


def test_the_check_can_fail_differences_lose_power_to_a_skewed_seed_factor():
    """A seed's factor exp(0.5 z) scales each seed's difference: at 8 seeds and 4 sd beyond the margin the log ratio
    decides nearly every comparison beyond it, the raw t about two in three (68% at 4,000 studies)."""
    cells = {(c.truth, c.method): c for c in sim.simulate(300, seed=2, noises=("multiplicative_0.5",), seeds=(8,))}
    raw, log = cells[("margin + 4 sd", "raw t")].beyond, cells[("margin + 4 sd", "log ratio")].beyond
    assert log > 0.97 and raw < 0.8, (raw, log)


def test_the_command_prints_every_cell_with_its_error(capsys):
    rc = sim.main(["--studies", "50", "--seed", "3"])
    out = capsys.readouterr().out
    assert rc == (1 if "FAILS" in out else 0)  # the exit status says whether a bound it prints was met
    assert "50 studies per noise, seeds and truth, seed 3" in out and "family wrong" in out
    assert out.count("log ratio, multiplicative") == 2 * len(sim.SEEDS) * len(sim.TRUTHS)
