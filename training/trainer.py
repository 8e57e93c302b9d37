"""The training loop: accumulation, clipping, schedule, precision, compile, DDP, checkpoints.

One Trainer trains one model described by a RunConfig into an output folder: config.json, metrics.jsonl (a line per
logged step, validation and --spike_alarm alarm), tokenizer/, checkpoints/step-N (training/checkpoint.py) and
summary.json. It receives prepared data (data.prepare_data) and a utils.runtime.Runtime; `training.run.train_run`
does both for one config and holds the folder's lock. QK-clip and the telemetry read the model through hooks at its
hook points (training.observers); callbacks (training.callbacks) see each step through a StepInfo. It works alone or
under torchrun (DDP, or FSDP2 with --shard fsdp); only rank 0 writes, and nothing until every check has passed.
What a run writes and how it resumes: docs/training.md, "What a run writes" and "Interrupted runs and resumes".
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configs.config import ConfigError, RunConfig
from utils.telemetry import parse_alarm
from data import BlockLoader, TokenData, data_usage, val_batches
from models import MinimalLLM
from optimizers import build_optimizers, format_split
from training.alarm import SpikeAlarm
from training.callbacks import Callback, CallbackFactory, StepInfo, after_checkpoint, before_stop
from training.checkpoint import (Checkpoint, CheckpointError, after_resume, apply_checkpoint, latest_checkpoint,
                                 list_checkpoints, load_newest, read_checkpoint, read_state, restore_callback,
                                 save_checkpoint, set_aside)
from training.errors import NonFiniteLossError, non_finite_fix
from training.observers import QKClip
from training.resume import check_resume_length, check_same_data, data_differences, data_identity, saved_identity
from training.run_files import RunFolder
from training.schedule import lr_factor
from training.sharding import (ProbeCopy, check_sharding, full_model_state, full_optimizer_states, no_grad_sync,
                               shard_checkpoint, shard_model, whole_tensor)
from training.step_telemetry import StepTelemetry
from utils.runtime import (Runtime, autocast, keep_freed_memory, provenance, resolve_compile, resolve_runtime,
                           set_cpu_threads)
from utils.testhook import hook
from utils.time_split import TimeSplit, is_record, split_line

__all__ = ["Trainer", "NonFiniteLossError"]


class Trainer:
    def __init__(self, cfg: RunConfig, data: TokenData, out_dir: str | Path, *, resume: bool = False,
                 replan_schedule: bool = False, log: Callable = print, progress: bool = True, name: str = "train",
                 callbacks: CallbackFactory | None = None, runtime: Runtime | None = None,
                 times: TimeSplit | None = None):
        """`times`: the run's wall time by phase, from its start (training.run.train_run's; a new one when None),
        summed over resumed sessions through the checkpoints. `runtime`: where this process computes and in which
        process group (training.run.train_run's, which started the group; resolved here from cfg.train when None).
        `callbacks(cfg, data, runtime)` builds the run's callbacks before a resume chooses its checkpoint (their
        saved states are checked with it); add_callback registers more later."""
        self.cfg, self.data, self.out, self.name = cfg, data, Path(out_dir), name
        self.times = times or TimeSplit()
        self._earlier_times: dict | None = None  # the time split the checkpoint resumed from recorded
        self.runtime = runtime or resolve_runtime(cfg.train.device, cfg.train.precision)
        self.device, self.precision, self.is_main = self.runtime.device, self.runtime.precision, self.runtime.is_main
        self.threads = None  # how many CPU threads and why (utils.threads), on CPU or where --threads asks
        if self.device.type == "cpu" or cfg.train.threads:  # --threads: a runtime setting (not compared on resume)
            self.threads = set_cpu_threads(cfg.train.threads, self.runtime.local_world_size)
        if self.device.type == "cpu":
            keep_freed_memory()
        self._log = log if self.is_main else (lambda *a, **k: None)
        self.progress = progress and self.is_main
        self.folder = RunFolder(self.out, self._log)
        self.callbacks: list[Callback] = []
        self.resume_state: dict = {}  # state.json of the checkpoint resumed from
        self.resumed_from: Checkpoint | None = None
        self.data_id = data_identity(data)  # recorded in every checkpoint; a resume must find the same
        self.last_loss: float | None = None  # training loss of the latest step
        self.last_z_loss: float | None = None  # the z-loss term of the latest step (z_loss > 0 only)
        self.last_telemetry: dict = {}  # the telemetry's fields of the latest step (a logged one only)
        self._val_cache: tuple[int, float] | None = None  # (step, validation loss at that step)
        self._unreadable: list[Checkpoint] = []  # checkpoints that failed to load, set aside in fit()
        self.steps, self.step, self.start_step = cfg.steps, 0, 0  # start_step: where this session began
        self.resumed, self.wall_time = resume, 0.0  # wall_time: seconds of training, summed over resumed sessions
        self.fsdp = cfg.train.shard == "fsdp"
        saved = self._check(resume)
        self._add_callbacks(callbacks)
        self._build_model()
        self._build_optimizers()
        self._build_data()
        if resume:
            self._resume(saved, replan_schedule)
        self._log_start(self._compile())

    # ----------------------------------------------------------------- setup
    def _check(self, resume: bool) -> RunConfig | None:
        """Refuse a batch the processes cannot split, sharding this run cannot have, and a folder the run cannot
        start or go on in (RunFolder.check_start); returns the saved config of a resumed run."""
        tc, world = self.cfg.train, self.runtime.world_size
        if tc.batch_size % world:
            raise ConfigError(f"batch_size={tc.batch_size} is not divisible by the {world} "
                              f"processes: the global batch is split evenly across ranks")
        check_sharding(self.cfg, world)
        return self.folder.check_start(resume, self.cfg)

    def _add_callbacks(self, callbacks: CallbackFactory | None) -> None:
        """The spike alarm first (its metrics.jsonl line comes before what the other callbacks do at the step),
        then the run's own, built before anything is allocated."""
        alarm = parse_alarm(self.cfg.train.spike_alarm)
        self.alarm = SpikeAlarm(alarm, self._write_metrics, self._log) if alarm else None
        if self.alarm:
            self._register(self.alarm)
        for callback in (callbacks(self.cfg, self.data, self.runtime) if callbacks else []):
            self._register(callback)

    def _build_model(self) -> None:
        tc = self.cfg.train
        torch.manual_seed(tc.seed)  # same initial weights on every rank
        self.model = MinimalLLM(self.cfg.model).to(self.device)
        self.model.grad_checkpointing = tc.grad_checkpointing
        self.model.fused_loss = tc.fused_loss
        self.model.z_loss = tc.z_loss  # the training objective adds it; the logged loss stays the cross-entropy
        if self.fsdp:
            shard_model(self.model, self.device)  # before the optimizers: they hold the sharded parameters
        self.full_model = ProbeCopy(self.model, self.device, self.is_main) if self.fsdp else (lambda: self.model)

    def _build_optimizers(self) -> None:
        """Muon and AdamW (optimizers/split.py), and what reads the model at its hook points each step
        (training/observers.py): QK-clip's largest logits, the telemetry's signals of a logged step."""
        tc, blocks = self.cfg.train, self.model.blocks
        self.optimizers, self.split = build_optimizers(self.model, tc, self.device.type, self.precision)
        self.qk_clip = QKClip(blocks, tc.qk_clip, self.runtime) if tc.qk_clip > 0 else None
        self.telemetry = StepTelemetry(blocks, self.optimizers, self.runtime, self.qk_clip and self.qk_clip.logits) \
            if tc.telemetry else None

    def _build_data(self) -> None:
        tc, rank, world = self.cfg.train, self.runtime.rank, self.runtime.world_size
        self.loader = BlockLoader(self.data.train, tc.batch_size, tc.seed, rank, world)
        self.val = val_batches(self.data.val, tc.batch_size, tc.eval_batches, rank, world)

    def _compile(self) -> str:
        """Compile the blocks (--compile) and wrap the model in DDP under torchrun (not under FSDP); returns why
        it compiles or not."""
        tc = self.cfg.train
        self.compiled, why = resolve_compile(tc.compile, self.device)
        if self.fsdp and tc.compile == "auto":
            self.compiled, why = False, "auto: not with --shard fsdp, not yet tested together; --compile on"
        if self.compiled:
            self.model.compile_blocks()
        self.fwd = DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None) \
            if self.runtime.distributed and not self.fsdp else self.model
        return why

    def _log_start(self, compile_why: str) -> None:
        cfg, tc = self.cfg, self.cfg.train
        self._log(f"run: preset={cfg.preset} device={self.runtime.device_choice()} "
                  f"precision={self.runtime.precision_choice()} "
                  f"processes={self.runtime.world_size} threads={torch.get_num_threads()}"
                  f"{f' ({self.threads.why})' if self.threads else ''} shard={tc.shard} "
                  f"compile={self.compiled} ({compile_why}) fused_loss={tc.fused_loss}")
        self._log(f"model: {self.model.num_params():,} parameters, {cfg.model.n_layers} layers, d_model "
                  f"{cfg.model.d_model}, heads {cfg.model.n_heads}/{cfg.model.n_kv_heads} (q/kv), d_head "
                  f"{cfg.model.d_head}, qk_norm={cfg.model.qk_norm}")
        self._log(format_split(self.split))
        self._log(f"data: {len(self.data.train):,} train / {len(self.data.val):,} val blocks of "
                  f"{cfg.data.seq_len} tokens; {self.steps} steps of {cfg.tokens_per_step:,} tokens")

    def _load(self, ckpt: Checkpoint) -> None:
        """Load one checkpoint into the model, optimizers and loader (CheckpointError if it cannot be)."""
        state, weights, blob = read_checkpoint(ckpt)
        if state["step"] != ckpt.step:
            raise CheckpointError(f"state.json says step {state['step']}, the folder step {ckpt.step}")
        if self.fsdp:
            shard_checkpoint(weights, blob, self.model, self.optimizers)
        apply_checkpoint(ckpt, weights, blob, self.model, self.optimizers)
        saved_data = saved_identity(state)
        if saved_data and data_differences(saved_data, self.data_id):  # another checkpoint has this run's data
            raise CheckpointError(f"state.json says it was trained on other data "
                                  f"({'; '.join(data_differences(saved_data, self.data_id))})")
        try:
            self.loader.load_state_dict(state["loader"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"state.json holds no usable data position ({e})") from e
        for callback in self.callbacks:
            restore_callback(callback, state)
        self.step = self.start_step = state["step"]
        self.resume_state, self.resumed_from = state, ckpt
        self.wall_time = float(state.get("wall_time", 0.0))
        self._earlier_times = state.get("time_split")  # added to self.times once this checkpoint is the one

    def _resume(self, saved: RunConfig, replan: bool) -> None:
        root = self.folder.checkpoints
        recorded = [(c.path.name, c.step, ident) for c in reversed(list_checkpoints(root))
                    if (ident := saved_identity(read_state(c)))]
        check_same_data(recorded, self.data_id, self.cfg, self.out)  # a data change is never blamed on checkpoints
        ckpt, failed = load_newest(root, self._load)
        for bad, why in failed:
            self._log(f"warning: checkpoint {bad.path} cannot be loaded: {why}")
        if ckpt is None and failed:
            raise CheckpointError(f"no checkpoint under {root} can be loaded (see above). Restore them from a copy, "
                                  f"or move {root} away to train {self.out} again from step 0")
        self._unreadable = [c for c, _ in failed]
        if ckpt is not None:
            self.times.restore(self._earlier_times)
        if ckpt is None:
            self._log(f"resume: no checkpoint yet in {root} (the run stopped before its first one): starting again "
                      f"from step 0; metrics.jsonl and results.json are cut back to step 0")
            return
        if failed:
            self._log(f"resume: falling back to {ckpt.path}, the newest checkpoint that loads; the unreadable "
                      f"one(s) are kept as step-N.unreadable")
        replanned = check_resume_length(saved, self.cfg, self.step, replan, self.out)
        if replanned:
            self._log(replanned)
        for callback in self.callbacks:
            after_resume(callback)
        self._log(f"resume: continuing from {ckpt.path} (step {self.step})")

    def _begin(self) -> None:
        """Rank 0, before the first step: config.json first, then clear what an interrupted run left."""
        self.folder.write_config(self.cfg)
        for ckpt in self._unreadable:
            self._log(f"set aside {ckpt.path} as {set_aside(ckpt).name}")
        self.folder.remove_orphans()
        self.folder.copy_tokenizer(self.data.tokenizer_dir)
        if self.resumed:
            self.folder.truncate_metrics(self.step)

    def _register(self, callback: Callback) -> None:
        if any(c.name == callback.name for c in self.callbacks):
            raise ValueError(f"a callback named {callback.name!r} is already registered")
        self.callbacks.append(callback)

    def add_callback(self, callback: Callback) -> None:
        """Register a callback after construction; on a resumed run it gets back the state saved under its name
        in the checkpoint already chosen (pass callbacks= to the constructor to have that state checked while
        choosing it)."""
        self._register(callback)
        if self.resumed_from is None:
            return
        try:
            restore_callback(callback, self.resume_state)
        except CheckpointError as e:
            self.callbacks.remove(callback)
            raise CheckpointError(f"checkpoint {self.resumed_from.path}: {e}. Move it away to resume from the one "
                                  f"before, or restore it from a copy") from e
        after_resume(callback)

    @property
    def tokens_seen(self) -> int:
        return self.step * self.cfg.tokens_per_step

    # --------------------------------------------------------------- logging
    def _write_metrics(self, record: dict) -> None:
        if self.is_main:
            with self.times.phase("writing"):
                self.folder.append_metrics(record)

    def _save(self) -> None:
        with self.times.phase("writing"):
            self._save_checkpoint()

    def _save_checkpoint(self) -> None:
        # FSDP: every rank takes part in gathering the whole tensors, rank 0 writes them
        tensors = (full_model_state(self.model, keep=self.is_main),
                   full_optimizer_states(self.optimizers, keep=self.is_main)) if self.fsdp else None
        if self.is_main:
            path = save_checkpoint(self.folder.checkpoints, self.step, self.model, self.optimizers,
                            {"tokens": self.tokens_seen, "loader": self.loader.state_dict(),
                             "wall_time": self.wall_time, "time_split": self.times.record(),
                             "config": self.cfg.to_dict(), "data": self.data_id,
                             "callbacks": {c.name: c.state_dict() for c in self.callbacks}},
                            keep_last=self.cfg.train.keep_last, tensors=tensors)
            after_checkpoint(self.callbacks, path)
        self.runtime.barrier()

    # ------------------------------------------------------------ the loop
    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the fixed validation batches (all ranks).

        Weights change only in train_step, so the value is kept for the current step: the
        callbacks (the probe) and the loop's own validation at the same step share one pass.
        """
        if self._val_cache is not None and self._val_cache[0] == self.step:
            return self._val_cache[1]
        with self.times.phase("validation"):
            return self._validate()

    def _validate(self) -> float:
        was_training = self.model.training
        self.model.eval()
        total = 0.0
        for x, y in self.val:
            with autocast(self.device, self.precision):
                total += self.model(x.to(self.device), y.to(self.device)).item()
        self.model.train(was_training)
        loss = self.runtime.mean(total / len(self.val))
        self._val_cache = (self.step, loss)
        return loss

    def train_step(self) -> tuple[float, float]:
        """One optimizer step over grad_accum micro-batches; returns (mean loss, grad norm)."""
        tc = self.cfg.train
        factor = lr_factor(self.step, self.steps, tc)
        for opt in self.optimizers:
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * factor
        loss_sum = torch.zeros((), device=self.device)
        z_sum = torch.zeros((), device=self.device)
        if self.qk_clip:
            self.qk_clip.reset()
        telemetry = self.telemetry if self._logs(self.step + 1) else None
        if telemetry:
            telemetry.begin()
        for micro in range(tc.grad_accum):
            x, y = self.loader.next_batch()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            last = micro == tc.grad_accum - 1
            sync = nullcontext() if (last or not self.runtime.distributed) else \
                no_grad_sync(self.model) if self.fsdp else self.fwd.no_sync()
            with sync:
                with autocast(self.device, self.precision):
                    loss = self.fwd(x, y)
                (loss / tc.grad_accum).backward()
            if tc.z_loss:  # the objective was CE + z-loss: log the cross-entropy, and the z term beside it
                loss_sum += self.model.loss_parts["loss"]
                z_sum += self.model.loss_parts["z_loss"]
            else:
                loss_sum += loss.detach()
        loss_value = self.runtime.mean(loss_sum.item() / tc.grad_accum)
        if tc.z_loss:
            self.last_z_loss = self.runtime.mean(z_sum.item() / tc.grad_accum)
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip if tc.grad_clip > 0 else math.inf)
        grad_norm = whole_tensor(grad_norm).item()  # a DTensor under FSDP
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
            self._fail_non_finite(loss_value, grad_norm)
        if telemetry:
            telemetry.before_update()
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        if telemetry:
            telemetry.after_update()
        if self.qk_clip:
            self.qk_clip.after_update()
        self.last_telemetry = telemetry.fields() if telemetry else {}
        self.step += 1
        return loss_value, grad_norm

    def _checkpoints(self, step: int) -> bool:
        """Whether a checkpoint is written after `step` (after the step's callbacks)."""
        return bool(self.cfg.train.ckpt_every and step % self.cfg.train.ckpt_every == 0) or step == self.steps

    def _logs(self, step: int) -> bool:
        """Whether the step that ends at `step` writes a metrics.jsonl line."""
        return step % self.cfg.train.log_every == 0 or step == self.steps

    def _fail_non_finite(self, loss: float, grad_norm: float) -> None:
        ckpt = latest_checkpoint(self.folder.checkpoints)
        kept = (f"its last good checkpoint {ckpt.path} (step {ckpt.step})" if ckpt else "no checkpoint yet")
        fix = non_finite_fix(self.cfg.train, self.cfg.model.vocab_size, self.precision)
        if self.is_main:
            before_stop(self.callbacks)  # the run ends here: callbacks write what they hold
        raise NonFiniteLossError(
            f"step {self.step + 1}: loss={loss}, grad norm={grad_norm} is not finite; stopped before applying it, "
            f"{self.out} kept as after step {self.step}, {kept}; a resume keeps the options that diverged. Fix: train "
            f"again in another --out {fix}",
            step=self.step + 1)

    def _run_callbacks(self, logged: dict | None = None) -> None:
        if not self.callbacks:
            return
        lrs = {g.get("name", f"group{i}"): g["lr"] for opt in self.optimizers
               for i, g in enumerate(opt.param_groups)}  # as used in this step (train_step sets them)
        info = StepInfo(step=self.step, total_steps=self.steps, start_step=self.start_step,
                        tokens=self.tokens_seen, loss=self.last_loss if self.step > 0 else None,
                        wall_time_s=self.wall_time, model=self.model, evaluate=self.evaluate,
                        is_main=self.is_main, metrics=logged or {}, lrs=lrs, full_model=self.full_model,
                        world_size=self.runtime.world_size, alarms=self.alarm.alarms if self.alarm else None,
                        times=self.times, checkpoint=self.step > 0 and self._checkpoints(self.step))
        for callback in self.callbacks:
            callback(info)

    def fit(self) -> dict:
        """Train to the last step; the hooks of QK-clip and the telemetry come off the model when it ends."""
        self.runtime.barrier()  # every rank has read its checkpoint before rank 0 tidies the folder
        try:
            with self.folder.write_errors():
                if self.is_main:
                    self._begin()
                self.model.train()
                if self.step == 0:
                    self._run_callbacks()
                if self.step == self.start_step > 0 and self.step >= self.steps:
                    done = self._finished()
                    if done is not None:
                        return done
                return self._summarize(self._loop())
        finally:
            for reader in (self.qk_clip, self.telemetry):
                if reader:
                    reader.remove()

    def _finished(self) -> dict | None:
        """A resumed run that has nothing left to train: its summary.json as it is (None if it has none)."""
        existing = self.folder.read_summary()
        if existing is not None and existing.get("steps") == self.step:
            self._log(f"nothing to train: {self.out} finished at step {self.step}; summary.json kept as it is")
            if is_record(existing.get("time_split")):
                self._log(f"time (as recorded): {split_line(existing['time_split'])}")
            return existing
        self.last_loss = self.folder.metric_at(self.step, "loss")
        return None

    def _loop(self) -> float | None:
        tc = self.cfg.train
        bar = tqdm(total=self.steps, initial=self.step, disable=not self.progress, unit="step",
                   dynamic_ncols=True, desc=self.name)
        window_tokens, window_time = 0, 0.0
        val_loss = None
        try:
            while self.step < self.steps:
                t0 = time.perf_counter()
                self.last_loss, grad_norm = self.train_step()
                dt = time.perf_counter() - t0
                self.wall_time += dt
                self.times.add("train_steps", dt)
                window_tokens, window_time = window_tokens + self.cfg.tokens_per_step, window_time + dt
                bar.update(1)
                logged: dict = {}  # this step's metrics.jsonl rows, merged: what callbacks see as info.metrics
                if self._logs(self.step):
                    tok_s = window_tokens / window_time
                    bar.set_postfix(loss=f"{self.last_loss:.3f}", tok_s=f"{tok_s:,.0f}")
                    logged = {"step": self.step, "tokens": self.tokens_seen, "loss": self.last_loss,
                              "grad_norm": grad_norm, "lr_factor": lr_factor(self.step - 1, self.steps, tc),
                              "tokens_per_s": tok_s, "wall_time": self.wall_time,
                              **(self.qk_clip.log() if self.qk_clip else {}),
                              **self.last_telemetry,
                              **({"z_loss": self.last_z_loss} if tc.z_loss else {})}
                    self._write_metrics(logged)
                    window_tokens, window_time = 0, 0.0
                if (tc.eval_every and self.step % tc.eval_every == 0) or self.step == self.steps:
                    val_loss = self.evaluate()  # before the callbacks: a probe at this step reuses it
                    self._write_metrics({"step": self.step, "tokens": self.tokens_seen, "val_loss": val_loss})
                    logged = {**logged, "val_loss": val_loss}
                    msg = (f"step {self.step}/{self.steps}: loss {self.last_loss:.4f}, val_loss {val_loss:.4f}, "
                           f"{self.tokens_seen / max(self.wall_time, 1e-9):,.0f} tokens/s")
                    bar.write(msg) if self.progress else self._log(msg)
                self._run_callbacks(logged)
                hook("step")
                if self._checkpoints(self.step):
                    self._save()
        finally:
            bar.close()
        return val_loss

    def _summarize(self, val_loss: float | None) -> dict:
        if val_loss is None:  # nothing trained this session (a finished run without its summary)
            val_loss = self.evaluate()
        summary = {"steps": self.step, "tokens": self.tokens_seen, "final_loss": self.last_loss,
                   "final_val_loss": val_loss, "wall_time_s": self.wall_time,
                   "tokens_per_s": self.tokens_seen / self.wall_time if self.wall_time else None,
                   "precision": self.precision, "world_size": self.runtime.world_size,
                   "optimizer_split": self.split, "corpus": self.data.corpus, "source_hash": self.data.source_hash,
                   **({"alarms": self.alarm.alarms} if self.alarm else {}),
                   "data": data_usage(self.cfg, self.data)[0],
                   **provenance(self.device)}
        summary["time_split"] = self.times.record()
        if self.is_main:
            with self.times.phase("writing"):
                self.folder.write_summary(summary)
            self._log(f"time: {split_line(summary['time_split'])}")
        return summary
