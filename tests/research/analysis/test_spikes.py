"""The spike rule on synthetic loss curves, and the evaluation of signals on synthetic runs known by hand."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from research.analysis import spike_rule, spikes
from research.analysis.spike_rule import WINDOW, RunSteps, Spike, find_spikes
from research.analysis.spikes import INCONCLUSIVE, NO_WARNING, WARNS, analyze
from utils.telemetry import SIGNALS, Alarm

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


def onsets_of(seed: int) -> tuple:
    """Two spikes a run, at steps no other run's spike comes within 5 steps of (12 apart from seed to seed)."""
    return 40 + 12 * (seed % 6), 110 + 12 * (seed % 6)


SEEDS = list(range(12))  # 0-5 calibrate, 6-11 evaluate


def _runs(seeds=SEEDS) -> list[RunSteps]:
    return [RunSteps.of("NoQK@16", {"seed": seed}, _rows(seed, onsets_of(seed), 100.0)) for seed in seeds]


def test_a_signal_that_rises_5_steps_before_each_spike_warns_against_the_null_that_keeps_time():
    runs = _runs()
    assert [[s.onset for s in r.spikes] for r in runs] == [list(onsets_of(s)) for s in SEEDS]
    a = analyze(runs, seeds=SEEDS)
    assert (a.calibration_seeds, a.evaluation_seeds) == ([0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11])
    r = a.results[("logit_max", "NoQK")]
    assert 10 < r.threshold <= 100
    assert (r.calibration.spikes, r.calibration.hits) == (12, 12)  # chosen on seeds 0-5 alone
    assert sorted(r.per_seed) == [6, 7, 8, 9, 10, 11]  # evaluated on seeds 6-11 alone
    assert all((s.spikes, s.hits, s.false_alarms, s.leads) == (2, 2, 0, (5, 5)) for s in r.per_seed.values())
    assert (r.hit_rate.mean, r.false_alarms.mean, r.lead.mean) == (1.0, 0.0, 5.0)
    # 2 alarms in the judged steps of a run: 200 - 20 (warm-up) - 10 (end unseen) - 2 x 13 (each spike's 3 steps and
    # the REACTION = 10 after: reactions) = 144
    assert r.per_seed[6].judged_steps == 144 and r.per_seed[6].alarms == 2
    # A run's alarms hit its own 2 spikes and no other run's (their onsets are 12 or more steps apart): H = 2 x I.
    # Over the 6! pairings of the 6 held-out runs the hits are 2 x (fixed points): 12 only for the one observed, and
    # 2 expected (each spike is hit by 1 of the 6 runs' alarms): chance 1/6, p = 1/720.
    perm = r.permutation
    assert (perm.observed, perm.expected, perm.exact) == (12, 2.0, True)
    assert math.isclose(perm.p, 1 / 720) and math.isclose(perm.min_p, 1 / 720)
    assert math.isclose(r.chance.mean, 1 / 6) and math.isclose(r.excess.mean, 5 / 6)
    assert r.verdict == WARNS and math.isclose(a.level["NoQK"], 1 - 0.05 / 3)  # k: logit_max, its growth, grad_norm
    assert r.text.startswith("logit_max at threshold ")
    # shifted in time (by 0, or by 11 to 169 of a run's 180 armed steps, each run on its own), a run's 2 alarms, 70
    # steps apart like its spikes, hit at most 1 of them: 12 hits only with no run shifted, p = (1 / 160) ** 6
    assert r.shifts.observed == 12 and math.isclose(r.shifts.p, 160.0 ** -6)
    assert "warns (p 0.0014 with the runs paired and 6.0e-14 with each run's alarms shifted in time, both \u2264 " \
        in r.text and "; 12 of 12 held-out spikes hit, 2.0 expected with the runs paired and 0.8 shifted" in r.text
    assert r.text.endswith("; excess over chance 0.83 [0.83, 0.83], exact bound 0.83.")  # 1 - 1/6


