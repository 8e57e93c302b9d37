"""Gemma 3 (text): the Llama layout with per-head q_norm / k_norm, RMSNorm gains of 1 + weight, soft-capped logits."""
from __future__ import annotations

from research.access.adapters.base import DEFAULT_ATTN
from research.access.adapters.hf import HFAdapter


class Gemma3Adapter(HFAdapter):
    """Gemma 3 (text): RMSNorm gains act as 1 + weight; final logits are soft-capped."""

    family = "gemma3"
    gain_offset = 1.0

    def __init__(self, model, attn_implementation: str | None = DEFAULT_ATTN):
        super().__init__(model, attn_implementation)
        self.logit_softcap = getattr(model.config, "final_logit_softcapping", None)
