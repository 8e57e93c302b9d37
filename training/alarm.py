"""The spike alarm (--spike_alarm SIGNAL[:THRESHOLD]): a training callback that reads the signal at every logged step
as utils/telemetry.py defines it (the largest over layers; logit_growth over GROWTH_STEPS lines) and, each time
Alarm.crossed says so, prints one line and records the alarm:

    metrics.jsonl   {"step", "tokens", "alarm": {"signal", "value", "threshold"}}
    summary.json    "alarms": every alarm of the run, in that form (Trainer._summarize asks `alarms`)

Its checkpoint state holds the recent lines' signals and the alarms so far, so a resumed run continues the growth
window and neither repeats an alarm nor loses one (metrics.jsonl is cut back to the checkpoint's step with it).
"""
from __future__ import annotations

import math
from collections import deque
from typing import Callable

from utils.telemetry import GROWTH_STEPS, Alarm, series
from training.callbacks import StepInfo
from utils.errors import shown

KEPT = ("logit_max", "key_norm", "grad_norm", "update_rms")  # what any signal reads from a line


class SpikeAlarm:
    name = "spike_alarm"

    def __init__(self, alarm: Alarm, record: Callable[[dict], None], log: Callable[[str], None] = print):
        """`record(row)` appends a metrics.jsonl row (rank 0), `log` prints the alarm's line."""
        self.alarm, self.record, self.log = alarm, record, log
        self.rows: deque[dict] = deque(maxlen=GROWTH_STEPS + 2)  # the signal now and at the line before
        self.alarms: list[dict] = []

    def __call__(self, info: StepInfo) -> None:
        if "loss" not in info.metrics:  # no training line at this step
            return
        self.rows.append({k: info.metrics[k] for k in KEPT if k in info.metrics})
        signal = self.alarm.signal
        values = series(signal.name, list(self.rows))
        value, before = values[-1], (values[-2] if len(values) > 1 else None)
        if not self.alarm.crossed(value, before):
            return
        row = {"step": info.step, "tokens": info.tokens,
               "alarm": {"signal": signal.name, "value": value, "threshold": self.alarm.threshold}}
        self.alarms.append(row)
        if info.is_main:
            side = ">=" if signal.rises else "<="
            self.log(f"alarm: {signal.name} {value:.4g} {side} {self.alarm.threshold:g} at step {info.step} "
                     f"({signal.description})")
            self.record(row)

    def state_dict(self) -> dict:
        return {"rows": list(self.rows), "alarms": list(self.alarms)}

    def load_state_dict(self, state: dict) -> None:
        """The state a checkpoint saved; TypeError, changing nothing, for one that is not this callback's."""
        rows, alarms = (state.get("rows"), state.get("alarms")) if isinstance(state, dict) else (None, None)
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise TypeError(f"spike_alarm state: rows must be a list of objects, found {shown(rows)}")
        if not isinstance(alarms, list) or not all(_is_alarm(a) for a in alarms):
            raise TypeError(f"spike_alarm state: alarms must be a list of {{step, tokens, alarm}}, found "
                            f"{shown(alarms)}")
        self.rows = deque(rows, maxlen=GROWTH_STEPS + 2)
        self.alarms = list(alarms)


def _is_alarm(row) -> bool:
    if not isinstance(row, dict) or not isinstance(row.get("step"), int) or not isinstance(row.get("alarm"), dict):
        return False
    value = row["alarm"].get("value")
    return isinstance(value, (int, float)) and math.isfinite(value)