def _run(seed: int, multiplier: float, onsets: tuple, alarm_steps: tuple, n: int = N) -> RunSteps:
    """A run built by hand: spikes of 3 steps at `onsets`, and logit_max at 100 for 4 steps from each of
    `alarm_steps` (10 elsewhere), so a threshold between fires exactly there."""
    steps = tuple(range(1, n + 1))
    values = tuple(100.0 if any(a <= s < a + 4 for a in alarm_steps) else 10.0 for s in steps)
    return RunSteps("NoQK", multiplier, seed, steps, tuple(4.0 for _ in steps),
                    tuple(Spike(o, o + 2, False) for o in onsets), {"logit_max": (steps, values)})


def test_the_null_pairs_runs_within_a_rate_only_and_chance_is_its_mean():
    # 256x: A (spike 70, alarm 65) and B (spike 120, alarm 115): H = I, hits 2 as observed, 0 swapped.
    # 128x: C (spike 66, no alarm) and D (no spike, alarm 62): D's alarm would hit C's spike: H = [[0, 0], [1, 0]].
    a, b = _run(6, 256, (70,), (65,)), _run(7, 256, (120,), (115,))
    c, d = _run(6, 128, (66,), ()), _run(7, 128, (), (62,))
    ev = spikes.evaluate([a, b, c, d], "logit_max", 50.0, [6, 7])
    # pairings: 256x gives 2 or 0, 128x 0 or 1, each half the time: totals 0, 1, 2, 3; observed 2 + 0 = 2
    assert (ev.permutation.observed, ev.permutation.expected, ev.permutation.p) == (2, 1.5, 0.5)
    # seed 6: A's spike expects (1 + 0) / 2, C's (0 + 1) / 2; seed 7: B's 1/2, D has no spike
    assert ev.chance == {6: 1.0, 7: 0.5}
    assert (ev.per_seed[6].spikes, ev.per_seed[6].hits, ev.per_seed[7].spikes, ev.per_seed[7].hits) == (2, 1, 1, 1)
    assert ev.quiet.alarms == 1 and ev.quiet.judged_steps == 170  # D: 200 - 20 - 10 judged steps, its one alarm


def test_a_signal_that_only_follows_the_step_does_not_warn_though_it_beats_random_placement():
    # Every run spikes at step 45 and once more at its own step; the signal rises at step 38 in every run, spike or
    # not. It hits every step-45 spike (and nothing else): hit rate 1/2 where alarms placed at random (1 in 164
    # judged steps) would hit about 6% (the old chance: "warns", excess 0.44 with no spread). Any pairing of alarm
    # sequences with spike sequences gives the same 6 hits: p = 1, and chance is the hit rate itself.
    runs = [_run(s, 128, (45, 100 + 12 * (s % 6)), (38,)) for s in SEEDS]
    a = analyze(runs, seeds=SEEDS)
    r = a.results[("logit_max", "NoQK")]
    assert (r.permutation.observed, r.permutation.expected, r.permutation.p) == (6, 6.0, 1.0)
    assert (r.hit_rate.mean, r.chance.mean, r.excess.mean) == (0.5, 0.5, 0.0)
    assert r.verdict != WARNS


def test_does_not_warn_needs_the_spikes_to_say_it():
    # 0 hits of 4 held-out spikes: the exact one-sided bound on the hit rate is 1 - (0.025 / k) ** (1 / 4), 0.60 even
    # at k = 1: a useful warning is not ruled out. With 24 spikes, 0 hits: 1 - (0.025 / 1) ** (1 / 24) = 0.14.
    assert spikes.spikes_to_rule_out(1) == 13 and spikes.spikes_to_rule_out(7) == 20  # ln(0.025/k) / ln(0.75)
    assert math.isclose(spikes.binomial_upper(0, 4, 0.025), 1 - 0.025 ** 0.25)
    quiet_alarm = (185,)  # after every spike (the last at 180): fires, never hits

    def study(onsets):
        return analyze([_run(s, 128, onsets(s), quiet_alarm) for s in SEEDS], seeds=SEEDS)
    few = study(lambda s: (40 + 12 * (s % 6),) if s in (6, 7, 8, 9) or s < 6 else ())
    r = few.results[("logit_max", "NoQK")]
    assert (r.eval_spikes, r.hit_rate.mean, r.verdict) == (4, 0.0, INCONCLUSIVE)
    assert "ruling it out needs 13 held-out spikes even with no hit, 4 here" in r.text
    # where chance is higher, fewer spikes can do: 1 - 0.025 ** (1 / n) < 0.25 + 0.3 from n = 5 (ln 0.025 / ln 0.45)
    assert spikes.spikes_to_rule_out(1, 0.3) == 5 and spikes.spikes_to_rule_out(1, 0.8) == 1
    many = study(lambda s: tuple(30 + 12 * (s % 6) + 30 * i for i in range(4)))  # 4 a run, 24 held out
    r = many.results[("logit_max", "NoQK")]
    assert (r.eval_spikes, r.permutation.observed, r.permutation.expected) == (24, 0, 0.0)
    assert math.isclose(r.excess_bound, 1 - 0.025 ** (1 / 24)) and r.verdict == NO_WARNING
    assert r.text.startswith("logit_max at threshold ") and "does not warn" in r.text


