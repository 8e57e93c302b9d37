"""OLMo 2: the Llama layout whose q_norm / k_norm normalize the whole projection (all heads together)."""
from __future__ import annotations

import torch

from research.access.adapters.hf import HFAdapter
from utils.tensors import heads_first


class Olmo2Adapter(HFAdapter):
    """OLMo 2 normalizes the whole key projection (all heads together), before the head split."""

    family = "olmo2"

    @torch.no_grad()
    def normed(self, norm, x_BTC, heads):
        B, T, _ = x_BTC.shape
        return heads_first(norm(x_BTC).reshape(B, T, heads, self.head_dim))
