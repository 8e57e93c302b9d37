"""Process-group setup from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def mean(self, value: float, device: torch.device) -> float:
        """Average a Python float over ranks."""
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.item() / self.world_size


    def max_(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise maximum over ranks, in place."""
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t


def init_distributed(device_type: str) -> Dist:
    """Start the process group when launched by torchrun; a no-op for a single process.

    gloo on CPU, NCCL on CUDA.
    """
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return Dist()
    d = Dist(rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
             local_rank=int(os.environ.get("LOCAL_RANK", "0")),
             local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])))
    if not dist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(d.local_rank)
        # a long timeout: rank 0 alone may tokenize a corpus or write a large checkpoint while the others wait
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo", timeout=timedelta(hours=2))
    return d


def shutdown_distributed(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()
