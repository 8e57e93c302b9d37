"""`--shard fsdp`: the model sharded by PyTorch FSDP2 (`fully_shard`) over the ranks of a torchrun launch.

Each block is one FSDP unit and the root (embedding, tied LM head, final norm) another, so a rank holds
1 / world_size of every weight, gradient and optimizer state, and gathers one block at a time. Muon
orthogonalizes whole matrices (optimizers/muon.py gathers each update from its shards); AdamW works on
the shards. Checkpoints hold the full tensors, gathered on every rank and written by rank 0, in the same
files as an unsharded run. The key probe needs whole weights: rank 0 keeps an unsharded copy
(`ProbeCopy`), filled one gathered tensor at a time at each probe, and probes that.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from configs.config import ConfigError, RunConfig
from models import MinimalLLM
from optimizers.muon import local_rows


def check_sharding(cfg: RunConfig, world_size: int) -> None:
    """--shard fsdp needs several processes (that it excludes QK-clip is checked with the config)."""
    if cfg.train.shard != "fsdp":
        return
    if world_size < 2:
        raise ConfigError("--shard fsdp divides the model over processes: launch with torchrun --nproc_per_node N "
                          "(N >= 2, one device each), or drop --shard for one process")


def shard_model(model: MinimalLLM, device: torch.device) -> None:
    """FSDP2 in place: every block, then the root (embedding, final norm), over a mesh of the training
    device's type (FSDP's default mesh is the accelerator's, wrong for a CPU run on a GPU machine)."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


@contextmanager
def no_grad_sync(model: nn.Module):
    """Gradient accumulation: no reduce-scatter until the last micro-batch (FSDP2's no_sync)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def whole_tensor(t):
    """A DTensor gathered whole (a collective); any other tensor as it is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _gathered(t: torch.Tensor, keep: bool) -> torch.Tensor | None:
    """The whole tensor (every rank must take part in gathering it), copied to the CPU only where kept."""
    full = whole_tensor(t)
    return full.cpu() if keep else None


def full_model_state(model: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
    """The model's state dict with whole tensors on the CPU (a collective: every rank calls it); ranks that
    do not write it pass keep=False and hold no host copy."""
    return {k: _gathered(v.detach(), keep) for k, v in model.state_dict().items()}


def full_optimizer_states(optimizers: list[torch.optim.Optimizer], keep: bool = True) -> list[dict]:
    """Each optimizer's state dict with whole tensors on the CPU (a collective), as an unsharded run's."""
    out = []
    for opt in optimizers:
        sd = opt.state_dict()
        sd["state"] = {i: {k: _gathered(v, keep) if torch.is_tensor(v) else v for k, v in s.items()}
                       for i, s in sd["state"].items()}
        out.append(sd)
    return out


def _shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(like, DTensor):
        return full
    local = local_rows(full, like).to(like.device, like.dtype).contiguous()
    return DTensor.from_local(local, like.device_mesh, like.placements, shape=like.shape, stride=like.stride())


def shard_checkpoint(weights: dict, blob: dict, model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
    """Turn a checkpoint's whole tensors into this rank's shards, in place, before loading them."""
    own = model.state_dict()
    for k, v in weights.items():
        if k in own and own[k].shape == v.shape:
            weights[k] = _shard_like(v, own[k])
    for opt, sd in zip(optimizers, blob["optimizers"]):
        params = [p for g in opt.param_groups for p in g["params"]]
        for i, state in sd["state"].items():
            if int(i) < len(params):
                p = params[int(i)]
                sd["state"][i] = {k: _shard_like(v, p) if torch.is_tensor(v) and v.shape == p.shape else v
                                  for k, v in state.items()}


class ProbeCopy:
    """An unsharded copy of the model on rank 0, refreshed from the shards when asked."""

    def __init__(self, model: MinimalLLM, device: torch.device, is_main: bool):
        self.model, self.device, self.is_main = model, device, is_main
        self.copy: MinimalLLM | None = None  # built at the first call: a run that never probes holds none

    def __call__(self) -> nn.Module | None:
        """A collective (every rank calls it): rank 0's copy with the current weights; None on the others."""
        if self.is_main and self.copy is None:
            with torch.random.fork_rng(devices=[]):  # its initial values are overwritten: leave the RNG as it was
                self.copy = MinimalLLM(self.model.cfg).to(self.device)
        with torch.no_grad():
            target = self.copy.state_dict() if self.copy is not None else {}
            for k, v in self.model.state_dict().items():
                full = whole_tensor(v.detach())
                if self.copy is not None:
                    target[k].copy_(full)
        if self.copy is not None:
            self.copy.train(self.model.training)
        return self.copy
