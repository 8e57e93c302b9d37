"""The spike alarm of KeyProbeCallback(spike_alarm=...): train_llm's --spike_alarm on a Hugging Face Trainer's run."""
from __future__ import annotations

from training.alarm import SpikeAlarm
from utils.errors import ConfigError, shown
from utils.telemetry import parse_alarm

# What spike_alarm can watch on a Hugging Face Trainer's run: the gradient norm of its logs, and the RMS of the update
# its optimizer applies to the trainable weights (its one optimizer takes AdamW's signal name; the weights are copied
# before every optimizer step, only while that signal is watched)
HF_ALARM_SIGNALS = ("grad_norm", "update_rms_adamw")


def hf_spike_alarm(text: str) -> SpikeAlarm | None:
    """The spike alarm of KeyProbeCallback(spike_alarm=...): --spike_alarm's syntax and rule (utils.telemetry),
    ConfigError for a signal a Hugging Face Trainer's run does not give; the line is printed."""
    alarm = parse_alarm(text)
    if alarm is None:
        return None
    if alarm.signal.name not in HF_ALARM_SIGNALS:
        raise ConfigError(f"spike_alarm={shown(text)}: {alarm.signal.name} is recorded by this project's own trainer "
                          f"only. Fix: on a Hugging Face Trainer's run watch {', '.join(HF_ALARM_SIGNALS)}")
    return SpikeAlarm(alarm, record=lambda row: None, log=print)
