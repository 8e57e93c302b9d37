"""Qwen3.5's text model (qwen3_5_text): three linear-attention (Gated DeltaNet) layers to each full-attention one.
The adapter's layers are the full-attention ones, the only ones with keys; their q_proj holds each head's query and
its output gate side by side ([H, 2D] rows), RoPE turns a quarter of each head (partial_rotary_factor), and
its RMSNorms multiply by 1 + weight."""
from __future__ import annotations

import torch.nn as nn

from research.access.adapters.hf import HFAdapter


class Qwen35Adapter(HFAdapter):
    """Qwen3.5 text: layer i of the adapter is the i-th full-attention layer of the model (config.layer_types)."""

    family = "qwen3_5"
    gain_offset = 1.0  # its RMSNorm multiplies by 1 + weight, as Gemma's (found by qk-audit: the gains in use)

    def _layer_list(self):
        kinds = self.model.config.layer_types
        return [layer for layer, kind in zip(self.base.layers, kinds) if kind == "full_attention"]

    def _rotary_dims(self) -> int:
        factor = (self.model.config.rope_parameters or {}).get("partial_rotary_factor", 1.0)
        return int(self.head_dim * factor)

    def final_layer(self) -> nn.Module:
        return self.base.layers[-1]  # the residual stream's end: a linear-attention layer may come last

    def _queries(self, x):
        """q_proj's rows (or output's last dim) [H * 2D, ...] -> the queries' [H * D, ...] (each head's first D)."""
        H, D = self.n_heads, self.head_dim
        return x.reshape(H, 2 * D, *x.shape[1:])[:, :D].reshape(H * D, *x.shape[1:])

    def qkvo(self, i):
        """q is a copy (each head's query rows, without its gate's): edit q_proj itself."""
        return {**super().qkvo(i), "q": self._queries(self.attn(i).q_proj.weight)}

    def biases(self, i):
        b = super().biases(i)
        return {**b, "q": None if b["q"] is None else self._queries(b["q"])}

    def queries_of(self, projected):
        B, T, _ = projected.shape
        return projected.reshape(B, T, self.n_heads, 2, self.head_dim)[..., 0, :].reshape(B, T, -1)
