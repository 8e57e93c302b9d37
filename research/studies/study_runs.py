"""A study's runs as every executor sees them: the run record (`StudyRun`), a study's train function (`Train`) and
the study's error for a run that failed on a user error (`run_failed`), in this process, side by side and on Ray."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Generic, TypeVar

from utils.errors import UserError, explain
from utils.runtime import Runtime


class StudyError(UserError):
    """A condition or the drawing failed; the message says which, why, and that the finished conditions are kept."""


Settings = TypeVar("Settings")  # a StudyRun's settings: its study's own type


@dataclasses.dataclass(frozen=True)
class StudyRun(Generic[Settings]):
    """One run of a study: its name in study.json (condition, or condition@rate), seed, settings and folder. The
    settings are what the study trains the run with and checks a kept run against: a catalog study's RunConfig, the
    fine-tuning study's record of its config, model and data (research.studies.finetune.run_record)."""
    cond: str
    seed: int
    cfg: Settings
    run_dir: Path
    # called with its folder after each checkpoint the run writes (--storage: research.studies.storage.RunSync)
    after_checkpoint: Callable[[Path], object] | None = None


# A study's train function: train(run, runtime) trains one run on `runtime`, the study's (settled once, in this
# process), or, given None, in a Ray worker: on that worker's device and precision, without progress bars. Returns
# the run's summary, if any. For Ray it is pickled: a module's function, or a functools.partial of one.
Train = Callable[[StudyRun, "Runtime | None"], object]


def run_failed(run: StudyRun, e: UserError | OSError, out: Path) -> StudyError:
    """The study's error for a run that failed on a user error: which run, why, and that the study continues."""
    return StudyError(f"in condition {run.cond}, seed {run.seed}: {explain(e)} (finished conditions in {out} are "
                      f"kept; once this is fixed, the same command continues the study)")

