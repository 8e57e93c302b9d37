"""The spike study's simulation, seeded and small: it runs, its studies look like the real one, and the verdicts it
counts are the report's (the rates themselves: python -m research.simulations.spikes, docs/spikes.md)."""
from __future__ import annotations

import numpy as np

from research.analysis.spikes import WARNS
from research.simulations import spikes as sim


def test_a_simulated_study_has_the_real_designs_runs_and_spikes():
    a = sim.study(np.random.default_rng(0), sim.SCENARIOS["clustered60"])
    assert len(a.runs) == 24 and (a.calibration_seeds, a.evaluation_seeds) == (list(range(6)), list(range(6, 12)))
    onsets = [s.onset for r in a.runs for s in r.spikes]
    assert all(sim.FIRST <= o <= sim.LAST for o in onsets)
    for r in a.runs:  # at least GAP steps apart within a run
        assert all(b - a_ >= sim.GAP for a_, b in zip(r.onsets[:-1], r.onsets[1:]))
    # 60% drawn there; a run holds about two there, so about 40% land there (the real study's 30 of 76)
    assert 0.25 < sum(sim.CLUSTER[0] <= o <= sim.CLUSTER[1] for o in onsets) / len(onsets) < 0.6
    assert a.family["QK"] == 7  # every signal recorded, calibrated and tested


def test_power_and_the_time_confounded_null_on_a_few_seeded_studies(capsys):
    warned = sim.simulate(sim.SCENARIOS["warned"], 4)
    assert warned.warns[sim.WARNED_SIGNAL] == 1.0 and warned.any_null_warns == 0.0
    null = sim.simulate(sim.SCENARIOS["clustered60"], 4)
    assert null.any_null_warns == 0.0 and all(v == 0.0 for v in null.warns.values())
    # the step-36 signal hits the clustered spikes in every run: the time-blind chance called this a warning
    a = sim.study(np.random.default_rng(1), sim.SCENARIOS["clustered60"])
    r = a.results[("update_rms_adamw", "QK")]
    assert r.hit_rate.mean > 0.2 and r.verdict != WARNS and r.permutation.p > 0.1
    assert sim.main(["--studies", "2", "--scenarios", "half"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("half: logit_max rises before half of the spikes; 60% drawn at steps 34-47; 2 studies")
    assert "'does not warn' for logit_max, which rises before half of the spikes: " in out