def test_the_permutation_null_exactly_and_by_monte_carlo():
    perm = spikes.permutation_test([np.array([[1, 0], [0, 1]]), np.array([[1, 1], [0, 0]])])
    # rate 1: 2 (as observed) or 0 (swapped); rate 2: 1 either way. Totals 3 and 1, half each.
    assert (perm.observed, perm.expected, perm.p, perm.min_p, perm.exact) == (3, 2.0, 0.5, 0.5, True)
    big = spikes.permutation_test([np.eye(9, dtype=int)])  # 9 runs: fixed points; 12 or more only for 1 in 9!
    assert not big.exact and big.observed == 9 and math.isclose(big.expected, 1.0)
    assert big.p <= 2 / (spikes.MONTE_CARLO + 1) and big.min_p == 1 / (spikes.MONTE_CARLO + 1)


def test_the_alarm_matrix_is_the_alarms_crossing_rule():
    rng = np.random.default_rng(3)
    steps = tuple(range(1, 81))
    for name in ("logit_max", "entropy"):  # rises, falls
        values = tuple(rng.normal(0, 1, 80).round(1).tolist())
        run = RunSteps("QK", 1.0, 0, steps, (4.0,) * 80, (), {name: (steps, values)})
        for t in (-0.5, 0.0, 0.7):
            alarm = Alarm(SIGNALS[name], t)
            want = [s for i, s in enumerate(steps) if s >= run.first_armed
                    and alarm.crossed(values[i], values[i - 1] if i else None)]
            assert spike_rule.alarms(run, name, t) == want and want


def test_a_noise_signal_does_not_warn_and_an_absent_one_is_inconclusive():
    a = analyze(_runs(), seeds=SEEDS)
    assert a.results[("grad_norm", "NoQK")].verdict in (NO_WARNING, INCONCLUSIVE)
    absent = a.results[("key_norm", "NoQK")]
    assert absent.verdict == INCONCLUSIVE and "not recorded" in absent.text
    assert a.summary["NoQK"] == ("In NoQK, logit_max, logit_growth warn; inconclusive: key_norm, grad_norm, "
                                 "update_rms_muon, update_rms_adamw, entropy.")  # growth: logit_max's rise


def test_too_few_seeds_is_inconclusive_and_the_heading_says_nothing_was_shown():
    runs = [r for r in _runs() if r.seed in (0, 6)]
    a = analyze(runs, seeds=[0, 6])
    r = a.results[("logit_max", "NoQK")]
    assert r.verdict == INCONCLUSIVE and "2 held-out spike(s) on 1 seed(s)" in r.text
    assert a.summary["NoQK"].startswith("In NoQK, no signal was shown to warn; inconclusive: ")


def test_the_aligned_series_are_centred_on_each_onset():
    a = analyze(_runs(), seeds=SEEDS)
    logit = a.aligned[("logit_max", "NoQK")]
    assert logit.shape == (24, spikes.ALIGN[1] - spikes.ALIGN[0] + 1)
    at = -spikes.ALIGN[0]  # the column of offset 0
    assert np.all(logit[:, at - 5] == 100.0) and np.all(logit[:, at - 6] == 10.0)


def test_a_run_that_diverged_at_its_first_step_is_one_spike_from_results_json_alone():
    run = RunSteps.of("NoQK@256", {"seed": 0, "diverged": {"step": 1}}, [])
    assert run.spikes == (Spike(1, 1, True),)


