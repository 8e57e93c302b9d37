"""Building blocks of the Gemma-style decoder.

Shape legend: B batch, T sequence, d d_model, H query heads, K key/value heads,
D head size (d_head), F feed-forward size.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from configs.config import ModelConfig


class HookPoint(nn.Identity):
    """A named identity at a tensor worth measuring; probes attach forward hooks here."""


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * gain, over the last dimension.

    learnable=False fixes the gain at exactly 1: it stays a Parameter (so the
    module looks the same to checkpoints and probes) but with requires_grad=False,
    which keeps it out of every optimizer.
    """

    def __init__(self, dim: int, eps: float, learnable: bool = True, init: float = 1.0):
        super().__init__()
        self.eps, self.init = eps, float(init)  # init: what MinimalLLM.reset_parameters sets the gain to
        self.weight = nn.Parameter(torch.full((dim,), float(init)), requires_grad=learnable)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in float32: under bf16 autocast the mean of squares loses precision.
        y = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return y.type_as(x)


class HeadGainRMSNorm(nn.Module):
    """RMSNorm over each head's D-vector of x [B, T, heads, D], then a gain per head: weight [heads, D] (a vector
    per head) or [heads, 1] (one scalar per head, Parameter Golf's q-gain). learnable=False: frozen at `init`."""

    def __init__(self, heads: int, width: int, eps: float, learnable: bool = True, init: float = 1.0):
        super().__init__()
        self.eps, self.init = eps, float(init)
        self.weight = nn.Parameter(torch.full((heads, width), float(init)), requires_grad=learnable)

    def forward(self, x_BTHD: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x_BTHD.float(), (x_BTHD.shape[-1],), None, self.eps) * self.weight.float()
        return y.type_as(x_BTHD)


def make_qk_norm(cfg: ModelConfig, heads: int, which: str = "q") -> nn.Module:
    """The q (heads = n_heads, which 'q') or k (heads = n_kv_heads, 'k') norm: over each head's D-vector with one
    gain of size D shared by the heads (qk_norm_scope head), or over the whole projection, heads x D, with a gain of
    that size (qk_norm_scope full, OLMo 2); qk_gain_shape per_head / head_scalar: a gain per head (HeadGainRMSNorm).
    The gains start at qk_gain_init; a norm that qk_gain_on leaves without a gain has one frozen at 1."""
    if cfg.qk_norm == "none":
        return nn.Identity()
    gained = cfg.qk_gain_on in ("both", which)
    learnable, init = cfg.qk_norm == "learned" and gained, cfg.qk_gain_init if gained else 1.0
    if cfg.qk_gain_shape != "shared" and gained:
        return HeadGainRMSNorm(heads, cfg.d_head if cfg.qk_gain_shape == "per_head" else 1, cfg.norm_eps,
                               learnable, init)
    dim = cfg.d_head if cfg.qk_norm_scope == "head" else heads * cfg.d_head
    return RMSNorm(dim, cfg.norm_eps, learnable=learnable, init=init)


