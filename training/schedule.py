"""Learning-rate schedules as a multiplier of each group's peak rate (group['base_lr'])."""
from __future__ import annotations

import math

from configs.config import TrainConfig


def lr_factor(step: int, total_steps: int, cfg: TrainConfig) -> float:
    """Multiplier for optimizer step `step` (0-based) of `total_steps`.

    constant: 1 throughout (after warmup, if any).
    cosine: linear warmup over warmup_frac of the steps, then cosine from 1 to min_lr_frac.
    """
    warmup = int(round(cfg.warmup_frac * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total_steps - warmup - 1)
    progress = min(1.0, progress)
    return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress))
