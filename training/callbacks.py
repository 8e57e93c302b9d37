"""The one interface between the training loop and whatever watches it (the key probe, say).

The trainer calls each callback with a `StepInfo` at step 0 of a fresh run and after every optimizer step; a
callback gets everything it may use through that object and never reads the trainer's attributes. Its
`state_dict()` is saved in every checkpoint under its `name` and handed back to `load_state_dict()` on a resume;
the optional `after_resume()`, `after_checkpoint(path)` (`AfterCheckpoint`) and `before_stop()` are called when
their names say. Callbacks run on every rank in the order they were added, must not change the model or any RNG,
and write files only where `is_main` is true. The contract in full: docs/training.md, "Callbacks".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

import torch.nn as nn

from utils.time_split import TimeSplit

if TYPE_CHECKING:
    from configs.config import RunConfig
    from data import TokenData
    from utils.runtime import Runtime


@dataclass(frozen=True)
class StepInfo:
    step: int  # optimizer steps done
    total_steps: int
    start_step: int  # the step this session started from (0, or the checkpoint's step when resumed)
    tokens: int  # training tokens seen, all ranks
    loss: float | None  # this step's training loss (None at step 0)
    wall_time_s: float  # training time so far, summed over resumed sessions
    model: nn.Module  # the plain module, not its DDP or compiled wrapper
    evaluate: Callable[[], float]  # validation loss at this step (computed once per step, shared)
    is_main: bool  # rank 0: the process that writes files
    # what the trainer logged at this step: its metrics.jsonl rows merged (loss, grad_norm, lr_factor,
    # tokens_per_s, wall_time at log steps; val_loss at validations); empty at other steps
    metrics: Mapping[str, float] = field(default_factory=dict)
    lrs: Mapping[str, float] = field(default_factory=dict)  # learning rate per optimizer param group, by name
    # The model with whole weights: `model` itself, or under FSDP rank 0's unsharded copy (None on other
    # ranks), filled from the shards by a collective that every rank must call (training/sharding.py).
    full_model: Callable[[], nn.Module | None] | None = None
    world_size: int = 1  # processes training together (under DDP or FSDP `evaluate` is a collective)
    # the spike alarm's alarms so far, this step's included ({"step", "tokens", "alarm"}; training/alarm.py), or
    # None where --spike_alarm is off
    alarms: Sequence[dict] | None = None
    # the run's wall time by phase: a callback counts its own work in it (`with info.times.phase("probes"):`)
    times: TimeSplit = field(default_factory=TimeSplit)
    checkpoint: bool = False  # a checkpoint is written right after this step's callbacks (never at step 0)


class Callback(Protocol):
    name: str  # the key of its state in checkpoints

    def __call__(self, info: StepInfo) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


# Builds a run's callbacks once the config it uses, its data and its runtime (device, precision) are known
# (training.run.train_run, Trainer(callbacks=...)).
CallbackFactory = Callable[["RunConfig", "TokenData", "Runtime"], list[Callback]]


class AfterCheckpoint:
    """A callback that calls `function(path)` after each checkpoint the trainer writes (path: its step folder), and
    does nothing at the steps; no state of its own."""
    name = "after_checkpoint"

    def __init__(self, function: Callable[[Path], object]):
        self.function = function

    def __call__(self, info: StepInfo) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def after_checkpoint(self, path: Path) -> None:
        self.function(path)


def after_checkpoint(callbacks: Sequence[Callback], path: Path) -> None:
    """Tell every callback with an `after_checkpoint` that the checkpoint at `path` is written."""
    for callback in callbacks:
        told = getattr(callback, "after_checkpoint", None)
        if told is not None:
            told(path)


def before_stop(callbacks: Sequence[Callback]) -> None:
    """Tell every callback with a `before_stop` that training stops for good before its last step."""
    for callback in callbacks:
        told = getattr(callback, "before_stop", None)
        if told is not None:
            told()
