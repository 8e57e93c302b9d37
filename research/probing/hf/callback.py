"""KeyProbeCallback: the key probe of a Hugging Face causal LM inside transformers' Trainer (the package's
__init__ shows how it is used)."""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from research.probing.hf.alarm import hf_spike_alarm
from research.probing.hf.model import ProbeError
from research.probing.hf.record import KeyRecorder
from training.callbacks import StepInfo
from training.step_telemetry import squared_change
from utils.errors import shown

__all__ = ["DEFAULT_EVERY", "KeyProbeCallback"]

DEFAULT_EVERY = 50  # optimizer steps between probes


def _sharded(args) -> str | None:
    """The kind of sharded training `args` (TrainingArguments) asks for, which the probe cannot follow."""
    if getattr(args, "fsdp", None):
        return "FSDP"
    if getattr(args, "deepspeed", None):
        return "DeepSpeed"
    return None


class KeyProbeCallback(TrainerCallback):
    """A transformers TrainerCallback that probes the keys at step 0, every `every` optimizer steps and at the last
    step, keeping results.json (research/results/schema.py) up to date; see the module doc.

    `loss` at a probe is the mean training loss of the steps since the previous probe, read from the Trainer's
    own logs: the callback asks the Trainer to log at every probe step (besides its logging_steps), so each
    window is exact. `tokens`: the Trainer's count (TrainingArguments(include_num_input_tokens_seen=True)),
    else `tokens_per_step` x step. Resuming (trainer.train(resume_from_checkpoint=...)) continues the file
    from the checkpoint's step: it must exist and hold the probe taken last before that step, as this
    project's own ProbeCallback requires; the loss window is rebuilt from the checkpoint's log history.
    Only the main process probes and writes. `spike_alarm` ("SIGNAL[:THRESHOLD]", HF_ALARM_SIGNALS; "none": off):
    at every Trainer log with a loss, the alarm of train_llm's --spike_alarm, printed and kept in results.json's
    "alarms" (a resumed run takes back those of its file, so it neither repeats nor loses one). `kv_cache`: at the
    last step, what a key cache would cost too (research.probing.hf.kv, results.json's kv_cache, as train_llm's
    --kv_cache); `kv_every_probe`: at every probe, kept in each probe's record."""

    def __init__(self, path: str | Path, probe_ids_BT: torch.Tensor, *, every: int = DEFAULT_EVERY,
                 tokens_per_step: int | None = None, tag: str = "hf", precision: str = "fp32",
                 header: dict | None = None, spike_alarm: str = "none", kv_cache: bool = False,
                 kv_every_probe: bool = False):
        self.spike = hf_spike_alarm(spike_alarm)
        self.kv_cache, self.kv_every_probe = kv_cache or kv_every_probe, kv_every_probe
        self.before: list[torch.Tensor] | None = None  # the weights before the optimizer step (update_rms_adamw)
        self.update_rms: float | None = None
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ProbeError(f"every must be a whole number of optimizer steps >= 1, got {shown(every, 40)}")
        self.every, self.tokens_per_step = every, tokens_per_step
        self.recorder = KeyRecorder(path, probe_ids_BT, tag=tag, precision=precision, header=header)
        self.logged: list[tuple[int, float, int]] = []  # (step, mean loss, steps it covers) of the Trainer's logs
        self.pending: tuple[int, int, float, dict] | None = None  # (step, tokens, wall, record) awaiting its loss
        self.last_probe = 0
        self.t0, self.wall0 = time.perf_counter(), 0.0

    def _tokens(self, args, state) -> int:
        if getattr(args, "include_num_input_tokens_seen", "no") not in ("no", False, None):
            return int(state.num_input_tokens_seen)
        return state.global_step * self.tokens_per_step

    def _window_loss(self, end: int) -> float | None:
        """The mean training loss over the steps after the previous probe up to `end`, from the logs (each log's
        mean weighted by the steps it covers)."""
        inside = [(loss, n) for step, loss, n in self.logged if self.last_probe < step <= end]
        steps = sum(n for _, n in inside)
        return sum(loss * n for loss, n in inside) / steps if steps else None

    def _commit_pending(self) -> None:
        step, tokens, wall, record = self.pending
        if self.spike is not None and self.recorder.results is not None:
            self.recorder.results["alarms"] = list(self.spike.alarms)
        self.recorder.commit(record, step=step, tokens=tokens, loss=self._window_loss(step), wall_time_s=wall,
                             kv_in_record=self.kv_every_probe)
        self.last_probe, self.pending = step, None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        sharded = _sharded(args)
        if sharded:
            raise ProbeError(f"the key probe needs the whole model on the process that writes results.json; "
                             f"{sharded} shards it. Train with DDP or on one device to probe the keys")
        if getattr(args, "include_num_input_tokens_seen", "no") in ("no", False, None) and not self.tokens_per_step:
            raise ProbeError("the key probe records training tokens at each probe: pass TrainingArguments("
                             "include_num_input_tokens_seen=True), or tokens_per_step to KeyProbeCallback")
        self.t0 = time.perf_counter()
        self.logged, last = [], 0
        for entry in state.log_history:  # a resumed run's logs come back with its trainer_state.json
            if "loss" in entry and "step" in entry:
                self.logged.append((entry["step"], float(entry["loss"]), entry["step"] - last))
                last = entry["step"]
        if self.spike is not None:  # a resumed run: the logs before, so the first crossing is judged as it was
            for entry in state.log_history:
                if "loss" in entry and "step" in entry:
                    self.spike.rows.append({"grad_norm": entry.get("grad_norm")})
        if not state.is_world_process_zero:
            return
        if state.global_step == 0:
            self.recorder.record(model, step=0, tokens=0, wall_time_s=0.0, kv_cache=self.kv_every_probe,
                                 kv_in_record=self.kv_every_probe)
            return
        res = self.recorder.resume(model, state.global_step, self.every)
        if self.spike is not None:
            self.spike.alarms = [a for a in res.get("alarms", []) if a["step"] <= state.global_step]
        self.last_probe = res["steps"][-1]
        walls = [w for w in res["wall_time_s"] if w is not None]
        self.wall0 = walls[-1] if walls else 0.0

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        if step % self.every and step != state.max_steps:
            return
        control.should_log = True  # the loss window of this probe ends here: the Trainer logs it right after
        if state.is_world_process_zero:
            if self.pending is not None:  # its log never came (logging turned off by another callback)
                self._commit_pending()
            kv = self.kv_every_probe or (self.kv_cache and step == state.max_steps)
            self.pending = (step, self._tokens(args, state), self.wall0 + time.perf_counter() - self.t0,
                            self.recorder.measure(model, kv))

    def _watches_update(self) -> bool:
        return self.spike is not None and self.spike.alarm.signal.name == "update_rms_adamw"

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self._watches_update():
            self.before = [p.detach().clone() for p in model.parameters() if p.requires_grad]

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self._watches_update() and self.before is not None:
            after = [p.detach() for p in model.parameters() if p.requires_grad]
            squares = float(squared_change(after, self.before))
            n = sum(p.numel() for p in after)
            self.update_rms, self.before = (math.sqrt(squares / n) if n else None), None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.spike is not None and logs and "loss" in logs:
            metrics = {"loss": logs["loss"], "grad_norm": logs.get("grad_norm"),
                       "update_rms": {"adamw": self.update_rms}}
            self.spike(StepInfo(step=state.global_step, total_steps=state.max_steps, start_step=0,
                                tokens=self._tokens(args, state), loss=logs["loss"], wall_time_s=0.0,
                                model=kwargs.get("model"), evaluate=lambda: math.nan,
                                is_main=state.is_world_process_zero, metrics=metrics))
        if logs and "loss" in logs:
            last = self.logged[-1][0] if self.logged else 0
            self.logged.append((state.global_step, float(logs["loss"]), state.global_step - last))
        if self.pending is not None and self.pending[0] == state.global_step:
            self._commit_pending()

    def on_train_end(self, args, state, control, **kwargs):
        if self.pending is not None:
            self._commit_pending()
