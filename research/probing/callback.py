"""ProbeCallback: probes the keys during training and keeps results.json up to date."""
from __future__ import annotations

import math
from collections import deque
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Mapping

import torch

from configs.config import ConfigError, ProbeConfig
from data import data_usage, val_batches
from research.probing.ablation import gain_ablation, learned_entry
from research.probing.kv_cache import kv_cache_record
from research.probing.probe import KeyProbe
from research.results import ResultsError, add_probe, load_results, new_results, save_results, truncate
from research.results.read import tracked_scalars
from research.results.vocabulary import KV_CACHE, RESULTS_FILE, TAG_BY_QK_NORM
from training.callbacks import StepInfo
from training.tracking import tracker_for
from utils.errors import shown
from utils.runtime import Runtime, provenance
from utils.time_split import TimeSplit


class ProbeCallback:
    """Probe at step 0, every `cfg.probe_every` optimizer steps and at the last step (cfg: the probe section).

    At each probe: the validation loss (all ranks take part), then on rank 0 the key probe on
    the fixed batch, kept in memory. results.json is rewritten whole (atomically) at step 0, before each checkpoint
    (StepInfo.checkpoint: the checkpoint's step then has its probes on disk, what a resume needs), at the last step,
    and when training stops on a non-finite loss (`before_stop`): not at every probe, which rewrote a file growing
    by a probe's record each time; a crash leaves the file of the last checkpoint, whole. Where the trainer's
    validation batches are the probe batch's first `val_rows` sequences, in the probe's precision, on one process,
    and the trainer has not validated at this step already, the validation loss comes from the probe's own forward
    (KeyProbe.measure): the same tokens' mean loss, one forward instead of two (probe_callback decides).
    The validation loss of the initial model is kept as `init_val_loss` (the write-ups' `val_loss` has no value
    at step 0). `loss` at a probe is the mean training loss of the last `probe_every` steps: the steps since the
    previous probe, as in the write-ups, except at a final probe that comes sooner, whose window reaches back
    so it is as long. After the last step, where the k_norm gain is learned, the gain ablation
    (research.probing.ablation) on `ablation_batches`; and at the last step, where the probe has targets, what a key
    cache costs where asked (research.probing.kv_cache: results.json's kv_cache, once with cfg's `kv_cache`; with
    `kv_every_probe` in every probe record too). A resumed run continues the file from its
    checkpoint's step: the file must then exist and hold the last probe taken before that checkpoint
    (a missing or unreadable results.json stops the resume with ResultsError in `after_resume`, never a
    fresh file that would start at the resume step). `on_probe(step, {tag: value})`, if given, receives the probe's
    headline numbers (research.results.read.tracked_scalars) on rank 0: how they reach a tracker.
    """

    name = "probe"

    def __init__(self, path: str | Path, cfg: ProbeConfig, probe_ids_BT: torch.Tensor, *, header: dict, qk_norm: str,
                 ablation_batches: list | None = None, probe_targets_BT: torch.Tensor | None = None,
                 on_probe: Callable[[int, Mapping[str, float]], None] | None = None, share_validation: bool = False,
                 context: int | None = None):
        if (every := cfg.probe_every) <= 0:
            raise ValueError(f"ProbeCallback needs probe_every > 0, got {every}")
        self.path, self.every, self.qk_norm = Path(path), every, qk_norm
        self.header = header  # new_results' arguments: tag, config, preset, seed, provenance, data
        self.probe = KeyProbe(probe_ids_BT, cfg.probe_precision, probe_targets_BT, context)
        self.kv_cache = cfg.kv_cache or cfg.kv_every_probe or cfg.kv_layer_bits
        self.kv_every_probe, self.kv_layer_bits = cfg.kv_every_probe, cfg.kv_layer_bits
        # > 0: the trainer's validation set (ablation_batches) is the probe batch's first val_rows sequences
        self.val_rows = self.probe.covers(ablation_batches or []) if share_validation else 0
        self.recent_losses: deque[float] = deque(maxlen=every)
        self.ablation_batches = ablation_batches or []
        # > 0: the gain ablation's batches are the probe batch's first sequences (its losses come from its probes')
        self.ablation_rows = self.probe.covers(self.ablation_batches) if self.ablation_batches else 0
        self.on_probe = on_probe
        self.results: dict | None = None
        self.step = 0  # the latest step seen (saved in checkpoints)
        self.last_probe_step: int | None = None  # the step of the latest probe taken (on disk by the next checkpoint)
        self._unsaved = False  # self.results holds probes results.json does not have yet
        self._times: TimeSplit | None = None  # the run's time split, where before_stop counts its write

    def _resumed_results(self, step: int, last_probe: int | None) -> dict:
        """results.json cut back to `step`, checked to hold the probe at `last_probe` (if known)."""
        fix = (f"Restore {self.path.name} from a copy, or train this run again from step 0 in an empty folder "
               f"(its probes before step {step} cannot be rebuilt otherwise)")
        if not self.path.exists():
            raise ResultsError(f"cannot resume from step {step}: {self.path} is missing. {fix}")
        try:
            res = truncate(load_results(self.path), step)
        except ResultsError as e:
            raise ResultsError(f"cannot resume from step {step}: {e}. {fix}") from e
        if last_probe is not None and last_probe not in res["steps"]:
            raise ResultsError(f"cannot resume from step {step}: {self.path} has no probe at step {last_probe} "
                               f"(it holds steps {res['steps'][:3]}...{res['steps'][-3:]}): an older copy? {fix}")
        return res

    def _open(self, start_step: int) -> dict:
        if start_step > 0:  # resumed: drop probes after the checkpoint
            return self._resumed_results(start_step, None)
        return new_results(**self.header)

    def __call__(self, info: StepInfo) -> None:
        self.step = info.step
        if info.step > 0:
            self.recent_losses.append(info.loss)
        self._times = info.times
        if info.step % self.every and info.step != info.total_steps:
            if info.checkpoint and info.is_main:
                self._write()
            return
        # one process only: under DDP every rank must take part in the trainer's validation
        shared = self.val_rows if info.world_size == 1 and "val_loss" not in info.metrics else 0
        val_loss = None if shared else info.evaluate()  # at a validation step, the trainer's value (cached)
        model = info.full_model() if info.full_model else info.model  # every rank: a collective under FSDP
        if not info.is_main:
            return
        times = info.times
        if self.results is None:
            with times.phase("writing"):
                self.results = self._open(info.start_step)
        final = info.step == info.total_steps
        ablate = final and bool(self.ablation_batches)
        with times.phase("probes"):  # at the end also the loss the gain ablation's learned mode records
            record, own_loss = self.probe.measure(model, shared or (self.ablation_rows if ablate else 0))
            kv = self._kv_cache(model) if (final and self.kv_cache) or self.kv_every_probe else None
        if shared:
            val_loss = own_loss  # the probe's rows are the validation's
        if kv is not None and self.kv_every_probe:
            record[KV_CACHE] = kv
        if info.step == 0:  # the model at initialization: the write-ups' val_loss starts at the first interval
            self.results["init_val_loss"], val_loss = val_loss, None
        if info.alarms is not None:  # the spike alarm's record, as summary.json has it
            self.results["alarms"] = list(info.alarms)
        add_probe(self.results, record, step=info.step, tokens=info.tokens,
                  loss=sum(self.recent_losses) / len(self.recent_losses) if self.recent_losses else None,
                  val_loss=val_loss, wall_time_s=info.wall_time_s, qk_norm=self.qk_norm)
        if ablate:
            with times.phase("gain_ablation"):
                ablation = gain_ablation(model, self.probe, self.ablation_batches,
                                         learned=learned_entry(record, own_loss))
            if ablation:
                self.results["gain_ablation"] = {"step": info.step, "precision": self.probe.precision, **ablation}
        if final and kv is not None:
            self.results[KV_CACHE] = {"step": info.step, **kv}
        self._unsaved, self.last_probe_step = True, info.step
        if info.step == 0 or info.checkpoint or final:
            self._write()
        if self.on_probe is not None:
            self.on_probe(info.step, tracked_scalars(record))

    def _write(self) -> None:
        """results.json rewritten whole, atomically, where it lacks probes taken."""
        if not self._unsaved or self.results is None:
            return
        with self._times.phase("writing") if self._times else nullcontext():
            save_results(self.path, self.results)
        self._unsaved = False

    def before_stop(self) -> None:
        """Training stops for good before its last step (a non-finite loss): results.json gets every probe taken."""
        self._write()

    def _kv_cache(self, model) -> dict | None:
        """research.probing.kv_cache's section on the probe batch's first sequences (None without targets)."""
        if self.probe.targets is None:
            return None
        return kv_cache_record(model, self.probe.ids, self.probe.targets, self.probe.precision,
                               per_layer=self.kv_layer_bits)

    def state_dict(self) -> dict:
        return {"recent_losses": list(self.recent_losses), "step": self.step, "last_probe_step": self.last_probe_step}

    def load_state_dict(self, state: dict) -> None:
        """Take back the state a checkpoint saved; TypeError or ValueError, changing nothing, for one that is not
        this callback's (the trainer then sets the checkpoint aside). results.json is checked in after_resume."""
        if not isinstance(state, dict):
            raise TypeError(f"probe state must be an object, found {shown(state)}")
        losses = state.get("recent_losses")
        if not isinstance(losses, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in losses):
            raise TypeError(f"probe state: recent_losses must be a list of finite numbers, found {shown(losses)}")
        step, last = state.get("step"), state.get("last_probe_step")
        for name, value in (("step", step), ("last_probe_step", last)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise TypeError(f"probe state: {name} must be a whole number >= 0, found {shown(value)}")
        if step and last is not None and last > step:
            raise ValueError(f"probe state: last_probe_step {last} is after step {step}")
        self.recent_losses = deque((float(v) for v in losses), maxlen=self.every)
        self.step, self.last_probe_step = (step, last) if step else (0, None)
        self.results, self._unsaved = None, False

    def after_resume(self) -> None:
        """The checkpoint is chosen: check results.json now, before any training (older checkpoints carry no step;
        their results.json is checked at the first probe). ResultsError stops the resume: it is about
        results.json, not the checkpoint."""
        if self.step:
            self.results = self._resumed_results(self.step, self.last_probe_step)


def probe_callback(cfg, data, out_dir: str | Path, runtime: Runtime, tag: str | None = None,
                   on_probe: Callable[[int, Mapping[str, float]], None] | None = None) -> ProbeCallback:
    """The probe of a run: the first probe_batch validation blocks, results.json in out_dir; ConfigError when
    there are fewer validation blocks than probe_batch (config.json would say what the probe did not do). The
    provenance records the runtime's device and the precision training runs in."""
    header = {"tag": tag or TAG_BY_QK_NORM[cfg.model.qk_norm], "config": cfg.to_dict(), "preset": cfg.preset,
              "seed": cfg.train.seed,
              "provenance": {**provenance(runtime.device), "train_precision": runtime.precision,
                             "corpus": data.corpus, "source_hash": data.source_hash},
              "data": data_usage(cfg, data)[0]}
    n_val = int(data.val.shape[0])
    if cfg.probe.probe_batch > n_val:  # built before the run writes anything (training.run.train_run)
        raise ConfigError(f"probe_batch={cfg.probe.probe_batch} asks for more validation sequences than the {n_val} "
                          f"there are: lower --probe_batch to {n_val} or fewer, or raise --val_frac (now "
                          f"{cfg.data.val_frac}) or use more text")
    blocks = data.val[: cfg.probe.probe_batch].long()
    ids, targets = blocks[:, :-1].contiguous(), blocks[:, 1:].contiguous()
    validation = val_batches(data.val, cfg.train.batch_size, cfg.train.eval_batches)  # the trainer's, on one process
    # One forward for the probe and the validation loss where the validation set is the probe batch's first
    # sequences and both run in one precision (the tiny preset: 4 x 16 = probe_batch 64). Not where the
    # precisions differ (a bf16 run's validation is bf16, the probe fp32: sharing would change val_loss beyond
    # rounding), nor where the validation set holds sequences the probe does not read (their forward is needed
    # anyway; splitting the validation pass would change its batches for a part of its cost).
    return ProbeCallback(Path(out_dir) / RESULTS_FILE, cfg.probe, ids, header=header, qk_norm=cfg.model.qk_norm,
                         ablation_batches=validation, on_probe=on_probe, probe_targets_BT=targets,
                         share_validation=runtime.precision == cfg.probe.probe_precision, context=cfg.data.seq_len)


def run_callbacks(cfg, data, out_dir: str | Path, runtime: Runtime, *, tag: str | None = None,
                  logger: str = "none") -> list:
    """A run's callbacks: the key probe (when cfg probes) and the `logger` tracker, which shows the
    probe's headline numbers too (so it comes after the probe)."""
    tracker = tracker_for(logger, out_dir, name="/".join(Path(out_dir).parts[-2:]), config=cfg.to_dict())
    probe = (probe_callback(cfg, data, out_dir, runtime, tag=tag, on_probe=tracker.add if tracker else None)
             if cfg.probe.probe_every else None)
    return [c for c in (probe, tracker) if c is not None]
