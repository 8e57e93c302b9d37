"""Families of the Llama layout (hf.HFAdapter) changing a few attributes: Qwen3 and Apertus (per-head q_norm / k_norm
before RoPE), Arcee (a non-gated MLP), OLMo 2 and 3 (q_norm / k_norm over the whole projection), SmolLM3 (layers
without RoPE), Gemma 3 text (RMSNorm gains of 1 + weight, soft-capped logits). export_hf.py writes Apertus for
qk_norm learned or frozen, Arcee for none."""
from __future__ import annotations

import torch

from research.access.adapters.base import DEFAULT_ATTN
from utils.tensors import heads_first
from research.access.adapters.hf import HFAdapter


class Qwen3Adapter(HFAdapter):
    family = "qwen3"


class ApertusAdapter(HFAdapter):
    family = "apertus"


class ArceeAdapter(HFAdapter):
    family = "arcee"


class Olmo2Adapter(HFAdapter):
    """OLMo 2 normalizes the whole key projection (all heads together), before the head split."""

    family = "olmo2"

    @torch.no_grad()
    def normed(self, norm, x_BTC, heads):
        B, T, _ = x_BTC.shape
        return heads_first(norm(x_BTC).reshape(B, T, heads, -1))


class Olmo3Adapter(Olmo2Adapter):
    """OLMo 3: OLMo 2's whole-projection norms, sliding-window layers with RoPE per layer type."""

    family = "olmo3"


class SmolLM3Adapter(HFAdapter):
    """SmolLM3: the Llama layout, with the layers its config's no_rope_layers marks 0 left without RoPE (NoPE)."""

    family = "smollm3"

    def layer_has_rope(self, i):
        return bool(self.model.config.no_rope_layers[i]) and super().layer_has_rope(i)

    def rotary_frequencies(self, i):
        return super().rotary_frequencies(i) if self.layer_has_rope(i) else None


class Gemma3Adapter(HFAdapter):
    family = "gemma3"
    gain_offset = 1.0

    def __init__(self, model, attn_implementation: str | None = DEFAULT_ATTN):
        super().__init__(model, attn_implementation)
        self.logit_softcap = getattr(model.config, "final_logit_softcapping", None)
