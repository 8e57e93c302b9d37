"""Tensor layouts that model access (research/access) and the probe (research/probing) share, kept here so that the
probe takes them without loading the model families."""
from __future__ import annotations

import torch


def heads_first(x_BTHD: torch.Tensor) -> torch.Tensor:
    """[B, T, H, D] hook output -> [H, B, T, D] (detached view), the layout the sinks and the metrics take."""
    return x_BTHD.detach().permute(2, 0, 1, 3)  # [H, B, T, D]
