"""The spike rule on synthetic loss curves, and the evaluation of signals on synthetic runs known by hand."""
from __future__ import annotations

import math

import numpy as np

from research.analysis import spikes
from research.analysis.spikes import INCONCLUSIVE, NO_WARNING, WARNS, WINDOW, RunSteps, analyze, find_spikes

N = 200


def _curve(noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """A clean decaying loss (6 -> 4 nats) at steps 1..N, with normal noise of sd `noise`."""
    t = np.arange(1, N + 1)
    return 4 + 2 * np.exp(-t / 40) + np.random.default_rng(seed).normal(0, noise, N)


def _onsets(loss) -> list[int]:
    return [s.onset for s in find_spikes(range(1, len(loss) + 1), loss)]


def test_a_clean_decaying_curve_has_no_spike():
    assert _onsets(_curve()) == []


def test_noise_at_the_windows_scale_does_not_fire():
    for seed in range(5):
        assert _onsets(_curve(noise=0.05, seed=seed)) == []


def test_a_one_step_blip_under_m_steps_does_not_count_but_a_lasting_rise_does():
    loss = _curve(0.01)
    loss[99] += 1.0  # step 100 alone
    assert _onsets(loss) == []
    loss[119:122] += 1.0  # steps 120..122
    assert _onsets(loss) == [120]


def test_a_plateau_jump_counts_once():
    loss = _curve(0.01)
    loss[99:] += 1.0
    found = find_spikes(range(1, N + 1), loss)
    assert [s.onset for s in found] == [100] and not found[0].diverged


def test_no_spike_before_the_window_is_full():
    loss = _curve(0.01)
    loss[5:8] += 3.0
    assert _onsets(loss) == []
    assert WINDOW == 20


def test_a_non_finite_loss_is_a_spike_at_its_step():
    loss = _curve(0.01)[:150]
    loss[-1] = math.nan
    found = find_spikes(range(1, 151), loss)
    assert [(s.onset, s.diverged) for s in found] == [(150, True)]
    loss[-1] = math.inf
    assert [(s.onset, s.diverged) for s in find_spikes(range(1, 151), loss)] == [(150, True)]


# ---------------------------------------------------------------------------------- evaluation

def _rows(seed: int, onsets: tuple, level: float) -> list[dict]:
    """Per-step lines: the loss jumps 2 nats for 3 steps at each onset; logit_max rises from 10 to `level` 5 steps
    before each onset (until the spike ends); grad_norm is noise."""
    rng = np.random.default_rng(seed)
    loss = _curve(0.02, seed)
    rows = []
    for s in range(1, N + 1):
        up = any(o <= s < o + 3 for o in onsets)
        warned = any(o - 5 <= s < o + 3 for o in onsets)
        rows.append({"step": s, "tokens": 512 * s, "loss": float(loss[s - 1] + 2 * up),
                     "grad_norm": float(rng.uniform()), "logit_max": [level if warned else 10.0, 1.0]})
    return rows


CAL, EVAL = (60, 110, 160), (70, 150)  # calibration seeds have 3 spikes a run, evaluation seeds 2


def _runs() -> list[RunSteps]:
    return [RunSteps.of("NoQK@16", {"seed": seed}, _rows(seed, CAL if seed < 3 else EVAL, 100.0))
            for seed in range(6)]


def test_a_signal_that_rises_5_steps_before_each_spike_warns_with_lead_5_and_no_false_alarm():
    runs = _runs()
    assert [[s.onset for s in r.spikes] for r in runs] == [list(CAL)] * 3 + [list(EVAL)] * 3
    a = analyze(runs, seeds=[0, 1, 2, 3, 4, 5])
    assert (a.calibration_seeds, a.evaluation_seeds) == ([0, 1, 2], [3, 4, 5])
    r = a.results[("logit_max", "NoQK")]
    assert 10 < r.threshold <= 100
    assert (r.calibration.spikes, r.calibration.hits) == (9, 9)  # chosen on seeds 0-2 alone
    assert sorted(r.per_seed) == [3, 4, 5]  # evaluated on seeds 3-5 alone
    assert all((s.spikes, s.hits, s.false_alarms, s.leads) == (2, 2, 0, (5, 5)) for s in r.per_seed.values())
    assert (r.hit_rate.mean, r.false_alarms.mean, r.lead.mean) == (1.0, 0.0, 5.0)
    # 2 alarms in the judged steps of a run: 200 - 20 (warm-up) - 10 (end unseen) - 6 (in spikes) = 164
    assert r.per_seed[3].judged_steps == 164 and r.per_seed[3].alarms == 2
    assert math.isclose(r.chance.mean, 1 - (1 - 2 / 164) ** spikes.HORIZON)
    assert r.verdict == WARNS
    assert r.text.startswith("logit_max warns in NoQK: held-out hit rate 1.00")
    assert "chosen on seeds 0, 1, 2, evaluated on seeds 3, 4, 5" in r.text


def test_chance_holds_each_run_to_its_own_alarm_rate_not_its_seeds_average():
    # One seed, two runs: the 256x run has both spikes and both alarms (5 steps before each), the 128x run neither.
    hot = RunSteps.of("NoQK@256", {"seed": 3}, _rows(3, EVAL, 100.0))
    calm = RunSteps.of("NoQK@128", {"seed": 3}, _rows(3, (), 100.0))
    assert (len(hot.judged), len(calm.judged)) == (164, 170)  # 200 - 20 - 10 - 6 in spikes; 200 - 20 - 10
    s = spikes.total([hot, calm], "logit_max", 50.0)
    assert (s.spikes, s.hits, s.alarms, s.judged_steps) == (2, 2, 2, 334)
    # the hot run fires 2 alarms in 164 judged steps: that is the rate random alarms get, not 2 in 334
    assert math.isclose(s.chance, 1 - (1 - 2 / 164) ** spikes.HORIZON)
    assert s.chance > 1 - (1 - 2 / 334) ** spikes.HORIZON + 0.05
    assert math.isnan(spikes.total([calm], "logit_max", 50.0).chance)  # no spike: no chance hit rate


def test_a_noise_signal_does_not_warn_and_an_absent_one_is_inconclusive():
    a = analyze(_runs(), seeds=[0, 1, 2, 3, 4, 5])
    assert a.results[("grad_norm", "NoQK")].verdict in (NO_WARNING, INCONCLUSIVE)
    absent = a.results[("key_norm", "NoQK")]
    assert absent.verdict == INCONCLUSIVE and "not recorded" in absent.text
    assert a.summary["NoQK"] == ("In NoQK, logit_max, logit_growth warn; inconclusive: key_norm, grad_norm, "
                                 "update_rms_muon, update_rms_adamw, entropy.")  # growth: logit_max's rise


def test_too_few_seeds_is_inconclusive_and_no_warning_is_said_so():
    runs = [r for r in _runs() if r.seed in (0, 3)]
    a = analyze(runs, seeds=[0, 3])
    r = a.results[("logit_max", "NoQK")]
    assert r.verdict == INCONCLUSIVE and "2 held-out spike(s) on 1 seed(s)" in r.text
    assert a.summary["NoQK"].startswith("In NoQK, no signal warns; inconclusive: ")


def test_the_aligned_series_are_centred_on_each_onset():
    a = analyze(_runs(), seeds=[0, 1, 2, 3, 4, 5])
    logit = a.aligned[("logit_max", "NoQK")]
    assert logit.shape == (15, spikes.ALIGN[1] - spikes.ALIGN[0] + 1)
    at = -spikes.ALIGN[0]  # the column of offset 0
    assert np.all(logit[:, at - 5] == 100.0) and np.all(logit[:, at - 6] == 10.0)


def test_a_run_that_diverged_at_its_first_step_is_one_spike_from_results_json_alone():
    run = RunSteps.of("NoQK@256", {"seed": 0, "diverged": {"step": 1}}, [])
    assert run.spikes == (spikes.Spike(1, 1, True),)
