"""research/simulations/decide_looks.py in a few seconds: qk-decide's own path (lay_out, decide_runs at a design's
looks) on seeded simulated studies keeps some outcome wrong rare where no true difference exists, uses every look
up to MAX where nothing can be decided early, and stops early where the difference is far beyond the margin (the
rates themselves: python -m research.simulations.decide_looks, docs/decide.md)."""
from __future__ import annotations

import numpy as np

from research.simulations import decide_looks as sim


def test_a_far_difference_stops_early_and_is_named_right():
    rng = np.random.default_rng(0)
    got = [sim.study(rng, sim.MARGIN + 6, "design") for _ in range(20)]
    assert not any(w for w, _ in got) and np.mean([n for _, n in got]) < sim.MAX


def test_no_difference_keeps_the_bound_at_the_designs_looks():
    rates = sim.rates(150, seed=1)
    p, se, seeds = rates[("0", "design")]
    assert p <= sim.BOUND + 3 * se and seeds > sim.FIRST  # nothing is decided at 3 seeds: looks are taken
    assert set(rates) == {(t, w) for t in sim.TRUTHS for w in sim.WAYS}
