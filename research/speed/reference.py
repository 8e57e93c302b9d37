"""A plain reference implementation of the training step, the yardstick of research/benchmark.py.

The same model and optimizer recipe as the project, written the obvious way and nothing more:
eager PyTorch, fp32 weights (bf16 only through autocast when asked), one nn.Module per concept,
SDPA for attention, F.cross_entropy on the full logits, and Muon as the public implementation
writes it: Newton-Schulz (the classic quintic, 5 steps) on each matrix separately, in bf16 when
the step runs in bf16, with AdamW (PyTorch's own) on the embedding and the norm gains.

`load_from(project_model)` copies the project's weights in, so a test can check that both
compute the same loss: the speed ratio then compares two implementations of one computation.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from configs import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, learnable: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=learnable)

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).type_as(x)


def rope(x_BHTD: torch.Tensor, cos_TD: torch.Tensor, sin_TD: torch.Tensor) -> torch.Tensor:
    x1, x2 = x_BHTD.float().chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x_BHTD.float() * cos_TD + rotated * sin_TD).type_as(x_BHTD)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.h, self.kv, self.D = c.n_heads, c.n_kv_heads, c.d_head
        self.q = nn.Linear(c.d_model, c.n_heads * c.d_head, bias=False)
        self.k = nn.Linear(c.d_model, c.n_kv_heads * c.d_head, bias=False)
        self.v = nn.Linear(c.d_model, c.n_kv_heads * c.d_head, bias=False)
        self.o = nn.Linear(c.n_heads * c.d_head, c.d_model, bias=False)
        on = c.qk_norm != "none"
        self.q_norm = RMSNorm(c.d_head, c.norm_eps, c.qk_norm == "learned") if on else nn.Identity()
        self.k_norm = RMSNorm(c.d_head, c.norm_eps, c.qk_norm == "learned") if on else nn.Identity()

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_norm(self.q(x).view(B, T, self.h, self.D)).transpose(1, 2)
        k = self.k_norm(self.k(x).view(B, T, self.kv, self.D)).transpose(1, 2)
        v = self.v(x).view(B, T, self.kv, self.D).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.h != self.kv)
        return self.o(y.transpose(1, 2).reshape(B, T, self.h * self.D))


class Block(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(c.d_model, c.norm_eps), RMSNorm(c.d_model, c.norm_eps)
        self.attn = Attention(c)
        self.up = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.down = nn.Linear(c.d_ff, c.d_model, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.down(F.relu(self.up(self.norm2(x))).square())


class ReferenceLM(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        inv_freq = c.rope_theta ** (-torch.arange(0, c.d_head, 2, dtype=torch.float64) / c.d_head)
        angles = torch.outer(torch.arange(c.max_seq_len, dtype=torch.float64), inv_freq).repeat(1, 2)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        for name, p in self.named_parameters():
            if p.ndim == 2:
                nn.init.normal_(p, std=c.init_std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed(idx) * math.sqrt(self.c.d_model)
        for block in self.blocks:
            x = block(x, self.cos[:T], self.sin[:T])
        logits = F.linear(self.norm(x), self.embed.weight)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def load_from(self, model: nn.Module) -> "ReferenceLM":
        """Copy the weights of a project MinimalLLM of the same config."""
        self.embed.weight.copy_(model.embed.weight)
        self.norm.weight.copy_(model.final_norm.weight)
        for mine, theirs in zip(self.blocks, model.blocks):
            a, b = mine.attn, theirs.attn
            for dst, src in ((a.q, b.wq), (a.k, b.wk), (a.v, b.wv), (a.o, b.wo), (mine.up, theirs.ffn.up),
                             (mine.down, theirs.ffn.down)):
                dst.weight.copy_(src.weight)
            mine.norm1.weight.copy_(theirs.attn_norm.weight)
            mine.norm2.weight.copy_(theirs.ffn_norm.weight)
            if not isinstance(a.q_norm, nn.Identity):
                a.q_norm.weight.copy_(b.q_norm.weight)
                a.k_norm.weight.copy_(b.k_norm.weight)
        return self


def newton_schulz5(G: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.to(dtype)
    tall = X.size(0) > X.size(1)
    X = X.T if tall else X
    X = X / (X.norm() + 1e-7)
    for _ in range(5):
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return (X.T if tall else X).to(G.dtype)


class ReferenceMuon(torch.optim.Optimizer):
    """Muon as the public implementation writes it: one matrix at a time."""

    def __init__(self, params, lr: float, momentum: float = 0.95, dtype: torch.dtype = torch.bfloat16):
        super().__init__(params, dict(lr=lr, momentum=momentum))
        self.dtype = dtype

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                g = p.grad.add(buf, alpha=group["momentum"])  # Nesterov
                scale = math.sqrt(max(1.0, p.size(0) / p.size(1)))
                p.add_(newton_schulz5(g, self.dtype), alpha=-group["lr"] * scale)


def reference_optimizers(model: ReferenceLM, muon_lr: float = 0.024, adamw_lr: float = 0.006,
                         ortho_dtype: torch.dtype = torch.bfloat16) -> list[torch.optim.Optimizer]:
    """Muon on the 2-D hidden matrices; AdamW (weight decay 0.2) on the embedding and the gains."""
    hidden = [p for n, p in model.named_parameters() if p.ndim == 2 and n != "embed.weight" and p.requires_grad]
    rest = [p for n, p in model.named_parameters() if (p.ndim < 2 or n == "embed.weight") and p.requires_grad]
    return [ReferenceMuon(hidden, muon_lr, dtype=ortho_dtype),
            torch.optim.AdamW(rest, lr=adamw_lr, weight_decay=0.2)]
