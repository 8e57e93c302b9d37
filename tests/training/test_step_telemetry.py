"""The per-step telemetry of metrics.jsonl (training/step_telemetry.py) and the spike alarm (training/alarm.py)."""
import json
import math

import pytest
from safetensors.torch import load_file

from utils.telemetry import SIGNALS, Alarm
from tests.helpers import STEP_TOKENS, quiet, train_lines
from training.alarm import SpikeAlarm
from training.callbacks import StepInfo


def fit(cfg, out, resume=False, log=quiet):
    from data import prepare_data
    from training.trainer import Trainer
    return Trainer(cfg, prepare_data(cfg, log=quiet), out, progress=False, log=log, resume=resume).fit()


def lines(out):
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def alarm_lines(out):
    return [r for r in lines(out) if "alarm" in r]


def test_every_logged_line_carries_the_signals_and_training_is_unchanged(debug_cfg, tmp_path):
    on, off = tmp_path / "on", tmp_path / "off"
    fit(debug_cfg(tokens=3 * STEP_TOKENS, ckpt_every=1, keep_last=3), on)
    fit(debug_cfg(tokens=3 * STEP_TOKENS, telemetry=False), off)
    rows = train_lines(on)
    assert [r["loss"] for r in rows] == [r["loss"] for r in train_lines(off)]  # bit for bit
    assert not any("key_norm" in r for r in train_lines(off))
    for r in rows:
        assert len(r["logit_max"]) == len(r["key_norm"]) == 2 and set(r["update_rms"]) == {"muon", "adamw"}
    # step 1 runs the initial model: k_norm's gain is 1, so every key has RMS 1 over d_head 64, norm 8 (eps 1e-6)
    assert rows[0]["key_norm"] == pytest.approx([8.0, 8.0], rel=1e-5)
    # update_rms of step 3: the weights of checkpoint 3 minus those of checkpoint 2, per optimizer
    a = load_file(str(on / "checkpoints" / "step-000002" / "model.safetensors"))
    b = load_file(str(on / "checkpoints" / "step-000003" / "model.safetensors"))
    groups = {"muon": [k for k in a if a[k].ndim == 2 and k != "embed.weight"],
              "adamw": [k for k in a if a[k].ndim < 2 or k == "embed.weight"]}
    for name, keys in groups.items():
        squares = sum(float((b[k].double() - a[k].double()).square().sum()) for k in keys)
        assert rows[2]["update_rms"][name] == pytest.approx(math.sqrt(squares / sum(a[k].numel() for k in keys)),
                                                            rel=1e-6)


def test_logit_max_is_qk_clips_maximum_where_it_is_on_and_a_sample_of_it_where_off(debug_cfg, tmp_path):
    """QK-clip with a tau no logit reaches scales by exactly 1: the same run, with the maximum over every sequence."""
    full, sample = tmp_path / "full", tmp_path / "sample"
    fit(debug_cfg(tokens=3 * STEP_TOKENS, qk_norm="none", qk_clip=1e9), full)
    fit(debug_cfg(tokens=3 * STEP_TOKENS, qk_norm="none"), sample)
    for f, s in zip(train_lines(full), train_lines(sample), strict=True):
        assert f["loss"] == s["loss"] and f["logit_max"] == f["max_logit"]
        assert all(a <= b for a, b in zip(s["logit_max"], f["logit_max"]))  # the first sequence's, of all of them


def test_lines_only_at_logged_steps(debug_cfg, tmp_path):
    fit(debug_cfg(tokens=5 * STEP_TOKENS, log_every=2), tmp_path)
    assert [r["step"] for r in train_lines(tmp_path) if "key_norm" in r] == [2, 4, 5]


# ----------------------------------------------------------------------------------------------- the alarm
def info(step, **metrics):
    return StepInfo(step=step, total_steps=99, start_step=0, tokens=10 * step, loss=1.0, wall_time_s=0.0, model=None,
                    evaluate=lambda: 0.0, is_main=True, metrics={"loss": 1.0, **metrics})


