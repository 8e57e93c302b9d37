"""research/simulations/conditions.py in a few seconds: it decides studies with the report's own functions, its
scenarios' rates stay within their bounds at a small number of studies (with a slack of 3 Monte Carlo standard
errors of the bound), and that check can fail: the nine families read together, without primary quantities,
exceed 5% when their noise is independent."""
from __future__ import annotations

import math

import numpy as np

from research.analysis.conditions import QUANTITIES
from research.simulations import conditions as sim

STUDIES = 60


def within(rate: float, bound: float, n: int, upper: bool = True) -> bool:
    """rate at most (or at least) bound, give or take 3 standard errors of a rate of `bound` over n studies."""
    slack = 3 * math.sqrt(bound * (1 - bound) / n)
    return rate <= bound + slack if upper else rate >= bound - slack


def test_a_synthetic_run_reads_back_as_drawn():
    finals = {k: v + i for i, (k, v) in enumerate(sim.TRUTH.items())}
    run = sim.synthetic_run("QK", 3, finals)
    assert {q.key: q.final(run) for q in QUANTITIES} == finals


def test_the_scenarios_meet_their_bounds():
    rates = sim.simulate(STUDIES, seed=0)
    assert [(r.what.split(":")[0], r.noise) for r in rates if r.bound is not None] == [
        (s, n) for n in sim.NOISE_KINDS for s in ("null", "edge", "power")]
    for r in rates:
        assert r.studies == STUDIES and (r.bound is None or within(r.rate, r.bound, STUDIES, r.upper)), r


def test_the_check_fails_for_nine_families_read_together():
    """Under no true difference, with independent noise, "In short" over all nine quantities (each its own family
    at 95%) says something differs in about 14% of studies (the review's 14.1%): beyond 5% + 3 standard errors."""
    rng = np.random.default_rng(1)
    n = 200
    nine = np.mean([sim.false_differs(sim.decided(sim.null_study(rng, shared=False), ())) for _ in range(n)])
    assert not within(nine, 0.05, n), nine  # 0.05 + 3 x 0.0154 = 0.096


def test_the_command_prints_each_rate_with_its_error_and_bound(capsys):
    assert sim.main(["--studies", "3", "--seed", "2"]) in (0, 1)
    out = capsys.readouterr().out
    assert "3 studies per scenario and noise kind: 4 conditions (the first the baseline), 4 seeds" in out
    assert out.count("at most 5%") == 4 and out.count("at least 80%") == 2 and "MC s.e." in out
