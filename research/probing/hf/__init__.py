"""The key probe for Hugging Face causal LMs while they train: transformers' Trainer, or a loop of one's own.

    probe = KeyProbeCallback("run/results.json", probe_ids_BT, every=50)      # probe_ids_BT: [B, T] token ids
    Trainer(model, args, train_dataset=..., callbacks=[probe]).train()
    KeyRecorder("run/results.json", probe_ids_BT).record(model, step=step, tokens=tokens_seen, loss=mean_loss)
    record_keys("run/results.json", model, probe_ids_BT, step=step, tokens=tokens_seen)   # or one call at a time

Each probe is one no-grad forward of the fixed batch (probing never changes training) appending one record to
results.json in this project's schema. Parts: model.py, measure.py, record.py, alarm.py, callback.py, and for the
key cache rotary.py and kv.py. The public names load on first use (transformers only then). docs/probing.md.
"""
from __future__ import annotations

import importlib

_WHERE = {"DEFAULT_EVERY": "callback", "KeyProbeCallback": "callback", "HF_ALARM_SIGNALS": "alarm",
          "hf_spike_alarm": "alarm", "HFKeyProbe": "measure", "ProbeError": "model", "model_config": "model",
          "KeyRecorder": "record", "record_keys": "record"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
