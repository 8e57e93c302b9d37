"""The per-step signals and the alarm rule, defined in configs/telemetry.py (TrainConfig checks --spike_alarm with
parse_alarm, and configs may not import training); the names are kept here for the readers of metrics.jsonl."""
from configs.telemetry import (ALARM_SIGNALS, CALIBRATED, GROWTH_STEPS, SIGNALS, Alarm, Signal, parse_alarm, series,
                               step_value)

__all__ = ["ALARM_SIGNALS", "CALIBRATED", "GROWTH_STEPS", "SIGNALS", "Alarm", "Signal", "parse_alarm", "series",
           "step_value"]
