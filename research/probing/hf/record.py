"""results.json of a Hugging Face model's training, one probe at a time: KeyRecorder for a loop of one's own (and
for KeyProbeCallback), record_keys for a loop that keeps no recorder, and the checks of the values they record."""
from __future__ import annotations

import math
import numbers
from pathlib import Path

import torch
import torch.nn as nn

from research.probing.hf.kv import hf_kv_cache_record
from research.probing.hf.measure import HFKeyProbe
from research.probing.kv_cache import KV_ROWS
from research.probing.hf.model import ProbeError, model_config, qk_norm_kind
from research.results import ResultsError, add_probe, load_results, new_results, save_results, truncate
from research.results.vocabulary import KV_CACHE
from utils.errors import shown


def _whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_probe_values(step, tokens, loss, step_name: str = "step") -> tuple[int, int, float | None]:
    """(step, tokens, loss) as the probe API records them, or ProbeError naming the argument, its value and the
    fix: step and tokens whole numbers >= 0 (not floats, not bools), loss a finite number or None."""
    for name, value, what in ((step_name, step, "optimizer steps done"), ("tokens", tokens, "training tokens seen")):
        if not _whole(value) or value < 0:
            raise ProbeError(f"{name}={shown(value, 40)} ({type(value).__name__}): give the number of {what} as a "
                             f"whole number >= 0 (an int, e.g. int({name}))")
    if loss is not None:
        ok = isinstance(loss, numbers.Real) and not isinstance(loss, bool) and math.isfinite(loss)
        if not ok:
            raise ProbeError(f"loss={shown(loss, 40)} ({type(loss).__name__}): give the mean training loss since the "
                             f"previous probe as a finite number, or None where there is none (a run whose loss "
                             f"became NaN or inf diverged: stop it rather than record it)")
        loss = float(loss)
    return int(step), int(tokens), loss