def test_the_alarm_fires_once_per_crossing_and_a_restored_state_goes_on(tmp_path):
    said, recorded = [], []
    alarm = SpikeAlarm(Alarm(SIGNALS["grad_norm"], 2.0), recorded.append, said.append)
    for step, g in enumerate([1.0, 3.0, 4.0], start=1):
        alarm(info(step, grad_norm=g))
    resumed = SpikeAlarm(Alarm(SIGNALS["grad_norm"], 2.0), recorded.append, said.append)
    resumed.load_state_dict(json.loads(json.dumps(alarm.state_dict())))  # as a checkpoint's state.json keeps it
    for step, g in enumerate([5.0, 1.0, 2.0], start=4):
        resumed(info(step, grad_norm=g))
    assert [r["step"] for r in recorded] == [2, 6] and [r["step"] for r in resumed.alarms] == [2, 6]
    assert recorded[0] == {"step": 2, "tokens": 20, "alarm": {"signal": "grad_norm", "value": 3.0, "threshold": 2.0}}
    assert said == ["alarm: grad_norm 3 >= 2 at step 2 (the gradient norm before clipping)",
                    "alarm: grad_norm 2 >= 2 at step 6 (the gradient norm before clipping)"]
    with pytest.raises(TypeError, match="spike_alarm state: rows"):
        resumed.load_state_dict({"rows": 3, "alarms": []})


def test_logit_growth_reads_the_lines_before_across_a_resume(tmp_path):
    recorded = []
    alarm = SpikeAlarm(Alarm(SIGNALS["logit_growth"], 5.0), recorded.append, quiet)
    for step in range(1, 9):
        alarm(info(step, logit_max=[1.0, 2.0]))
    resumed = SpikeAlarm(Alarm(SIGNALS["logit_growth"], 5.0), recorded.append, quiet)
    resumed.load_state_dict(alarm.state_dict())
    for step, top in enumerate([2.0, 3.0, 8.0, 8.0], start=9):  # step 11's line is the 11th: 8 - 2 = 6 >= 5
        resumed(info(step, logit_max=[top, 0.0]))
    assert [(r["step"], r["alarm"]["value"]) for r in recorded] == [(11, 6.0)]


def test_a_run_records_its_alarm_and_a_resume_neither_repeats_nor_loses_it(debug_cfg, tmp_path):
    said = []
    straight, split = tmp_path / "straight", tmp_path / "split"
    cfg = dict(spike_alarm="grad_norm:0", ckpt_every=2)
    summary = fit(debug_cfg(tokens=4 * STEP_TOKENS, **cfg), straight, log=said.append)
    assert [ln for ln in said if ln.startswith("alarm:")] == \
        [f"alarm: grad_norm {train_lines(straight)[0]['grad_norm']:.4g} >= 0 at step 1 (the gradient norm before "
         f"clipping)"]
    assert alarm_lines(straight) == summary["alarms"] == [
        {"step": 1, "tokens": STEP_TOKENS,
         "alarm": {"signal": "grad_norm", "value": train_lines(straight)[0]["grad_norm"], "threshold": 0.0}}]
    fit(debug_cfg(tokens=2 * STEP_TOKENS, **cfg), split)
    resumed = fit(debug_cfg(tokens=4 * STEP_TOKENS, **cfg), split, resume=True)
    assert alarm_lines(split) == alarm_lines(straight) and resumed["alarms"] == summary["alarms"]


def test_an_alarm_never_crossed_records_nothing(debug_cfg, tmp_path):
    summary = fit(debug_cfg(tokens=2 * STEP_TOKENS, spike_alarm="key_norm:1e9"), tmp_path)
    assert summary["alarms"] == [] and alarm_lines(tmp_path) == []


@pytest.mark.parametrize("value, message", [
    ("entropy:1", "--spike_alarm entropy:1: 'entropy' is not a signal the alarm can watch; give one of logit_max, "
                  "logit_growth, key_norm, grad_norm, gate_closed, update_rms_muon, update_rms_adamw, optionally "
                  "with a threshold (e.g. logit_max:150)"),
    ("logit_max", "--spike_alarm logit_max: no calibrated threshold for logit_max: the spike-warning study found no "
                  "threshold of it that warns (docs/spikes.md); give one, e.g. --spike_alarm logit_max:VALUE"),
    ("grad_norm:inf", "--spike_alarm grad_norm:inf: the threshold 'inf' is not a finite number; give one, e.g. "
                      "--spike_alarm grad_norm:150"),
])
def test_train_llm_refuses_a_bad_alarm_in_one_line(args, fails, tmp_path, value, message):
    assert fails(args(2, "--spike_alarm", value)) == f"error: {message}"
    assert not (tmp_path / "run").exists()


