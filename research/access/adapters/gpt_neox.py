"""GPT-NeoX (Pythia, PolyPythias): one fused query_key_value Linear interleaved by head, partial RoPE, LayerNorm with
bias, biases on the projections, and a parallel or sequential residual.

`GPTNeoXAdapter` takes query_key_value apart head by head (`_per_head`) and reads the rotated share of each head
from the attention's own rotary_ndims. Where transformers' GPTNeoXAttention keeps each of these, and what `capture`
gives for it: docs/inspection.md, "Model access: the adapters".
"""
from __future__ import annotations

import torch

from research.access.adapters.base import DEFAULT_ATTN
from research.access.adapters.hf import HFAdapter


class GPTNeoXAdapter(HFAdapter):
    """GPT-NeoX: model.gpt_neox.layers[i].attention.{query_key_value, dense}, model.gpt_neox.final_layer_norm."""

    family = "gpt_neox"
    norm_centres = True

    # GPT-NeoX splits hidden_size into num_attention_heads equal heads (no head_dim) and has no KV heads of its own
    FIELDS = {"n_heads": "num_attention_heads", "n_kv_heads": "num_attention_heads", "head_dim": None,
              "d_model": "hidden_size", "context": "max_position_embeddings"}

    def __init__(self, model, attn_implementation: str | None = DEFAULT_ATTN):
        super().__init__(model, attn_implementation)
        self.parallel_residual = bool(model.config.use_parallel_residual)

    def _base(self):
        return self.model.gpt_neox

    def _layer_list(self):
        return self.base.layers

    def _rotary_dims(self):
        return int(self.attn(0).rotary_ndims)  # the attention's own count: int(head_dim x partial_rotary_factor)

    def attn(self, i):
        return self.layers[i].attention

    def _per_head(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """query_key_value's weight [3 H D, d] or bias [3 H D] -> q, k, v each [H D, ...], heads in order."""
        parts = x.reshape(self.n_heads, 3, -1, *x.shape[1:])                   # [H, 3, D, ...]
        return {m: parts[:, j].reshape(-1, *x.shape[1:]) for j, m in enumerate("qkv")}

    def qkvo(self, i):
        """q, k, v are copies (no [H D, d] view of rows interleaved by head exists): edit query_key_value itself."""
        a = self.attn(i)
        return {**self._per_head(a.query_key_value.weight), "o": a.dense.weight}

    def biases(self, i):
        b = self.attn(i).query_key_value.bias
        return dict.fromkeys("qkv") if b is None else self._per_head(b)

    def final_norm_module(self):
        return self.base.final_layer_norm

    def key_projection(self, i):
        return self.attn(i).query_key_value

    def keys_of(self, projected):
        B, T, _ = projected.shape
        per_head = projected.reshape(B, T, self.n_heads, 3 * self.head_dim)
        return per_head[..., self.head_dim:2 * self.head_dim].reshape(B, T, self.n_heads * self.head_dim)