def softcapped_attention(q_BHTD: torch.Tensor, k_BKTD: torch.Tensor, v_BKTD: torch.Tensor,
                         cap: float, scale: float | None = None) -> torch.Tensor:
    """Causal attention with soft-capped logits, cap * tanh(scale x q . k / cap) (Gemma 2), [B, H, T, D]; scale
    1/sqrt(D) where None.

    SDPA has no soft-cap, so the scores are written out: logits, cap and softmax in float32 (under bf16 autocast
    too: tanh and softmax of bf16 logits would round the cap away), the weighted sum of values in v's dtype, as
    SDPA computes it. Query head h reads KV head h // (H / K), as SDPA's enable_gqa. Memory: the B x H x T x T
    scores, which SDPA never holds."""
    H, K, T, D = q_BHTD.shape[1], k_BKTD.shape[1], q_BHTD.shape[2], q_BHTD.shape[3]
    if H != K:
        k_BKTD, v_BKTD = k_BKTD.repeat_interleave(H // K, 1), v_BKTD.repeat_interleave(H // K, 1)   # [B, H, T, D]
    with torch.autocast(q_BHTD.device.type, enabled=False):
        s_BHTT = (q_BHTD.float() @ k_BKTD.float().mT) * (D ** -0.5 if scale is None else scale)
        s_BHTT = torch.tanh(s_BHTT / cap) * cap
        future = torch.ones(T, T, dtype=torch.bool, device=s_BHTT.device).triu(1)
        p_BHTT = torch.softmax(s_BHTT.masked_fill(future, -math.inf), dim=-1)
    return p_BHTT.to(v_BKTD.dtype) @ v_BKTD


class Rotary(nn.Module):
    """Rotary position embedding, rotating pairs (i, i + D/2) of each head's dims (`pairing` "half", as Hugging
    Face's rotate_half; GPT-J's "interleaved" pairs (2i, 2i + 1)): what a metric of the pairs reads from here.

    The angle of pair i at position t is t * theta^(-2i/D), so a query at position m
    and a key at position n interact only through m - n. With `fraction` < 1 (ModelConfig.rope_fraction) only the
    first fraction x D/2 pairs, the highest frequencies, rotate; the others pass unchanged and carry no position
    (p-RoPE, Barbero et al. 2024).
    """

    pairing = "half"

    def __init__(self, d_head: int, max_seq_len: int, theta: float, fraction: float = 1.0):
        super().__init__()
        self.d_head, self.theta = d_head, theta
        self.n_rotated = rotated_pairs(d_head, fraction)
        inv_freq = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # [D/2]
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq[:self.n_rotated])  # [T_max, R]
        # Non-persistent: rebuilt from the config, never stored in checkpoints.
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def frequencies(self) -> torch.Tensor:
        """[D/2] float64: the angle each pair turns per position, in radians (0 for a pair that does not rotate)."""
        inv_freq = self.theta ** (-torch.arange(0, self.d_head, 2, dtype=torch.float64) / self.d_head)
        return torch.where(torch.arange(self.d_head // 2) < self.n_rotated, inv_freq, 0.0)

    def forward(self, x_BTHD: torch.Tensor) -> torch.Tensor:
        T = x_BTHD.shape[1]
        if T > self.cos.shape[0]:
            raise ValueError(f"sequence of {T} tokens exceeds max_seq_len={self.cos.shape[0]}")
        cos = self.cos[:T, None, :]  # [T, 1, R], broadcast over B and heads
        sin = self.sin[:T, None, :]
        x1, x2 = x_BTHD.float().chunk(2, dim=-1)
        R = self.n_rotated
        if R == x1.shape[-1]:
            y = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        else:  # the pairs from R on pass unchanged
            a, b = x1[..., :R], x2[..., :R]
            y = torch.cat((a * cos - b * sin, x1[..., R:], a * sin + b * cos, x2[..., R:]), dim=-1)
        return y.type_as(x_BTHD)


def rotated_pairs(d_head: int, fraction: float) -> int:
    """How many of the D/2 rotary pairs rotate at rope_fraction `fraction` (a whole number: ModelConfig checks)."""
    return round(fraction * d_head / 2)


@torch.no_grad()
def causal_max_logit(q_BHTD: torch.Tensor, k_BKTD: torch.Tensor, block: int = 256,
                     scale: float | None = None) -> torch.Tensor:
    """[H] the largest attention logit scale x q_t . k_j (scale 1/sqrt(D) where None), j <= t, of each query head
    over the batch.

    Query head h reads KV head h // (H / K), as SDPA's enable_gqa. Queries are taken `block`
    positions at a time against the keys up to the block's end, so the extra memory is
    B x H x block x T logits, never the full T x T."""
    B, H, T, D = q_BHTD.shape
    K = k_BKTD.shape[1]
    q = q_BHTD.reshape(B, K, H // K * T, D)                                  # heads of a group stacked
    k = k_BKTD * (D ** -0.5 if scale is None else scale)
    best = torch.full((H,), -math.inf, device=q_BHTD.device)
    for start in range(0, T, block):
        end = min(start + block, T)
        s = (q.view(B, K, H // K, T, D)[:, :, :, start:end].reshape(B, K, -1, D) @ k[:, :, :end].mT).float()
        s = s.view(B, K, H // K, end - start, end)                             # [B, K, G, n, end]
        future = torch.ones(end - start, end, dtype=torch.bool, device=s.device).triu(start + 1)
        best = torch.maximum(best, s.masked_fill(future, -math.inf).amax((0, 3, 4)).reshape(H))
    return best


class Attention(nn.Module):
    """Causal grouped-query attention with per-head q/k RMSNorm before RoPE.

    q_norm and k_norm normalize each head's D-vector with one gain shared by all
    heads of the layer, after the head split and before RoPE (as Qwen3 and Gemma 3);
    with qk_norm_scope 'full' they normalize the whole q and k projections before the
    head split instead (OLMo 2), with gains of H x D and K x D.
    Variants (ModelConfig): qk_gain_shape / qk_gain_on / qk_gain_init set the norms' gains (make_qk_norm);
    every logit is logit_scale x q . k (attn_scale, 1/sqrt(D) by default, times qk_mult); attn_softcap > 0 caps
    each logit to cap * tanh(logit / cap)
    (softcapped_attention; SDPA where 0); attn_gate multiplies each head's output by
    sigmoid(wg(x)) of the block's normed input x, per channel (elementwise, wg: d -> H x D)
    or one per head (headwise, wg: d -> H), before wo (arXiv 2505.06708).
    Hook points ([B, T, heads, D]): hook_v (the values, firing before the q/k hooks, so that a probe holds them
    when the layer's last hook fires), hook_q_norm, hook_k_norm (pre-RoPE; for
    qk_norm='none' the raw projections), hook_q_rope, hook_k_rope; with a gate also
    hook_gate ([B, T, H, D or 1], the sigmoid), which fires before the others. Training reads the model
    there too (QK-clip's largest logits, the telemetry's key norms: training/observers.py).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        d, D = cfg.d_model, cfg.d_head
        self.wq = nn.Linear(d, cfg.n_heads * D, bias=False)
        self.wk = nn.Linear(d, cfg.n_kv_heads * D, bias=False)
        self.wv = nn.Linear(d, cfg.n_kv_heads * D, bias=False)
        self.wo = nn.Linear(cfg.n_heads * D, d, bias=False)
        self.q_norm = make_qk_norm(cfg, cfg.n_heads, "q")
        self.k_norm = make_qk_norm(cfg, cfg.n_kv_heads, "k")
        self.full_scope = cfg.qk_norm_scope == "full"
        self.softcap = cfg.attn_softcap
        self.scale = cfg.logit_scale  # attn_scale (1/sqrt(D) where 0) x qk_mult: what multiplies q . k
        # None where it is the default: SDPA and the written-out path take 1/sqrt(D) their own way, bit for bit as
        # before these settings existed
        self.given_scale = None if cfg.attn_scale == 0 and cfg.qk_mult == 1 else self.scale
        if cfg.attn_gate != "none":
            self.wg = nn.Linear(d, cfg.n_heads * (D if cfg.attn_gate == "elementwise" else 1), bias=False)
            self.hook_gate = HookPoint()
        self.gate = cfg.attn_gate
        self.hook_v, self.hook_q_norm, self.hook_k_norm = HookPoint(), HookPoint(), HookPoint()
        self.hook_q_rope, self.hook_k_rope = HookPoint(), HookPoint()

    def forward(self, x_BTd: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        B, T, _ = x_BTd.shape
        H, K, D = self.n_heads, self.n_kv_heads, self.d_head
        if self.gate != "none":  # computed first, so that a probe holds it when the layer's last hook fires
            g_BTHg = self.hook_gate(torch.sigmoid(self.wg(x_BTd)).view(B, T, H, -1))   # [B, T, H, D or 1]
        if self.full_scope:  # normalize the whole projections [B, T, H*D] / [B, T, K*D], then split the heads
            q_BTHD = self.q_norm(self.wq(x_BTd)).view(B, T, H, D)
            k_BTKD = self.k_norm(self.wk(x_BTd)).view(B, T, K, D)
        else:
            q_BTHD = self.q_norm(self.wq(x_BTd).view(B, T, H, D))
            k_BTKD = self.k_norm(self.wk(x_BTd).view(B, T, K, D))
        v_BTKD = self.hook_v(self.wv(x_BTd).view(B, T, K, D))
        q_BTHD = self.hook_q_norm(q_BTHD)
        k_BTKD = self.hook_k_norm(k_BTKD)
        q_BTHD = self.hook_q_rope(rotary(q_BTHD))
        k_BTKD = self.hook_k_rope(rotary(k_BTKD))
        # SDPA takes [B, heads, T, D]; query head h reads KV head h // (H / K).
        q_BHTD, k_BKTD = q_BTHD.transpose(1, 2), k_BTKD.transpose(1, 2)
        if self.softcap:
            y_BHTD = softcapped_attention(q_BHTD, k_BKTD, v_BTKD.transpose(1, 2), self.softcap, self.given_scale)
        else:
            y_BHTD = F.scaled_dot_product_attention(q_BHTD, k_BKTD, v_BTKD.transpose(1, 2), is_causal=True,
                                                    enable_gqa=H != K, scale=self.given_scale)
        y_BTHD = y_BHTD.transpose(1, 2)
        if self.gate != "none":
            y_BTHD = y_BTHD * g_BTHg.to(y_BTHD.dtype)
        return self.wo(y_BTHD.reshape(B, T, H * D))


class FeedForward(nn.Module):
    """down(relu(up(x))^2): the squared-ReLU MLP of the write-ups."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x_BTd: torch.Tensor) -> torch.Tensor:
        return self.down(F.relu(self.up(x_BTd)).square())


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + ffn(norm(x)).

    `recomputing` is True while gradient checkpointing runs the block's forward again in backward (MinimalLLM),
    so that a reader of its hook points can tell the recompute from a forward of its own."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.recomputing = False
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x_BTd: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        x_BTd = x_BTd + self.attn(self.attn_norm(x_BTd), rotary)
        return x_BTd + self.ffn(self.ffn_norm(x_BTd))
