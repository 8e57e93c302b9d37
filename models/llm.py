"""MinimalLLM: the Gemma-style decoder-only language model."""
from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from configs.config import ModelConfig
from models.layers import Block, RMSNorm, Rotary
from models.loss import linear_cross_entropy, linear_cross_entropy_z


@contextmanager
def _recomputing(block: Block):
    """Checkpointing's recompute of a block in backward (Block.recomputing)."""
    block.recomputing = True
    try:
        yield
    finally:
        block.recomputing = False


class MinimalLLM(nn.Module):
    """Token embedding * sqrt(d_model) -> n_layers pre-norm blocks -> RMSNorm -> tied LM head.

    Parameter names the optimizer split relies on: `embed.weight` (shared with the
    LM head), `blocks.{i}.attn.{wq,wk,wv,wo}.weight`, `blocks.{i}.ffn.{up,down}.weight`
    (2-D, Muon), with attn_gate also `blocks.{i}.attn.wg.weight` (2-D, Muon), and 1-D norm
    gains ending in `norm.weight` (AdamW).

    `z_loss` (set by the trainer from TrainConfig.z_loss): in training mode, forward with targets
    returns the objective CE + z_loss * mean(logsumexp(logits)^2) and keeps its parts, detached, in
    `loss_parts` ({"loss": CE, "z_loss": the z term}); in eval mode (validation, the probe) it returns
    the CE alone.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.rotary = Rotary(cfg.d_head, cfg.max_seq_len, cfg.rope_theta, cfg.rope_fraction)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.grad_checkpointing = False
        self.fused_loss = True  # LM head and cross-entropy in one chunked pass (models/loss.py)
        self.z_loss = 0.0  # z-loss coefficient of the training objective (TrainConfig.z_loss)
        self.loss_parts: dict[str, torch.Tensor] = {}  # the latest training objective's parts (z_loss > 0 only)
        self.compiled_blocks: list | None = None  # set by compile_blocks(); used in training mode only
        self.reset_parameters()

    def compile_blocks(self) -> None:
        """Compile each block (regional compilation): the blocks share one compiled graph, so compiling
        takes about as long for 32 layers as for one, and the embedding, final norm and chunked loss stay
        eager. The compiled blocks run in training mode only: evaluation and the probe (whose hooks need
        the plain modules) run the same blocks eagerly, without recompiling."""
        self.compiled_blocks = [torch.compile(block) for block in self.blocks]

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        # Residual outputs are scaled down with depth (GPT-2) so the stream's
        # variance at init does not grow with n_layers.
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        gains = {f"{m_name}.weight": m.init for m_name, m in self.named_modules() if hasattr(m, "init")}
        for name, p in self.named_parameters():
            if name in gains:  # a norm's gain: its initial value (1; a q/k gain qk_gain_init)
                nn.init.constant_(p, gains[name])
            elif p.ndim == 1:
                nn.init.ones_(p)
            elif name.endswith(("attn.wo.weight", "ffn.down.weight")):
                nn.init.normal_(p, std=out_std)
            else:
                nn.init.normal_(p, std=std)

    def hidden(self, idx_BT: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states [B, T, d]: everything but the LM head."""
        x_BTd = self.embed(idx_BT) * math.sqrt(self.cfg.d_model)
        blocks = self.compiled_blocks if self.compiled_blocks is not None and self.training else self.blocks
        for plain, block in zip(self.blocks, blocks):
            if self.grad_checkpointing and self.training:
                x_BTd = checkpoint(block, x_BTd, self.rotary, use_reentrant=False,
                                   context_fn=lambda plain=plain: (nullcontext(), _recomputing(plain)))
            else:
                x_BTd = block(x_BTd, self.rotary)
        return self.final_norm(x_BTd)

    def forward(self, idx_BT: torch.Tensor, targets_BT: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, vocab] without targets; mean cross-entropy (float32 scalar) with them."""
        h_BTd = self.hidden(idx_BT)
        if targets_BT is not None:
            return self.loss(h_BTd, targets_BT)
        return F.linear(h_BTd, self.embed.weight)

    def loss(self, h_BTd: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy (float32 scalar) of the LM head on final hidden states [B, T, d] (hidden()'s
        output), as forward computes it: so a pass that needed the hidden states anyway (the key probe) gets
        the loss of its tokens without a second forward. In training mode with z_loss > 0: the objective (class
        docstring)."""
        if self.z_loss and self.training:
            return self._objective(h_BTd, targets_BT)
        if self.fused_loss:
            return linear_cross_entropy(h_BTd.flatten(0, 1), self.embed.weight, targets_BT.flatten())
        logits_BTV = F.linear(h_BTd, self.embed.weight)
        return F.cross_entropy(logits_BTV.float().flatten(0, 1), targets_BT.flatten())

    def _objective(self, h_BTd: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        """CE + z-loss, keeping both parts (detached) in loss_parts; fused or not as the CE."""
        if self.fused_loss:
            objective, ce, z_term = linear_cross_entropy_z(h_BTd.flatten(0, 1), self.embed.weight,
                                                           targets_BT.flatten(), self.z_loss)
        else:
            logits_NV = F.linear(h_BTd, self.embed.weight).float().flatten(0, 1)
            ce = F.cross_entropy(logits_NV, targets_BT.flatten())
            z_term = self.z_loss * torch.logsumexp(logits_NV, dim=-1).square().mean()
            objective = ce + z_term
        self.loss_parts = {"loss": ce.detach(), "z_loss": z_term.detach()}
        return objective

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