# ---------------------------------------------------------------------- reactions, the shifted null, the control
def test_an_alarm_in_an_earlier_spikes_reaction_span_is_no_hit_of_the_next_and_one_just_after_is():
    # Spike A at 60 (3 steps: end 62), its reaction span 60..72 (end + REACTION); spike B at 78, whose 10 steps before
    # (68..77) are cut to after A's span: its window is 73..77.
    assert (spike_rule.HORIZON, spike_rule.REACTION) == (10, 10)

    def scored(alarm: int):
        run = _run(6, 128, (60, 78), (alarm,))
        return run, spike_rule.score(run, "logit_max", 50.0)
    run, s = scored(72)
    assert run.windows.tolist() == [[50, 60], [73, 78]] and run.warnable.tolist() == [True, True]
    # 72 lies in B's 10 steps, but it is A's reaction: no hit, and no false alarm either (not judged)
    assert (s.spikes, s.hits, s.false_alarms, s.alarms) == (2, 0, 0, 0)
    _, s = scored(73)  # one step later: a warning of B, 5 steps ahead
    assert (s.hits, s.false_alarms, s.alarms, s.leads) == (1, 0, 1, (5,))
    # judged: 200 - 20 (warm-up) - 10 (end unseen) - 13 (A's span, 60..72) - 13 (B's, 78..90) = 144
    assert s.judged_steps == 144
    assert scored(60)[1].hits == 0 and scored(55)[1].leads == (5,)  # at A's onset: a reaction; before it: A's warning
    assert scored(40)[1].false_alarms == 1  # before any window: false
    # a spike that starts by the step after the previous one's span (its end + REACTION + 1) has no window: not
    # counted; nor is one at the first armed step (21)
    close = _run(6, 128, (60, 66), ())
    assert close.windows.tolist() == [[50, 60], [73, 66]] and close.warnable.tolist() == [True, False]
    assert spike_rule.score(close, "logit_max", 50.0).spikes == 1
    assert _run(6, 128, (21,), ()).warnable.tolist() == [False]


def test_the_shifted_null_by_hand():
    # 60 steps, armed from 21: 40 armed steps. A spike at 50 (window 40..49), one alarm at 45 (a hit). The shifts
    # that move it more than 10 steps are 11..29: 45 goes to 56..60 and 21..34, none in the window. With d = 0 the
    # null has 20 equally likely values, one of them a hit: p = 1/20; two such runs: 1/400.
    run = _run(6, 128, (50,), (45,), n=60)
    h = spikes.shift_hits(run, np.array([45]))
    assert h.tolist() == [1] + [0] * 19
    one, two = spikes.shift_test([run], [np.array([45])]), spikes.shift_test([run, run], [np.array([45])] * 2)
    assert (one.observed, one.expected, one.p, one.min_p) == (1, 0.05, 0.05, 0.05)
    assert two.observed == 2 and math.isclose(two.p, 1 / 400) and math.isclose(two.expected, 0.1)
    # an alarm that hits wherever it is moved: p = 1 (no run, no shift can show timing)
    assert spikes.shift_test([run], [np.array([], dtype=np.int64)]).p == 1.0


WINDOWS_7 = tuple(range(50, 351, 50))  # an unstable run's onsets, 400 steps: windows 40..49, 90..99, ..., 340..349


def _instability(warning: bool) -> list[RunSteps]:
    """12 seeds at two rates. Seeds 0-2 and 6-8 are unstable (7 spikes, WINDOWS_7), 3-5 and 9-11 stable (one spike,
    at 210). With `warning`, logit_max rises 5 steps before every spike. Without, an unstable run raises 5 alarms that
    know nothing of its spikes (one falls in a window, as 5 alarms placed at random would: the windows are 70 of the
    380 armed steps) and a stable run none: the alarms go with the spikes only through the run."""
    def run(seed, m):
        onsets = WINDOWS_7 if seed % 6 < 3 else (210,)
        if warning:
            alarm_steps = tuple(o - 5 for o in onsets)
        else:
            alarm_steps = (30, 75, 128, 245, 320) if seed % 6 < 3 else ()
        return _run(seed, m, onsets, alarm_steps, n=400)
    return [run(s, m) for s in SEEDS for m in (128, 256)]