def test_a_signal_without_a_threshold_takes_the_calibrated_one(monkeypatch):
    from utils import telemetry
    monkeypatch.setattr(telemetry, "CALIBRATED", {"update_rms_adamw": 0.125})
    alarm = telemetry.parse_alarm("update_rms_adamw")
    assert (alarm.signal.name, alarm.threshold) == ("update_rms_adamw", 0.125)
    assert telemetry.parse_alarm("update_rms_adamw:0.5").threshold == 0.5  # a given threshold wins


def test_an_alarm_on_a_signal_the_telemetry_does_not_record_is_refused(args, fails, tmp_path):
    assert fails(args(2, "--spike_alarm", "logit_max:5", "--telemetry", "false")) == (
        "error: spike_alarm='logit_max:5' watches logit_max, which only the telemetry records: drop --telemetry "
        "false, or watch grad_norm")
    assert not (tmp_path / "run").exists()


def test_the_alarms_reach_results_json(args, tmp_path):
    import train_llm
    from research.results import load_results
    train_llm.main(args(3, "--spike_alarm", "grad_norm:0"))
    res = load_results(tmp_path / "run" / "results.json")
    assert res["alarms"] == alarm_lines(tmp_path / "run") and [a["step"] for a in res["alarms"]] == [1]


@pytest.mark.slow
def test_compiled_blocks_record_the_same_telemetry(debug_cfg, tmp_path):
    fit(debug_cfg(tokens=2 * STEP_TOKENS, compile="on"), tmp_path / "compiled")
    fit(debug_cfg(tokens=2 * STEP_TOKENS, compile="off"), tmp_path / "eager")
    for a, b in zip(train_lines(tmp_path / "eager"), train_lines(tmp_path / "compiled"), strict=True):
        for key in ("logit_max", "key_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4)
        assert b["update_rms"] == pytest.approx(a["update_rms"], rel=1e-4)


def test_recomputed_forwards_and_qk_in_adamw_keep_the_signals(debug_cfg, tmp_path):
    """Gradient checkpointing runs each block's forward twice: the same key_norm and logit_max. With W_q and W_k in
    AdamW their update moves from the muon group to the adamw one."""
    fit(debug_cfg(tokens=2 * STEP_TOKENS), tmp_path / "plain")
    fit(debug_cfg(tokens=2 * STEP_TOKENS, grad_checkpointing=True), tmp_path / "recomputed")
    fit(debug_cfg(tokens=2 * STEP_TOKENS, qk_optimizer="adamw"), tmp_path / "qk_adamw")
    plain, recomputed = train_lines(tmp_path / "plain"), train_lines(tmp_path / "recomputed")
    for a, b in zip(plain, recomputed, strict=True):
        assert b["key_norm"] == pytest.approx(a["key_norm"], rel=1e-6) and b["logit_max"] == a["logit_max"]
    qk = train_lines(tmp_path / "qk_adamw")[0]["update_rms"]
    assert qk["muon"] != plain[0]["update_rms"]["muon"] and qk["adamw"] != plain[0]["update_rms"]["adamw"]


def test_a_gate_alarm_without_gates_is_refused_and_with_them_the_line_holds_gate_closed(tmp_path):
    """gate_closed is only measured with gated attention: watching it without gates is refused in one line; with a
    headwise gate every logged line holds one share per layer, 0 at the first step (gates near 0.5)."""
    import json
    from configs import ConfigError, apply_overrides, get_preset
    with pytest.raises(ConfigError, match="watches the attention gates, and attn_gate is none"):
        apply_overrides(get_preset("debug"), {"spike_alarm": "gate_closed:0.9"})
    from train_llm import main
    summary = main(["--preset", "debug", "--attn_gate", "headwise", "--spike_alarm", "gate_closed:0.9", "--out",
                    str(tmp_path / "run"), "--log_every", "1", "--no_progress"])
    assert summary["alarms"] == []
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if "loss" in x and "gate_closed" in x]
    assert train and all(len(x["gate_closed"]) == 2 for x in train) and train[0]["gate_closed"] == [0.0, 0.0]
