"""The errors a user can cause when training, each with a message that names the problem and the fix.

Each is a utils.errors.UserError: every command (utils.cli.command) prints the message alone, with no traceback,
and exits with status 2. RunInterrupted (Ctrl-C) is not one of them: it ends with status 130.
"""
from __future__ import annotations

import math
from pathlib import Path

from configs.config import TrainConfig
from utils.errors import Interrupted, UserError


class RunError(UserError, RuntimeError):
    """A run folder or a resume that cannot go on as asked (the message says why and what to do)."""


class NonFiniteLossError(RunError):
    """The loss or the gradient norm became NaN or infinite at `step`; nothing of that step was applied."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def non_finite_fix(tc: TrainConfig, vocab_size: int, precision: str) -> str:
    """How to train again after a NaN or infinite loss: a smaller z_loss where its term outweighs the cross-entropy
    from the first step on (lower rates would not help), else lower rates, a tighter clip or fp32."""
    clip = "--grad_clip 1.0" if tc.grad_clip == 0 or tc.grad_clip > 1 else f"--grad_clip {tc.grad_clip / 2:g}"
    other = [clip] + (["--precision fp32"] if precision == "bf16" else [])
    log_v = math.log(vocab_size)
    if tc.z_loss * log_v >= 1:
        return (f"with a smaller --z_loss, e.g. --z_loss 0.0001 (PaLM's): at z_loss={tc.z_loss:g} the z term "
                f"z_loss x logsumexp^2 outweighs the cross-entropy from the first step on (logsumexp starts near "
                f"ln(vocab_size) = {log_v:.2f}, the cross-entropy too, so from z_loss = 1/{log_v:.2f} = "
                f"{1 / log_v:.3g})")
    return (f"with lower learning rates, e.g. --muon_lr {tc.muon_lr / 2:g} --adamw_lr {tc.adamw_lr / 2:g} (half "
            f"of these), or with {' or '.join(other)}")


class RunInterrupted(Interrupted):
    """Ctrl-C (KeyboardInterrupt) stopped a run in `folder`: after `step` optimizer steps (None: before training
    began, e.g. while preparing the data); `checkpoint` is the step of the newest checkpoint (None: none yet) and
    `resumable` says whether the folder now needs --resume to go on (training.run_files.RunFolder.resumable)."""

    def __init__(self, folder: str | Path, step: int | None, checkpoint: int | None, resumable: bool,
                 stage: str = "training"):
        self.folder, self.step, self.checkpoint, self.resumable, self.stage = Path(folder), step, checkpoint, \
            resumable, stage
        super().__init__(self.describe())

    def describe(self) -> str:
        """One line: where the run stopped, what is kept, whether --resume is needed."""
        if self.step is None:
            where = f"interrupted while {self.stage}, before training began"
        else:
            where = f"interrupted at step {self.step}"
        if self.checkpoint is not None:
            kept = f"nothing is lost up to the last checkpoint (step {self.checkpoint}) in {self.folder}"
        elif self.resumable:
            kept = f"no checkpoint was written yet in {self.folder}: --resume starts again from step 0"
        else:
            kept = f"nothing of the run was written to {self.folder} yet"
        return f"{where}; {kept}"