def test_run_level_instability_is_not_a_warning_and_a_warning_still_is():
    a = analyze(_instability(warning=False), seeds=SEEDS)
    r = a.results[("logit_max", "NoQK")]
    assert a.family["NoQK"] == 1  # only logit_max is recorded: the level is 0.025
    # Paired: an unstable run's alarms hit 1 spike of any unstable run and none of a stable one's (210), and a stable
    # run has no alarm; the observed 3 a rate only when the 3 unstable runs' alarms go to unstable runs: 3! 3! / 6! =
    # 1/20 a rate, p = 1/400, under 0.025: the runs-paired null alone calls it a warning.
    assert (r.permutation.observed, r.permutation.p) == (6, 0.0025)
    # Shifted: each unstable run's 5 alarms, moved by d = 0 or 11..369 circularly over steps 21..400, against its own
    # windows; the null's distribution, counted here step by step
    armed = np.arange(21, 401)
    in_window = np.isin(armed, [s for o in WINDOWS_7 for s in range(o - 10, o)])
    per_run = [int(in_window[(np.array([30, 75, 128, 245, 320]) - 21 + d) % 380].sum()) for d in
               [0, *range(11, 370)]]  # each alarm in its own window: no two of them share one
    dist = np.ones(1)
    for _ in range(6):
        dist = np.convolve(dist, np.bincount(per_run) / len(per_run))
    assert r.shifts.observed == 6 and math.isclose(r.shifts.p, dist[6:].sum())
    assert math.isclose(r.shifts.expected, 6 * np.mean(per_run)) and r.shifts.expected > 5  # chance gives as much
    assert r.shifts.p > 0.3 and r.verdict != WARNS  # (6 hits of 48 spikes: it is decided "does not warn")
    # the same runs with a signal that rises 5 steps before every spike: both nulls reject
    w = analyze(_instability(warning=True), seeds=SEEDS).results[("logit_max", "NoQK")]
    assert (w.permutation.observed, w.permutation.p) == (48, 0.0025) and w.shifts.p < 1e-10
    assert w.verdict == WARNS and "p 0.0025 with the runs paired and " in w.text


def test_the_negative_control_is_the_loss_rise_reaction_steps_late_and_its_rises_are_reactions():
    # a flat loss of 4 nats, 6 at steps 60-62 (spike A) and 78-80 (spike B)
    rows = [{"step": s, "loss": 6.0 if 60 <= s <= 62 or 78 <= s <= 80 else 4.0} for s in range(1, N + 1)]
    run = RunSteps.of("QK@128", {"seed": 6}, rows)
    assert [(s.onset, s.end) for s in run.spikes] == [(60, 62), (78, 80)]
    steps, values = spike_rule.late_loss_rise(run)
    rise = dict(zip(*spike_rule.loss_rise(run)))
    assert steps[0] == WINDOW + 1 + 10 and steps[-1] == N  # loss_rise starts at 21, 10 steps late at 31
    late = dict(zip(steps, values))
    assert (late[69], late[70], late[72], late[73], late[88]) == (0.0, 2.0, 2.0, 0.0, 2.0)
    assert all(late[s] == rise[s - 10] for s in steps)
    # its alarms at threshold 1 are at 70 and 88: inside A's (60..72) and B's (78..90) reaction spans. 70 lies in the
    # 10 steps before B (68..77), a hit under a rule without reactions; here neither a hit nor false
    run = dataclasses.replace(run, signals={**run.signals, spike_rule.LATE_LOSS_RISE: (steps, values)})
    assert spike_rule.alarms(run, spike_rule.LATE_LOSS_RISE, 1.0) == [70, 88]
    s = spike_rule.score(run, spike_rule.LATE_LOSS_RISE, 1.0)
    assert (s.spikes, s.hits, s.false_alarms, s.alarms) == (2, 0, 0, 0)
    # every report tests it beside the signals, outside the family
    a = analyze(_runs(), seeds=SEEDS)
    control = a.checks[(spike_rule.LATE_LOSS_RISE, "NoQK")]
    assert control.permutation is not None and control.shifts is not None and control.verdict != WARNS
    assert a.family["NoQK"] == 3
