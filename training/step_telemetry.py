"""The spike signals of one training step (utils/telemetry.py names them), measured only at steps that write a
metrics.jsonl line, from the work the step does anyway: "logit_max" [L] (training.observers.LogitMax: QK-clip's own
maxima with --qk_clip, else over the first sequence of each micro-batch on each rank), "key_norm" [L]
(training.observers.KeyNorm), with gated attention "gate_closed" [L] (training.observers.GateClosed) and
"update_rms" {"muon", "adamw"} (the RMS of each optimizer's update, before
QK-clip; under FSDP summed over the shards).

Nothing here changes what the step computes: the extra work reads tensors under no_grad and writes only tensors of
its own; its memory is a copy of the weights during the optimizer step, at logged steps. Each signal, and its cost:
docs/training.md, "Telemetry and the alarm".
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist
import torch.nn as nn

from optimizers.muon import Muon
from training.observers import GateClosed, KeyNorm, LogitMax
from utils.runtime import Runtime


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (FSDP2), a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


@torch.no_grad()
def squared_change(after: list[torch.Tensor], before: list[torch.Tensor]) -> torch.Tensor:
    """sum (after - before)^2 over every element of the paired tensors, in float64 (0 for none): an update's size,
    for update_rms here and for the Hugging Face callback's alarm (research/probing/hf/)."""
    if not after:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack(torch._foreach_norm(torch._foreach_sub(after, before))).double().square().sum()


class StepTelemetry:
    """begin() before a logged step's forwards, before_update() / after_update() around the optimizers' steps,
    fields() after them: the metrics.jsonl fields; remove() detaches its hooks. `clip_logits`: QK-clip's
    LogitMax, which tracks every logit already (None: the telemetry samples its own)."""

    def __init__(self, blocks: nn.ModuleList, optimizers: list[torch.optim.Optimizer], runtime: Runtime,
                 clip_logits: LogitMax | None = None):
        self.runtime, self.full_step = runtime, clip_logits is not None
        self.keys = KeyNorm(blocks, runtime.device)
        self.gates = GateClosed(blocks, runtime.device) if hasattr(blocks[0].attn, "hook_gate") else None
        self.logits = clip_logits or LogitMax(blocks, runtime.device, rows=1, on=False)
        self.groups = {"muon": [p for o in optimizers if isinstance(o, Muon) for g in o.param_groups
                                for p in g["params"]],
                       "adamw": [p for o in optimizers if not isinstance(o, Muon) for g in o.param_groups
                                 for p in g["params"]]}
        self.before: dict[str, list[torch.Tensor]] = {}
        self.update_rms: dict[str, float | None] = {}
        self.counts = {name: sum(p.numel() for p in params) for name, params in self.groups.items()}  # a DTensor's
        # numel is the whole's; FSDP: each rank holds a shard of every weight, DDP: all hold all of it
        self.sharded = runtime.distributed and any(hasattr(p, "to_local") for ps in self.groups.values() for p in ps)

    def begin(self) -> None:
        self.keys.reset()
        self.keys.on = True
        if self.gates is not None:
            self.gates.reset()
            self.gates.on = True
        if not self.full_step:  # QK-clip resets and tracks its own, over every sequence
            self.logits.reset()
            self.logits.on = True

    @torch.no_grad()
    def before_update(self) -> None:
        self.before = {name: [_local(p).detach().clone() for p in params] for name, params in self.groups.items()}

    @torch.no_grad()
    def after_update(self) -> None:
        names = list(self.groups)
        sums = torch.zeros(len(names), dtype=torch.float64, device=self.runtime.device)
        for i, name in enumerate(names):
            if self.groups[name]:
                sums[i] = squared_change([_local(p).detach() for p in self.groups[name]], self.before[name])
        if self.sharded:
            tdist.all_reduce(sums)
        self.before = {}
        self.update_rms = {name: math.sqrt(s / self.counts[name]) if self.counts[name] else None
                           for name, s in zip(names, sums.tolist())}

    def fields(self) -> dict:
        """The step's metrics.jsonl fields (one collective under DDP/FSDP: every rank calls it); tracking off."""
        kn = torch.stack(self.keys.sums)                                                   # [L, 2]
        top = torch.stack([m.max() for m in self.logits.maxima])
        if not self.full_step:  # QK-clip took the maximum over ranks already
            top = self.runtime.max_(top)
        gc = torch.stack(self.gates.sums) if self.gates is not None else None                # [L, 2]
        if self.runtime.distributed:
            tdist.all_reduce(kn)  # sums and forwards over ranks: the mean over every rank's tokens
            if gc is not None:
                tdist.all_reduce(gc)
        self.keys.on = False
        if self.gates is not None:
            self.gates.on = False
        if not self.full_step:
            self.logits.on = False
        out = {"logit_max": top.tolist(), "key_norm": (kn[:, 0] / kn[:, 1]).tolist(),
               "update_rms": dict(self.update_rms)}
        if gc is not None:
            out["gate_closed"] = (gc[:, 0] / gc[:, 1].clamp_min(1)).tolist()
        return out

    def remove(self) -> None:
        self.keys.remove()
        if self.gates is not None:
            self.gates.remove()
        if not self.full_step:  # QK-clip's are QK-clip's to remove
            self.logits.remove()
