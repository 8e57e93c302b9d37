"""The per-step signals and the alarm's rule (utils.telemetry), on lines known by hand."""
import pytest

from utils.telemetry import GROWTH_STEPS, SIGNALS, Alarm, parse_alarm, series
from utils.errors import ConfigError


def _row(step, logit_max, key_norm=(1.0, 2.0), muon=0.01, adamw=0.002, grad_norm=1.5):
    return {"step": step, "loss": 3.0, "grad_norm": grad_norm, "logit_max": list(logit_max), "key_norm": list(key_norm),
            "update_rms": {"muon": muon, "adamw": adamw}}


def test_each_signal_is_the_largest_over_layers_and_growth_looks_back():
    rows = [_row(i, (float(i), 2.0 * i)) for i in range(GROWTH_STEPS + 2)]
    assert series("logit_max", rows)[3] == 6.0
    assert series("key_norm", rows)[0] == 2.0
    assert series("update_rms_muon", rows)[0] == 0.01 and series("update_rms_adamw", rows)[0] == 0.002
    assert series("grad_norm", rows)[0] == 1.5
    growth = series("logit_growth", rows)
    assert growth[:GROWTH_STEPS] == [None] * GROWTH_STEPS and growth[GROWTH_STEPS] == 2.0 * GROWTH_STEPS
    assert series("logit_max", [{"step": 1, "loss": 3.0}]) == [None]  # a line without telemetry


def test_an_alarm_fires_when_the_signal_crosses_not_while_it_stays_over():
    up = Alarm(SIGNALS["logit_max"], 100.0)
    assert [up.crossed(v, b) for v, b in ((99.0, None), (100.0, 99.0), (150.0, 100.0), (120.0, None))] == \
        [False, True, False, True]
    down = Alarm(SIGNALS["entropy"], 0.5)
    assert down.crossed(0.4, 0.6) and not down.crossed(0.4, 0.45) and not down.crossed(None, 0.6)


def test_the_alarm_option_is_read_or_refused_with_the_fix():
    assert parse_alarm("none") is None and parse_alarm("") is None
    alarm = parse_alarm("logit_max:150")
    assert alarm.signal.name == "logit_max" and alarm.threshold == 150.0
    for text, message in (
            ("entropy:0.5", "--spike_alarm entropy:0.5: 'entropy' is not a signal the alarm can watch; give one of "
                            "logit_max, logit_growth, key_norm, grad_norm, gate_closed, update_rms_muon, "
                            "update_rms_adamw, optionally with a threshold (e.g. logit_max:150)"),
            ("logit_max:abc", "--spike_alarm logit_max:abc: the threshold 'abc' is not a finite number; give one, "
                              "e.g. --spike_alarm logit_max:150"),
            ("grad_norm:inf", "--spike_alarm grad_norm:inf: the threshold 'inf' is not a finite number; give one, "
                              "e.g. --spike_alarm grad_norm:150")):
        with pytest.raises(ConfigError) as e:
            parse_alarm(text)
        assert str(e.value) == message
