"""The training loop: accumulation, clipping, schedule, precision, compile, DDP, checkpoints.

One Trainer trains one model described by a RunConfig into an output folder:

    DIR/config.json        the final config
    DIR/metrics.jsonl      one JSON line per logged step ({"step", "tokens", "loss", ...})
                           and per validation ({"step", "tokens", "val_loss"})
    DIR/tokenizer/         loadable with transformers.AutoTokenizer.from_pretrained
    DIR/checkpoints/step-N model.safetensors + optim.pt + state.json (training/checkpoint.py)
    DIR/summary.json       final losses, steps, timings, provenance

The trainer receives prepared data (data.prepare_data) and a process group
(training.distributed); `training.run.train_run` does both for one config. Works alone
or under torchrun (DDP); only rank 0 writes. Callbacks (training.callbacks) see each
step through a StepInfo and keep their own state in checkpoints.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configs.config import ConfigError, RunConfig
from data import BlockLoader, TokenData, val_batches
from models import MinimalLLM
from optimizers import build_optimizers, format_split
from training.callbacks import Callback, StepInfo
from training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from training.distributed import Dist
from training.schedule import lr_factor
from utils.io import atomic_write_text
from utils.runtime import (autocast, local_cpu_threads, provenance, resolve_compile, resolve_device,
                           resolve_precision)

# Fields that may change when a run is resumed: they do not alter what the
# remaining steps compute (tokens extends or shortens the run).
RESUMABLE_CHANGES = {"tokens", "log_every", "eval_every", "ckpt_every", "keep_last", "device", "compile",
                     "fused_loss", "cache_dir"}


class NonFiniteLossError(RuntimeError):
    pass


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(old: RunConfig, new: RunConfig) -> list[str]:
    a, b = _flatten(old.to_dict()), _flatten(new.to_dict())
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and k.split(".")[-1] not in RESUMABLE_CHANGES]


class Trainer:
    def __init__(self, cfg: RunConfig, data: TokenData, out_dir: str | Path, *, dist: Dist = Dist(),
                 resume: bool = False, log: Callable = print, progress: bool = True, name: str = "train"):
        self.cfg, self.data, self.out, self.name, self.dist = cfg, data, Path(out_dir), name, dist
        tc = cfg.train
        self.device = resolve_device(tc.device, self.dist.local_rank)
        if self.device.type == "cpu":
            torch.set_num_threads(local_cpu_threads(self.dist.local_world_size))
        self.precision = resolve_precision(tc.precision, self.device)
        self.is_main = self.dist.is_main
        self._log = log if self.is_main else (lambda *a, **k: None)
        self.progress = progress and self.is_main
        self.callbacks: list[Callback] = []
        self.resume_state: dict = {}  # state.json of the checkpoint resumed from
        self.last_loss: float | None = None  # training loss of the latest step
        self._val_cache: tuple[int, float] | None = None  # (step, validation loss at that step)

        if tc.batch_size % self.dist.world_size:
            raise ConfigError(f"batch_size={tc.batch_size} is not divisible by the {self.dist.world_size} "
                              f"processes: the global batch is split evenly across ranks")
        self._check_out_dir(resume)

        torch.manual_seed(tc.seed)  # same initial weights on every rank
        self.model = MinimalLLM(cfg.model).to(self.device)
        self.model.grad_checkpointing = tc.grad_checkpointing
        self.model.fused_loss = tc.fused_loss
        self.optimizers, split = build_optimizers(self.model, tc, self.device.type)
        self.split = split
        self.steps = cfg.steps
        self.step = 0
        self.start_step = 0  # where this session began: a resumed run's checkpoint step
        self.loader = BlockLoader(self.data.train, tc.batch_size, tc.seed, self.dist.rank, self.dist.world_size)
        self.val = val_batches(self.data.val, tc.batch_size, tc.eval_batches, self.dist.rank,
                               self.dist.world_size)
        self.wall_time = 0.0  # seconds of training so far, summed over resumed sessions
        if resume:
            self._resume()

        self.compiled, compile_why = resolve_compile(tc.compile, self.device)
        fwd = torch.compile(self.model) if self.compiled else self.model
        self.fwd = DDP(fwd, device_ids=[self.device.index] if self.device.type == "cuda" else None) \
            if self.dist.enabled else fwd

        self._log(f"run: preset={cfg.preset} device={self.device} precision={self.precision} "
                  f"processes={self.dist.world_size} compile={self.compiled} ({compile_why}) "
                  f"fused_loss={tc.fused_loss}")
        self._log(f"model: {self.model.num_params():,} parameters, {cfg.model.n_layers} layers, d_model "
                  f"{cfg.model.d_model}, heads {cfg.model.n_heads}/{cfg.model.n_kv_heads} (q/kv), d_head "
                  f"{cfg.model.d_head}, qk_norm={cfg.model.qk_norm}")
        self._log(format_split(split))
        self._log(f"data: {len(self.data.train):,} train / {len(self.data.val):,} val blocks of "
                  f"{cfg.data.seq_len} tokens; {self.steps} steps of {cfg.tokens_per_step:,} tokens")

    # ----------------------------------------------------------------- setup
    def _check_out_dir(self, resume: bool) -> None:
        ckpt_root = self.out / "checkpoints"
        has_run = (self.out / "config.json").exists() or latest_checkpoint(ckpt_root) is not None
        if has_run and not resume:
            raise FileExistsError(f"{self.out} already holds a run: pass --resume to continue it, or choose "
                                  f"another --out (nothing was overwritten)")
        if resume and (self.out / "config.json").exists():
            diffs = config_differences(RunConfig.load(self.out / "config.json"), self.cfg)
            if diffs:
                raise ConfigError(f"cannot resume {self.out} with a different config ({'; '.join(diffs)}): "
                                  f"use the original options, or choose another --out")

    def _resume(self) -> None:
        ckpt = latest_checkpoint(self.out / "checkpoints")
        if ckpt is None:
            self._log(f"resume: no checkpoint in {self.out / 'checkpoints'}, starting from step 0")
            return
        load_checkpoint(ckpt, self.model, self.optimizers)
        self.loader.load_state_dict(ckpt.state["loader"])
        self.step = self.start_step = ckpt.state["step"]
        self.resume_state = ckpt.state
        self.wall_time = ckpt.state.get("wall_time", 0.0)
        self._log(f"resume: continuing from {ckpt.path} (step {self.step})")
        if self.is_main:  # drop log lines written after that checkpoint
            path = self.out / "metrics.jsonl"
            if path.exists():
                keep = [ln for ln in path.read_text().splitlines() if ln and json.loads(ln)["step"] <= self.step]
                atomic_write_text(path, "".join(ln + "\n" for ln in keep))

    def add_callback(self, callback: Callback) -> None:
        """Register a callback; on a resumed run it gets back the state saved under its name."""
        if any(c.name == callback.name for c in self.callbacks):
            raise ValueError(f"a callback named {callback.name!r} is already registered")
        saved = self.resume_state.get("callbacks", {}).get(callback.name)
        if saved is not None:
            callback.load_state_dict(saved)
        self.callbacks.append(callback)

    @property
    def tokens_seen(self) -> int:
        return self.step * self.cfg.tokens_per_step

    # --------------------------------------------------------------- logging
    def _write_metrics(self, record: dict) -> None:
        if self.is_main:
            with open(self.out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def _save(self) -> None:
        if self.is_main:
            save_checkpoint(self.out / "checkpoints", self.step, self.model, self.optimizers,
                            {"tokens": self.tokens_seen, "loader": self.loader.state_dict(),
                             "wall_time": self.wall_time, "config": self.cfg.to_dict(),
                             "callbacks": {c.name: c.state_dict() for c in self.callbacks}},
                            keep_last=self.cfg.train.keep_last)
        self.dist.barrier()

    # ------------------------------------------------------------ the loop
    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the fixed validation batches (all ranks).

        Weights change only in train_step, so the value is kept for the current step: the
        callbacks (the probe) and the loop's own validation at the same step share one pass.
        """
        if self._val_cache is not None and self._val_cache[0] == self.step:
            return self._val_cache[1]
        was_training = self.model.training
        self.model.eval()
        total = 0.0
        for x, y in self.val:
            with autocast(self.device, self.precision):
                total += self.model(x.to(self.device), y.to(self.device)).item()
        self.model.train(was_training)
        loss = self.dist.mean(total / len(self.val), self.device)
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
        for micro in range(tc.grad_accum):
            x, y = self.loader.next_batch()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            last = micro == tc.grad_accum - 1
            sync = nullcontext() if (last or not self.dist.enabled) else self.fwd.no_sync()
            with sync:
                with autocast(self.device, self.precision):
                    loss = self.fwd(x, y)
                (loss / tc.grad_accum).backward()
            loss_sum += loss.detach()
        loss_value = self.dist.mean(loss_sum.item() / tc.grad_accum, self.device)
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip if tc.grad_clip > 0 else math.inf).item()
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
            self._fail_non_finite(loss_value, grad_norm)
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        self.step += 1
        return loss_value, grad_norm

    def _fail_non_finite(self, loss: float, grad_norm: float) -> None:
        ckpt = latest_checkpoint(self.out / "checkpoints")
        kept = (f"the last good checkpoint is {ckpt.path} (step {ckpt.step})" if ckpt
                else "no checkpoint was written yet")
        raise NonFiniteLossError(
            f"step {self.step + 1}: loss={loss}, grad norm={grad_norm} is not finite; training stopped before "
            f"applying it and {kept}. Try lower --muon_lr/--adamw_lr, --grad_clip 1.0, or --precision fp32.")

    def _run_callbacks(self) -> None:
        if not self.callbacks:
            return
        info = StepInfo(step=self.step, total_steps=self.steps, start_step=self.start_step,
                        tokens=self.tokens_seen, loss=self.last_loss if self.step > 0 else None,
                        wall_time_s=self.wall_time, model=self.model, evaluate=self.evaluate,
                        is_main=self.is_main)
        for callback in self.callbacks:
            callback(info)

    def fit(self) -> dict:
        tc = self.cfg.train
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            self.cfg.save(self.out / "config.json")
            shutil.copytree(self.data.tokenizer_dir, self.out / "tokenizer", dirs_exist_ok=True)
        self.model.train()
        if self.step == 0:
            self._run_callbacks()
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
                window_tokens, window_time = window_tokens + self.cfg.tokens_per_step, window_time + dt
                bar.update(1)
                if self.step % tc.log_every == 0 or self.step == self.steps:
                    tok_s = window_tokens / window_time
                    bar.set_postfix(loss=f"{self.last_loss:.3f}", tok_s=f"{tok_s:,.0f}")
                    self._write_metrics({"step": self.step, "tokens": self.tokens_seen, "loss": self.last_loss,
                                         "grad_norm": grad_norm, "lr_factor": lr_factor(self.step - 1, self.steps, tc),
                                         "tokens_per_s": tok_s, "wall_time": self.wall_time})
                    window_tokens, window_time = 0, 0.0
                self._run_callbacks()
                if (tc.eval_every and self.step % tc.eval_every == 0) or self.step == self.steps:
                    val_loss = self.evaluate()
                    self._write_metrics({"step": self.step, "tokens": self.tokens_seen, "val_loss": val_loss})
                    msg = (f"step {self.step}/{self.steps}: loss {self.last_loss:.4f}, val_loss {val_loss:.4f}, "
                           f"{self.tokens_seen / max(self.wall_time, 1e-9):,.0f} tokens/s")
                    bar.write(msg) if self.progress else self._log(msg)
                if (tc.ckpt_every and self.step % tc.ckpt_every == 0) or self.step == self.steps:
                    self._save()
        finally:
            bar.close()
        if val_loss is None:  # resumed a finished run: nothing trained, still report
            val_loss = self.evaluate()
        summary = {"steps": self.step, "tokens": self.tokens_seen, "final_loss": self.last_loss,
                   "final_val_loss": val_loss, "wall_time_s": self.wall_time,
                   "tokens_per_s": self.tokens_seen / self.wall_time if self.wall_time else None,
                   "precision": self.precision, "world_size": self.dist.world_size,
                   "optimizer_split": self.split, "data": {"source_hash": self.data.source_hash,
                                                           "tokenizer_hash": self.data.tokenizer_hash},
                   **provenance(self.device)}
        if self.is_main:
            atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2) + "\n")
        return summary
