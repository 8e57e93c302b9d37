"""One training run of one config: the folder's lock, process group, data, trainer, callbacks, fit."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Callable

from configs.config import RunConfig
from configs.measured import check_measured
from data import data_usage, prepare_data, resolve_offline
from training.callbacks import CallbackFactory
from training.checkpoint import latest_checkpoint
from training.distributed import init_distributed, shutdown_distributed
from training.errors import RunInterrupted
from training.memory_fit import check_fits
from training.run_files import RunFolder
from training.trainer import Trainer
from utils.lock import FolderLock
from utils.owners import refuse_foreign
from utils.runtime import Runtime, resolve_runtime
from utils.time_split import TimeSplit

__all__ = ["train_run", "CallbackFactory"]


def train_run(cfg: RunConfig, out_dir: str | Path, *, resume: bool = False, replan_schedule: bool = False,
              progress: bool = True, name: str = "train", callbacks: CallbackFactory | None = None,
              log: Callable = print, runtime: Runtime | None = None) -> dict | None:
    """Train `cfg` into `out_dir` alone or under torchrun; returns the summary (summary.json) on
    rank 0 and None on the other ranks.

    A folder that belongs to another owner (a study's, a redraw's, an inspection's, an export's: utils.owners) is
    refused first, by every rank, before anything is written, with utils.owners.OwnerError naming the owner; a
    folder holding a run is the trainer's to continue or refuse (training.trainer). A run whose model (on CPU: its
    whole training) does not fit this machine's memory, or a CUDA run
    whose memory plan (training/memory.py) does not fit the device, stops next, with
    training.memory_fit.MemoryPlanError naming the field or the options that would fit. Rank 0 then locks `out_dir`
    (a second process on the same folder stops with utils.lock.LockError naming this one) and
    prepares the data (building the caches); the other ranks then read them. `runtime`: the device,
    precision and process group settled once for this process (resolved from cfg.train when None), handed to
    the memory check, the trainer and the callbacks. `callbacks(cfg, data, runtime)` builds the
    callbacks once the config the run uses and the data are known,
    before a resume chooses its checkpoint (training.trainer). A preset that falls back to local data
    without a network (data/offline.py) trains, and writes to config.json, the config it used; a
    corpus too small for the run is said at the start (data.data_usage) and recorded. Ctrl-C raises
    training.errors.RunInterrupted: the step reached, the newest checkpoint, whether --resume is needed.
    """
    # every rank, before the process group's rendezvous: no rank has written yet, and none waits on one that stopped
    refuse_foreign(out_dir, "run", "a training run")
    times = TimeSplit()  # the run's wall time by phase from here, its data and setup included (summary.json)
    runtime = runtime or resolve_runtime(cfg.train.device, cfg.train.precision)
    init_distributed(runtime)
    finished = False
    trainer, stage = None, "checking the run"
    try:
        check_measured(cfg)  # a key-cache field with no probe: nothing would measure it
        check_fits(cfg, runtime)  # before any allocation
        with FolderLock(out_dir, hint="choose another --out") if runtime.is_main else nullcontext():
            stage = "preparing the data"
            if runtime.is_main:
                cfg = resolve_offline(cfg, log=log)
                data = prepare_data(cfg, log=log, progress=progress)
            cfg = runtime.broadcast(cfg)
            if not runtime.is_main:
                data = prepare_data(cfg, log=lambda *a, **k: None, progress=False)  # the bars are rank 0's
            stage = "starting the run" + (" (loading its checkpoint)" if resume else "")
            trainer = Trainer(cfg, data, out_dir, resume=resume, replan_schedule=replan_schedule,
                              progress=progress, name=name, log=log, callbacks=callbacks, runtime=runtime,
                              times=times)
            if runtime.is_main:  # after the trainer's own data line, once its callbacks accepted the data
                for note in data_usage(cfg, data)[1]:
                    log(f"data: note: {note}")
            summary = trainer.fit()
            finished = True
            return summary if runtime.is_main else None
    except KeyboardInterrupt:
        folder = RunFolder(out_dir)
        ckpt = latest_checkpoint(folder.checkpoints)
        raise RunInterrupted(out_dir, step=trainer.step if trainer is not None else None,
                             checkpoint=ckpt.step if ckpt else None, resumable=folder.resumable(),
                             stage=stage) from None
    finally:
        shutdown_distributed(runtime, wait_for_peers=finished)
