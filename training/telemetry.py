"""The per-step spike signals and the alarm rule are defined in utils/telemetry.py, below both the trainer and the
torch-free analysis (research/analysis/spikes.py may not import training); this name is kept for the trainer."""
from utils.telemetry import (ALARM_SIGNALS, CALIBRATED, GROWTH_STEPS, SIGNALS, Alarm, Signal,  # noqa: F401
                             parse_alarm, series, step_value)
