"""Gemma 4's text model (gemma4_text): the Llama layout with per-layer shapes. Sliding layers have heads of head_dim
rotated whole; full-attention layers larger heads (global_head_dim), fewer KV heads, and "proportional" RoPE (the
first partial_rotary_factor of the pairs at theta^(-2j / head_dim), the rest at 0). q_norm and k_norm multiply by
their weight, v_norm has no gain, the logit scale is 1. attention_k_eq_v layers have no v_proj (v is k); the last
num_kv_shared_layers layers read an earlier layer's keys and values (config.kv_sharing_modes). A tool that reads one
head size per model gets an InspectError; qk-audit reads every layer (head_dim_of, kv_heads_of). docs/audit.md.
"""
from __future__ import annotations

import torch.nn as nn

from research.access.adapters.base import DEFAULT_ATTN, InspectError
from research.access.adapters.hf import HFAdapter


class Gemma4Adapter(HFAdapter):
    """Gemma 4 text: layer i is the model's layer i; per-layer head sizes and KV heads, KV sharing, K = V."""

    family = "gemma4"

    def __init__(self, model, attn_implementation: str | None = DEFAULT_ATTN):
        super().__init__(model, attn_implementation)
        self.logit_softcap = getattr(model.config, "final_logit_softcapping", None)

    @classmethod
    def check_config(cls, c, source):
        """Each layer's dimensions checked as HFAdapter checks a model's (transformers refuses to read a per-layer
        field such as num_key_value_heads from the whole config); returns layer 0's."""
        views = getattr(c, "per_layer_config", None)
        if views is None:
            return super().check_config(c, source)
        return [super(Gemma4Adapter, cls).check_config(views[i], f"{source} (layer {i})")
                for i in range(c.num_hidden_layers)][0]

    # one head size for the whole model: only where every layer has it (else the tool that asks is told)
    def _uniform(self, what: str, values: list[int]) -> int:
        if len(set(values)) > 1:
            raise InspectError(f"this Gemma 4 model's layers have {what} {sorted(set(values))}: this tool reads "
                               f"models whose layers share one; qk-audit reads it layer by layer")
        return values[0]

    @property
    def head_dim(self) -> int:
        return self._uniform("head sizes", [self.head_dim_of(i) for i in range(self.n_layers)])

    @head_dim.setter
    def head_dim(self, value) -> None:  # HFAdapter sets the config's (the sliding layers'); per layer: head_dim_of
        pass

    @property
    def n_kv_heads(self) -> int:
        return self._uniform("KV head counts", [self.kv_heads_of(i) for i in range(self.n_layers)])

    @n_kv_heads.setter
    def n_kv_heads(self, value) -> None:
        pass

    @property
    def rotary_dims(self) -> int:
        return self.head_dim  # proportional RoPE pairs the whole head; the pairs it leaves turn at frequency 0

    @rotary_dims.setter
    def rotary_dims(self, value) -> None:
        pass

    def _rotary_dims(self):
        return 0  # unused: rotary_dims is the property above

    def head_dim_of(self, i):
        return int(self.attn(i).head_dim)

    def kv_heads_of(self, i):
        return self.n_heads // int(self.attn(i).num_key_value_groups)

    def rotary_dims_of(self, i):
        return self.head_dim_of(i)

    def kv_source(self, i: int) -> int:
        """The layer whose keys and values layer i attends with: i, or for a KV-shared layer the last earlier layer
        of its type that stores them."""
        modes, kinds = self.model.config.kv_sharing_modes, self.model.config.layer_types
        if modes[i] != "reuse":
            return i
        return max(j for j in range(i) if modes[j] == "store" and kinds[j] == kinds[i])

    def qkvo(self, i):
        """A KV-shared layer's k and v are its source layer's; a K = V layer's v is its k."""
        a, src = self.attn(i), self.attn(self.kv_source(i))
        k = src.k_proj.weight
        v = k if src.v_proj is None else src.v_proj.weight
        return {"q": a.q_proj.weight, "k": k, "v": v, "o": a.o_proj.weight}

    def biases(self, i):
        a, src = self.attn(i), self.attn(self.kv_source(i))
        k = src.k_proj.bias
        return {"q": a.q_proj.bias, "k": k, "v": k if src.v_proj is None else src.v_proj.bias}

    def read_weights(self, i, m):
        """A KV-shared layer's keys read its source layer's stream, through that layer's norms."""
        return super().read_weights(self.kv_source(i) if m == "k" else i, m)

    def value_norm(self, i):
        return getattr(self.attn(i), "v_norm", None)

    def key_projection(self, i) -> nn.Module | None:
        return getattr(self.attn(i), "k_proj", None)
