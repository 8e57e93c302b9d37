"""The per-step signals a run records beside its loss, and how an alarm reads them: one definition for the trainer's
alarm (--spike_alarm, training/alarm.py), the config's check of that option (TrainConfig.spike_alarm) and the
spike-warning study's analysis (research/analysis/spikes.py). On the ground floor, so that all three read it; no torch.

Every logged line of metrics.jsonl carries, besides "loss" and "grad_norm":
    "logit_max"   [L]  the largest attention logit q . k / sqrt(d_head) of each layer in the step (as QK-clip reads it)
    "key_norm"    [L]  the mean key norm of each layer in the step's forward (after the key norm, before RoPE)
    "gate_closed" [L]  with gated attention: the share of each layer's gate values below GATE_CLOSED in the step
    "update_rms"  {"muon": x, "adamw": y}  the RMS of the update the step applied to each optimizer group's weights
A signal is one number per step made from those lines (the largest over layers where a line holds one per layer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from utils.errors import ConfigError, cut, shown

GROWTH_STEPS = 10  # logit_growth: the rise of logit_max over this many steps
GATE_CLOSED, GATE_OPEN = 0.05, 0.95  # a gate value below / above: shut / open (marin #8818 counted those below 0.05)


@dataclass(frozen=True)
class Signal:
    name: str
    description: str
    rises: bool = True  # the alarm fires when the value reaches the threshold from below (False: from above)
    per_step: bool = True  # read from every metrics.jsonl line (False: only at probe steps, from results.json)
    studied: bool = True  # one the spike-warning study studies (False: a gated model's, which its conditions lack)


SIGNALS = {s.name: s for s in (
    Signal("logit_max", "the largest attention logit over the layers"),
    Signal("logit_growth", f"the rise of logit_max over the last {GROWTH_STEPS} steps"),
    Signal("key_norm", "the largest per-layer mean key norm"),
    Signal("grad_norm", "the gradient norm before clipping"),
    Signal("gate_closed", f"the largest per-layer share of attention-output gates below {GATE_CLOSED} (gated "
                          f"attention)", studied=False),
    Signal("update_rms_muon", "the RMS of the update applied to the Muon group's weights"),
    Signal("update_rms_adamw", "the RMS of the update applied to the AdamW group's weights"),
    Signal("entropy", "the lowest per-layer mean attention entropy, at probe steps", rises=False, per_step=False),
)}
ALARM_SIGNALS = tuple(n for n, s in SIGNALS.items() if s.per_step)  # what --spike_alarm can watch
STUDIED = {n: s for n, s in SIGNALS.items() if s.studied}  # what the spike-warning study reads

# The thresholds of the signals the spike-warning study found to warn (docs/spikes.md): --spike_alarm SIGNAL with no
# threshold uses these. Its run at 12 seeds showed none to warn (docs/spikes.md, Result), so it is empty.
CALIBRATED: dict[str, float] = {}


def _largest(value) -> float | None:
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return max(finite) if finite else None


def step_value(name: str, row: dict) -> float | None:
    """A per-step signal's own value in one metrics.jsonl line (None where the line does not hold it); logit_growth
    needs the lines before it: series()."""
    if name in ("logit_max", "key_norm", "grad_norm", "gate_closed"):
        return _largest(row.get(name))
    if name in ("update_rms_muon", "update_rms_adamw"):
        return _largest((row.get("update_rms") or {}).get(name.rsplit("_", 1)[1]))
    raise ValueError(f"{name} is not a per-step signal read from one line")


def series(name: str, rows: list[dict]) -> list[float | None]:
    """The signal at every line of `rows` (metrics.jsonl's training lines, one per step, in step order)."""
    if name != "logit_growth":
        return [step_value(name, r) for r in rows]
    top = [step_value("logit_max", r) for r in rows]
    return [None if i < GROWTH_STEPS or top[i] is None or top[i - GROWTH_STEPS] is None
            else top[i] - top[i - GROWTH_STEPS] for i in range(len(rows))]


@dataclass(frozen=True)
class Alarm:
    signal: Signal
    threshold: float

    def crossed(self, value: float | None, before: float | None) -> bool:
        """The signal reached the threshold at this step, having been on the other side at the step before."""
        if value is None:
            return False
        if self.signal.rises:
            return value >= self.threshold and (before is None or before < self.threshold)
        return value <= self.threshold and (before is None or before > self.threshold)


def parse_alarm(text: str) -> Alarm | None:
    """--spike_alarm SIGNAL[:THRESHOLD] ("none" or "": off). ConfigError naming the fix for anything else."""
    if text in ("", "none"):
        return None
    name, sep, value = text.partition(":")
    given = cut(text, 60)
    if name not in ALARM_SIGNALS:
        raise ConfigError(f"--spike_alarm {given}: {shown(name, 40)} is not a signal the alarm can watch; give one of "
                          f"{', '.join(ALARM_SIGNALS)}, optionally with a threshold (e.g. logit_max:150)")
    if not sep:
        if name not in CALIBRATED:
            raise ConfigError(f"--spike_alarm {given}: no calibrated threshold for {name}: the spike-warning study "
                              f"found no threshold of it that warns (docs/spikes.md); give one, e.g. "
                              f"--spike_alarm {name}:VALUE")
        return Alarm(SIGNALS[name], CALIBRATED[name])
    try:
        threshold = float(value)
    except ValueError:
        threshold = math.nan
    if not math.isfinite(threshold):
        raise ConfigError(f"--spike_alarm {given}: the threshold {shown(value, 40)} is not a finite number; give one, "
                          f"e.g. --spike_alarm {name}:150")
    return Alarm(SIGNALS[name], threshold)
