"""The errors a user can cause when training, each with a message that names the problem and the fix.

Entry points (train_llm.py, the study runner) catch USER_ERRORS and print the message alone:
no traceback, a non-zero exit code.
"""
from __future__ import annotations

from configs.config import ConfigError
from data.corpus import DataError
from training.checkpoint import CheckpointError
from utils.lock import LockError


class RunError(RuntimeError):
    """A run folder or a resume that cannot go on as asked (the message says why and what to do)."""


class NonFiniteLossError(RunError):
    """The loss or the gradient norm became NaN or infinite at `step`; nothing of that step was applied."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


USER_ERRORS = (ConfigError, DataError, FileExistsError, RunError, CheckpointError, LockError)
