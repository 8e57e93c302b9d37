"""QK-clip (Kimi K2, 2025): after an optimizer step, bring every attention head's largest logit back to tau.

A head h whose largest logit S_h over the step's batch exceeded tau gets gamma_h = tau / S_h, and its query and key
projections are each multiplied by sqrt(gamma_h), so its logits (bilinear in W_q and W_k, RoPE included) are
multiplied by gamma_h. With grouped-query attention the shared key projection takes sqrt(min_g gamma_g) and each
query head gamma_h / sqrt(min_g gamma_g): every head's logits are multiplied by exactly its own gamma_h, and heads
at or below tau keep theirs. Under QK-norm the logits do not depend on the scale of W_q and W_k, so QK-clip applies
to models without it (configs check this). More: docs/probing.md, "Attention logits and QK-clip".
"""
from __future__ import annotations

import torch
import torch.nn as nn


def clip_factors(max_logit_H: torch.Tensor, tau: float, n_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(query factors [H], key factors [K]) that multiply head h's logits by min(1, tau / S_h)."""
    H = max_logit_H.numel()
    gamma_H = torch.where(max_logit_H > tau, tau / max_logit_H, torch.ones_like(max_logit_H))
    key_K = gamma_H.view(n_kv_heads, H // n_kv_heads).amin(1).sqrt()        # [K]
    return gamma_H / key_K.repeat_interleave(H // n_kv_heads), key_K


@torch.no_grad()
def qk_clip_(blocks: nn.ModuleList, max_logits: list[torch.Tensor], tau: float) -> list[int]:
    """Apply QK-clip in place to each block's attention from its largest logit of each query head [H] in
    `max_logits` (of the step, all ranks: training/observers.py); returns how many query heads were clipped in
    each layer. Every layer is scaled (by exactly 1 where no head exceeded tau, which leaves its weights bit for
    bit), so that deciding which layers to touch does not wait for the GPU layer by layer; the counts are read
    back once."""
    counts = []
    for block, max_logit_H in zip(blocks, max_logits, strict=True):
        attn = block.attn
        H, K, D = attn.n_heads, attn.n_kv_heads, attn.d_head
        counts.append((max_logit_H > tau).sum())
        q_H, k_K = clip_factors(max_logit_H.float(), tau, K)
        attn.wq.weight.view(H, D, -1).mul_(q_H.to(attn.wq.weight.dtype)[:, None, None])
        attn.wk.weight.view(K, D, -1).mul_(k_K.to(attn.wk.weight.dtype)[:, None, None])
    return torch.stack(counts).tolist()
