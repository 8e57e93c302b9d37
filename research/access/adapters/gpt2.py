"""GPT-2: a fused Conv1D c_attn ([in, out] layout) split into q, k, v; LayerNorm; learned positions (no RoPE)."""
from __future__ import annotations

from research.access.adapters.hf import HFAdapter


class GPT2Adapter(HFAdapter):
    """GPT-2: model.transformer.h[i].attn with a fused Conv1D c_attn ([in, out] layout) and c_proj."""

    family = "gpt2"
    rope_pairing = None  # learned absolute positions, added to the embeddings
    norm_centres = True

    def _base(self):
        return self.model.transformer

    def _layer_list(self):
        return self.base.h

    # GPT-2 splits n_embd into n_head equal heads (no head_dim) and has no KV heads of its own
    FIELDS = {"n_heads": "n_head", "n_kv_heads": "n_head", "head_dim": None, "d_model": "n_embd",
              "context": "n_positions"}

    def _rotary_dims(self):
        return 0

    def attn(self, i):
        return self.layers[i].attn

    def qkvo(self, i):
        a = self.attn(i)
        q, k, v = a.c_attn.weight.T.split(self.d_model, dim=0)
        return {"q": q, "k": k, "v": v, "o": a.c_proj.weight.T}

    def biases(self, i):
        return dict(zip("qkv", self.attn(i).c_attn.bias.split(self.d_model)))

    def qk_norms(self, i):
        return None, None

    def final_norm_module(self):
        return self.base.ln_f

    def attention_norm(self, i):
        return self.layers[i].ln_1

    def key_projection(self, i):
        return self.attn(i).c_attn

    def keys_of(self, projected):
        return projected[..., self.d_model:2 * self.d_model]
