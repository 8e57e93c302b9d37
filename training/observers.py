"""What training reads from the model's attention, through forward hooks at its hook points (models/layers.py
Attention: hook_k_norm, hook_q_rope, hook_k_rope): the model knows nothing of QK-clip or of the telemetry.

    LogitMax   each query head's largest logit (logit_scale x q . k) since reset(): QK-clip's, the telemetry's
    KeyNorm    the mean L2 norm of each layer's keys over the training forwards since reset(): the telemetry's key_norm
    GateClosed the share of each layer's gate values below 0.05 (gated attention): the telemetry's gate_closed
    QKClip     --qk_clip's part of the trainer's step: a LogitMax, its maxima over ranks, the clip, the heads clipped

A hook reads only in training mode, while its reader is `on`; hooks stay attached until remove(), since a compiled
block runs the hooks it was traced with (docs/training.md, "Telemetry and the alarm").
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from models.layers import causal_max_logit
from optimizers.qk_clip import qk_clip_
from utils.runtime import Runtime
from utils.telemetry import GATE_CLOSED


class _Hooks:
    """The hooks of one reader; remove() detaches them all."""
    handles: list[torch.utils.hooks.RemovableHandle]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


class LogitMax(_Hooks):
    """`maxima[i]` [H]: the largest logit of each query head of layer i over its training forwards since reset(),
    before any soft-cap (QK-clip bounds the logits themselves), over the first `rows` sequences of each forward (0:
    all of them). A gradient-checkpointing recompute (Block.recomputing) is skipped: the forward took its maximum.

    Each layer's rotated queries are held from hook_q_rope to hook_k_rope, which fires after it, then dropped."""

    def __init__(self, blocks: nn.ModuleList, device: torch.device, rows: int = 0, on: bool = True):
        self.rows, self.on = rows, on
        self.maxima = [torch.full((block.attn.n_heads,), -math.inf, device=device) for block in blocks]
        self.handles = []
        for i, block in enumerate(blocks):
            held: dict[str, torch.Tensor] = {}

            def keep(module, inputs, q_BTHD, block=block, held=held):
                if self.on and module.training and not block.recomputing:
                    held["q"] = q_BTHD

            def take(module, inputs, k_BTKD, i=i, held=held, scale=block.attn.given_scale):
                q_BTHD = held.pop("q", None)
                if q_BTHD is not None:
                    rows = self.rows or q_BTHD.shape[0]
                    top = causal_max_logit(q_BTHD[:rows].transpose(1, 2), k_BTKD[:rows].transpose(1, 2),
                                           scale=scale)
                    self.maxima[i].copy_(torch.maximum(self.maxima[i], top))
            self.handles += [block.attn.hook_q_rope.register_forward_hook(keep),
                             block.attn.hook_k_rope.register_forward_hook(take)]

    def reset(self) -> None:
        for m in self.maxima:
            m.fill_(-math.inf)


class KeyNorm(_Hooks):
    """`sums[i]` [2]: (the sum over layer i's training forwards since reset() of the mean L2 norm of its keys, the
    forwards), the keys after k_norm and before RoPE (which keeps norms), every token, without a gradient. A
    gradient-checkpointing recompute counts as a forward of its own (the same mean, summed twice)."""

    def __init__(self, blocks: nn.ModuleList, device: torch.device, on: bool = False):
        self.on = on
        self.sums = [torch.zeros(2, device=device) for _ in blocks]
        self.handles = []
        for i, block in enumerate(blocks):
            def add(module, inputs, k_BTKD, i=i):
                if self.on and module.training:
                    with torch.no_grad():
                        self.sums[i].add_(torch.stack((k_BTKD.float().norm(dim=-1).mean(),
                                                       torch.ones((), device=k_BTKD.device))))
            self.handles.append(block.attn.hook_k_norm.register_forward_hook(add))

    def reset(self) -> None:
        for s in self.sums:
            s.zero_()


class GateClosed(_Hooks):
    """`sums[i]` [2]: (the share of layer i's attention-output gate values below GATE_CLOSED, summed over its
    training forwards since reset(), the forwards): gate saturation, the telemetry's gate_closed. Only for a gated
    model (blocks whose attention has hook_gate)."""

    def __init__(self, blocks: nn.ModuleList, device: torch.device, on: bool = False):
        self.on = on
        self.sums = [torch.zeros(2, device=device) for _ in blocks]
        self.handles = []
        for i, block in enumerate(blocks):
            def add(module, inputs, g_BTHg, i=i):
                if self.on and module.training:
                    with torch.no_grad():
                        self.sums[i].add_(torch.stack(((g_BTHg < GATE_CLOSED).float().mean(),
                                                       torch.ones((), device=g_BTHg.device))))
            self.handles.append(block.attn.hook_gate.register_forward_hook(add))

    def reset(self) -> None:
        for s in self.sums:
            s.zero_()


class QKClip:
    """--qk_clip in the trainer's step: reset() before its forwards, after_update() after the optimizers' steps (the
    step's largest logits over all ranks, one collective for every layer, then the clip), log() on a logged line."""

    def __init__(self, blocks: nn.ModuleList, tau: float, runtime: Runtime):
        self.blocks, self.tau, self.runtime = blocks, tau, runtime
        self.logits = LogitMax(blocks, runtime.device)
        self.counts = [0] * len(blocks)  # heads clipped per layer since the last log line

    def reset(self) -> None:
        self.logits.reset()

    def after_update(self) -> None:
        maxima = self.runtime.max_(torch.stack(self.logits.maxima))
        for own, m in zip(self.logits.maxima, maxima):
            own.copy_(m)
        self.counts = [a + b for a, b in zip(self.counts, qk_clip_(self.blocks, self.logits.maxima, self.tau))]

    def log(self) -> dict:
        """QK-clip's log fields: heads clipped per layer since the last log line, the step's max logit per layer."""
        out = {"qk_clipped_heads": self.counts, "max_logit": [m.max().item() for m in self.logits.maxima]}
        self.counts = [0] * len(self.counts)
        return out

    def remove(self) -> None:
        self.logits.remove()
