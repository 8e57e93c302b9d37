"""The Hugging Face families of the Llama layout that differ from it (hf.HFAdapter) in a few attributes: Qwen3 and
Apertus (a q_norm / k_norm per head before RoPE), Arcee (a non-gated MLP), OLMo 2 (q_norm / k_norm over the whole
projection), Gemma 3 (RMSNorm gains of 1 + weight, soft-capped logits). research/export_hf.py writes Apertus for the
runs with qk_norm learned or frozen, Arcee for those with qk_norm none."""
from __future__ import annotations

import torch

from research.access.adapters.base import DEFAULT_ATTN, heads_first
from research.access.adapters.hf import HFAdapter


class Qwen3Adapter(HFAdapter):
    family = "qwen3"


class ApertusAdapter(HFAdapter):
    """Apertus: per-head q_norm / k_norm before RoPE (the export of qk_norm learned/frozen runs)."""

    family = "apertus"


class ArceeAdapter(HFAdapter):
    """Arcee: Llama attention with a non-gated MLP (the export of qk_norm='none' runs)."""

    family = "arcee"


class Olmo2Adapter(HFAdapter):
    """OLMo 2 normalizes the whole key projection (all heads together), before the head split."""

    family = "olmo2"

    @torch.no_grad()
    def normed(self, norm, x_BTC, heads):
        B, T, _ = x_BTC.shape
        return heads_first(norm(x_BTC).reshape(B, T, heads, self.head_dim))


class Gemma3Adapter(HFAdapter):
    """Gemma 3 (text): RMSNorm gains act as 1 + weight; final logits are soft-capped."""

    family = "gemma3"
    gain_offset = 1.0

    def __init__(self, model, attn_implementation: str | None = DEFAULT_ATTN):
        super().__init__(model, attn_implementation)
        self.logit_softcap = getattr(model.config, "final_logit_softcapping", None)
