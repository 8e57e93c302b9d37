"""The spike study's simulation, seeded and small: it runs, its studies look like the real one and like what each
scenario says (bursts, unstable runs), and the verdicts it counts are the report's (the rates themselves: python -m
research.simulations.spikes, docs/spikes.md)."""
from __future__ import annotations

import numpy as np

from research.analysis import spike_rule
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


def test_bursts_put_a_reaction_before_a_second_spike_and_the_rule_counts_none_of_them():
    a = sim.study(np.random.default_rng(4), sim.SCENARIOS["bursts"])
    r = a.results[("grad_norm", "QK")]  # it rises 6-fold from each onset: a reaction
    gaps = [b.onset - a_.end for run in a.runs for a_, b in zip(run.spikes[:-1], run.spikes[1:])
            if b.onset - a_.end <= sim.BURST[1]]
    assert gaps and min(gaps) >= sim.BURST[0]  # second spikes, 2-15 steps after the first's end
    reactions = hit = 0
    for run in (x for x in a.runs if x.seed in a.evaluation_seeds):
        fired = np.array(spike_rule.alarms(run, "grad_norm", r.threshold), dtype=np.int64)
        first = spike_rule.hits_of(fired, run)
        for k in range(1, len(run.spikes)):
            prev, o = run.spikes[k - 1], run.spikes[k].onset
            react = fired[(fired >= prev.onset) & (fired <= prev.end + spike_rule.REACTION) & (fired >= o - 10)
                          & (fired < o)]
            reactions += react.size
            hit += int(np.isin(react, first).any())
    assert reactions >= 5 and hit == 0  # raised during or just after the first, in the 10 steps before the second
    assert r.verdict != WARNS


def test_unstable_runs_are_spikier_and_noisier():
    a = sim.study(np.random.default_rng(0), sim.SCENARIOS["unstable"])
    spread = np.array([np.std(r.signals["logit_growth"][1]) for r in a.runs])
    noisy = spread > 1.5  # twice the noise (sd 1 or 2)
    assert 0 < noisy.sum() < len(a.runs) and np.all((spread < 1.4) | (spread > 1.6))
    spikes = np.array([len(r.spikes) for r in a.runs])
    assert spikes[noisy].mean() > 2 * spikes[~noisy].mean()  # 4 to 1 by design


def test_power_and_the_nulls_on_a_few_seeded_studies(capsys):
    warned = sim.simulate(sim.SCENARIOS["warned"], 4)
    assert warned.warns[sim.WARNED_SIGNAL] == 1.0 and warned.any_null_warns == 0.0
    for name in ("clustered60", "bursts", "unstable"):
        null = sim.simulate(sim.SCENARIOS[name], 3)
        assert null.any_null_warns == 0.0 and all(v == 0.0 for v in null.warns.values()), name
    # the step-36 signal hits the clustered spikes in every run: shifted in time its alarms leave the cluster, and
    # that null alone calls it a warning (p under 0.025 / 7); paired with the other runs' spikes it hits as many
    a = sim.study(np.random.default_rng(4), sim.SCENARIOS["clustered60"])
    r = a.results[("update_rms_adamw", "QK")]
    assert r.hit_rate.mean > 0.4 and r.shifts.p < 0.025 / 7 and r.permutation.p > 0.5 and r.verdict != WARNS
    assert sim.main(["--studies", "2", "--scenarios", "half"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("half: logit_max rises before half of the spikes; 60% drawn at steps 34-47; 2 studies")
    assert "'does not warn' for logit_max, which rises before half of the spikes: " in out
    assert "'warns' for late_loss_rise (the negative control): 0.00%" in out
