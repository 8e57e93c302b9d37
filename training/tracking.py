"""Experiment tracking (`--logger none|tensorboard|wandb|trackio`) as one more training callback.

`TrackerCallback` turns each step's StepInfo into scalars (train/loss, train/grad_norm, train/lr_factor,
train/tokens_per_s at log steps, lr/<group>, val/loss) and writes them to a backend; other callbacks hand it their
own through `add(step, {tag: value})` (the key probe's headline metrics, research.results.read.tracked_scalars),
registered before it. The trainer knows nothing of TensorBoard, W&B or trackio; only rank 0 opens a backend, under
RUN_DIR (tensorboard/, wandb/, trackio/). Each backend, and what a resume does to it: docs/training.md,
"Experiment tracking".
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from configs.config import ConfigError

if TYPE_CHECKING:  # importing torch here would slow down --help and argument checks
    from training.callbacks import StepInfo

LOGGERS = ("none", "tensorboard", "wandb", "trackio")
PINNED = ("tensorboard", "trackio")  # the trackers requirements.txt installs (the suite tests them)
TENSORBOARD_DIR = "tensorboard"
TRACKIO_DIR = "trackio"
PROJECT = "qk-keys"  # the W&B and trackio project (W&B: unless WANDB_PROJECT is set)
WANDB_HOST = "api.wandb.ai"
# metrics.jsonl's names -> tags (TensorBoard groups charts by the part before the slash)
STEP_TAGS = {"loss": "train/loss", "grad_norm": "train/grad_norm", "lr_factor": "train/lr_factor",
             "tokens_per_s": "train/tokens_per_s", "val_loss": "val/loss"}


class Backend(Protocol):
    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def check_logger(kind: str) -> None:
    """Raise ConfigError, before any training, when `kind` is unknown or its package is not installed."""
    if kind not in LOGGERS:
        raise ConfigError(f"--logger {kind}: choose one of {', '.join(LOGGERS)}")
    package = None if kind == "none" else kind  # each tracker's package has its name
    if package and importlib.util.find_spec(package) is None:
        pin = " (pinned in requirements.txt)" if kind in PINNED else ""
        raise ConfigError(f"--logger {kind} needs the {package} package, which is not installed: pip install "
                          f"{package}{pin}, or run with --logger none")


class TensorBoardBackend:
    """Scalars as TensorBoard event files in `log_dir` (float32, as TensorBoard stores them)."""

    def __init__(self, log_dir: str | Path, purge_step: int):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # readable at once, and kept if the run is killed

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    """Scalars as a W&B run under `run_dir`/wandb; offline when W&B's server cannot be reached and the user
    has not set WANDB_MODE."""

    def __init__(self, run_dir: str | Path, name: str, config: dict, reachable: Callable[[], bool] | None = None):
        import wandb
        if "WANDB_MODE" not in os.environ and not (reachable or _wandb_reachable)():
            os.environ["WANDB_MODE"] = "offline"
            print(f"wandb: {WANDB_HOST} cannot be reached; logging offline (wandb sync {run_dir}/wandb later)")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=name, dir=str(run_dir),
                              config=config)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioBackend:
    """Scalars as a trackio run in `run_dir`/trackio: W&B's tags at W&B's steps, no system metrics (trackio's
    CPU and GPU sampling threads stay off, as nothing of the training asks for them)."""

    def __init__(self, run_dir: str | Path, name: str, config: dict):
        folder = Path(run_dir) / TRACKIO_DIR
        self.trackio = _trackio_at(folder)
        print(f"trackio: logging into {folder} (dashboard: TRACKIO_DIR={folder} trackio show --project {PROJECT})")
        self.run = self.trackio.init(project=PROJECT, name=name, config=config, embed=False, auto_log_cpu=False,
                                     auto_log_gpu=False)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.trackio.finish()  # the run init made current: finished, and no longer current (atexit leaves it be)


def _trackio_at(folder: Path):
    """The trackio module, storing into `folder`. trackio takes its folder from TRACKIO_DIR once, when imported,
    into module globals (0.43: trackio.utils, .sqlite_storage, ...; no argument of init names a folder), so a
    process that logs several runs (a study's conditions) points those globals at each run's folder in turn.
    tests/training/test_tracking.py checks that nothing lands in trackio's default folder."""
    import trackio
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "trackio" or name.startswith("trackio.")):
            for attr, path in (("TRACKIO_DIR", folder), ("MEDIA_DIR", folder / "media"),
                               ("ARTIFACTS_DIR", folder / "artifacts")):
                if isinstance(getattr(module, attr, None), Path):
                    setattr(module, attr, path)
    return trackio


def _wandb_reachable() -> bool:
    from utils.hub import host_reachable
    return host_reachable(WANDB_HOST)


def step_scalars(info: StepInfo) -> dict[str, float]:
    """The tags of one step: what the trainer logged (metrics.jsonl's values) and, with the training row,
    the learning rate of each param group."""
    out = {tag: float(info.metrics[name]) for name, tag in STEP_TAGS.items() if info.metrics.get(name) is not None}
    if "loss" in info.metrics:
        out.update({f"lr/{group}": float(lr) for group, lr in info.lrs.items()})
    return out


class TrackerCallback:
    """Writes each step's scalars, and those other callbacks `add`, to the backend `open_backend(first_step)`
    opens on rank 0 at the first step this session sees; closes it after the last step."""

    name = "tracker"

    def __init__(self, open_backend: Callable[[int], Backend]):
        self.open_backend = open_backend
        self.backend: Backend | None = None
        self.pending: dict[int, dict[str, float]] = {}

    def add(self, step: int, scalars: Mapping[str, float]) -> None:
        """Scalars from another callback, written with this step's (call it before the tracker runs)."""
        self.pending.setdefault(step, {}).update(scalars)

    def __call__(self, info: StepInfo) -> None:
        if not info.is_main:
            self.pending.clear()
            return
        if self.backend is None:
            self.backend = self.open_backend(info.step)  # the first step this session logs
        for step in sorted(s for s in self.pending if s < info.step):  # added late: still logged at their step
            self.backend.log(step, self.pending.pop(step))
        scalars = {**step_scalars(info), **self.pending.pop(info.step, {})}
        if scalars:
            self.backend.log(info.step, scalars)
        if info.step >= info.total_steps:
            self.backend.close()
            self.backend = None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def tracker_for(kind: str, run_dir: str | Path, *, name: str, config: dict) -> TrackerCallback | None:
    """The tracker `--logger kind` asks for (None for 'none'); ConfigError if it cannot work here."""
    check_logger(kind)
    run_dir = Path(run_dir)
    if kind == "tensorboard":
        # a resumed session drops what an interrupted one logged from its first step on
        return TrackerCallback(lambda first: TensorBoardBackend(run_dir / TENSORBOARD_DIR, purge_step=first))
    if kind == "wandb":
        return TrackerCallback(lambda first: WandbBackend(run_dir, name, config))
    if kind == "trackio":
        return TrackerCallback(lambda first: TrackioBackend(run_dir, name, config))
    return None