class KeyRecorder:
    """results.json of a Hugging Face model's training, one probe at a time: what KeyProbeCallback writes, for a
    loop of one's own.

    The first record decides what happens to a file already at `path`: a run starting at step 0 refuses it
    (it holds another run's probes: nothing is overwritten); a run continuing at a step after the file's last
    probe appends to it, checked to be taken on the same probe batch and model shape, so the file reads as one
    run. Records only append: a step at or before the file's last probe is refused; only a resume from a
    checkpoint (`resume`, or record_keys' `resumed_at`) drops the probes after the checkpoint's step.
    `header`: new_results' other arguments (config, preset, seed, provenance, data), merged into what the
    recorder fills in itself."""

    def __init__(self, path: str | Path, probe_ids_BT: torch.Tensor, *, tag: str = "hf", precision: str = "fp32",
                 header: dict | None = None):
        self.path = Path(path)
        self.probe = HFKeyProbe(probe_ids_BT, precision)
        self.tag = tag
        self.header = dict(header or {})
        self.results: dict | None = None
        self.last_step: int | None = None

    def _fresh(self, adapter) -> dict:
        h = self.header
        config = {**(h.get("config") or {})}
        config["model"] = {**model_config(adapter), **(config.get("model") or {})}
        config.setdefault("probe", {})["probe_batch"] = int(self.probe.ids.shape[0])
        data = {**(h.get("data") or {}), "probe_batch_sha256": self.probe.batch_sha256,
                "probe_batch": list(self.probe.ids.shape)}
        return new_results(self.tag, config=config, preset=h.get("preset"), seed=h.get("seed"),
                           provenance=h.get("provenance"), data=data)

    def _open(self, step: int, adapter, resumed_at: int | None = None) -> dict:
        """The file at `path` to append the probe at `step` to (a fresh record where there is none). Records only
        append: a step at or before the file's last probe is refused, unless the run was resumed from a checkpoint
        at `resumed_at` (the explicit resume path: the probes after it are dropped, the run takes them again)."""
        if not self.path.exists():
            return self._fresh(adapter)
        fix = f"pass another path, or move {self.path} away"
        try:
            res = load_results(self.path)
        except ResultsError as e:
            raise ProbeError(f"{e}. The probe does not write over a file it cannot read: {fix}") from e
        if step == 0 and res["steps"] and resumed_at is None:
            raise ProbeError(f"{self.path} holds probes of another run (steps {res['steps'][0]}..{res['steps'][-1]}) "
                             f"and this run starts at step 0: {fix}")
        if (res.get("data") or {}).get("probe_batch_sha256") not in (None, self.probe.batch_sha256):
            raise ProbeError(f"{self.path} was written with another probe batch: a resumed run must probe the same "
                             f"tokens (build the batch as the run did), or {fix}")
        n_layers = len(res["probes"][0]["layers"]) if res["probes"] else adapter.n_layers
        if n_layers != adapter.n_layers or res["tag"] != self.tag:
            raise ProbeError(f"{self.path} is the results of {shown(res['tag'])} with {n_layers} layers, not of this "
                             f"run ({self.tag!r}, {adapter.n_layers} layers): {fix}")
        if resumed_at is not None:
            return truncate(res, resumed_at)
        last = res["steps"][-1] if res["steps"] else None
        if last is not None and step <= last:
            raise ProbeError(f"step {step}: {self.path} holds probes up to step {last} and only appends. Fix: count "
                             f"steps from the start of training; a resumed run passes resumed_at=<its step>; or {fix}")
        return res

    def record(self, model: nn.Module, *, step: int, tokens: int, loss: float | None = None,
               wall_time_s: float | None = None, kv_cache: bool = False, kv_in_record: bool = False) -> dict:
        """Probe `model` after `step` optimizer steps and `tokens` training tokens; `loss`: the mean training loss
        since the previous probe (None at step 0); kv_cache: measure what a key cache costs too (measure; commit
        says where it goes). Rewrites results.json; returns the record."""
        check_probe_values(step, tokens, loss)  # before the forward: a bad value costs no probe
        return self.commit(self.measure(model, kv_cache), step=step, tokens=tokens, loss=loss,
                           wall_time_s=wall_time_s, kv_in_record=kv_in_record)

    def measure(self, model: nn.Module, kv_cache: bool = False) -> dict:
        """The probe's record of `model` now, written by `commit` (a Trainer's loss of the step comes later); with
        kv_cache, what a key cache would cost too (research.probing.hf.kv on the probe batch's first KV_ROWS
        sequences, in the probe's precision: 6 forwards of them and 30 approximate attentions per layer)."""
        record = self.probe(model)
        record["qk_norm"] = qk_norm_kind(self.probe.adapter(model))
        if kv_cache:
            record[KV_CACHE] = hf_kv_cache_record(self.probe.current, self.probe.ids[:KV_ROWS], self.probe.precision)
        return record

    def commit(self, record: dict, *, step: int, tokens: int, loss: float | None = None,
               wall_time_s: float | None = None, kv_in_record: bool = False) -> dict:
        """Append a record of `measure` as the probe after `step` optimizer steps and rewrite results.json. A key
        cache section it holds becomes results.json's kv_cache, with its step (the latest measured), and stays in
        the probe's record too with kv_in_record (every probe's, as train_llm's kv_every_probe)."""
        step, tokens, loss = check_probe_values(step, tokens, loss)
        if self.last_step is not None and step <= self.last_step:
            raise ProbeError(f"step {step}: this recorder's last probe was at step {self.last_step}, and records "
                             f"only append; pass the steps counted from the start of training, each probe's later "
                             f"than the one before")
        if self.results is None:
            self.results = self._open(step, self.probe.current)
        record = dict(record)
        val_loss, qk_norm = record.pop("loss"), record.pop("qk_norm")
        kv = record.get(KV_CACHE) if kv_in_record else record.pop(KV_CACHE, None)
        if kv is not None:
            self.results[KV_CACHE] = {"step": step, **kv}
        if step == 0:  # the model before training: the write-ups' val_loss starts at the first interval
            self.results["init_val_loss"], val_loss = val_loss, None
        add_probe(self.results, record, step=step, tokens=tokens, loss=loss, val_loss=val_loss,
                  wall_time_s=math.nan if wall_time_s is None else wall_time_s, qk_norm=qk_norm)
        save_results(self.path, self.results)
        self.last_step = step
        return record

    def resume(self, model: nn.Module, step: int, every: int) -> dict:
        """Continue results.json after a checkpoint at `step`, as this project's ProbeCallback does: the file must
        exist and hold the probe taken last before the checkpoint (at step - step % every); probes after `step`
        are dropped (the resumed run takes them again). Returns the file as kept."""
        fix = (f"restore {self.path.name} from a copy, or train again from step 0 into an empty folder (its probes "
               f"before step {step} cannot be rebuilt otherwise)")
        if not self.path.exists():
            raise ProbeError(f"cannot resume from step {step}: {self.path} is missing; {fix}")
        check_probe_values(step, 0, None)
        res = self._open(step + 1, self.probe.adapter(model), resumed_at=step)
        last = step - step % every
        if last not in res["steps"]:
            raise ProbeError(f"cannot resume from step {step}: {self.path} has no probe at step {last}; {fix}")
        self.results, self.last_step = res, res["steps"][-1]
        return res


def record_keys(path: str | Path, model: nn.Module, probe_ids_BT: torch.Tensor, *, step: int, tokens: int,
                loss: float | None = None, tag: str = "hf", header: dict | None = None,
                resumed_at: int | None = None, kv_cache: bool = False) -> dict:
    """One probe appended to results.json at `path`, for a loop of one's own that keeps no recorder between
    probes: the file is read back each time (KeyRecorder's rules: a step-0 call never overwrites another run's
    probes, a step at or before the file's last is refused). `resumed_at`: the step of the checkpoint a resumed
    loop restarted from, on its first call after the resume: the probes after it are dropped (taken again).
    kv_cache: measure what a key cache costs too (KeyRecorder.measure; a loop's last probe, say). Returns the
    record."""
    recorder = KeyRecorder(path, probe_ids_BT, tag=tag, header=header)
    check_probe_values(step, tokens, loss)
    if resumed_at is not None:
        check_probe_values(resumed_at, 0, None, "resumed_at")
        if step <= resumed_at:
            raise ProbeError(f"step {step}, resumed_at {resumed_at}: the first probe after a resume comes after the "
                             f"checkpoint's step; pass the step the loop has reached")
        record = recorder.measure(model, kv_cache)
        recorder.results = recorder._open(step, recorder.probe.current, resumed_at=resumed_at)
        return recorder.commit(record, step=step, tokens=tokens, loss=loss)
    return recorder.record(model, step=step, tokens=tokens, loss=loss, kv_cache=kv_cache)
