"""Where things are inside a causal LM: one adapter class per model family.

    adapter = ADAPTERS[model_type](hf_model)      # or OwnAdapter(minimal_llm), own_adapter.py
    with adapter.capture(sink): adapter.forward(ids_BT)

An adapter exposes, uniformly across families: the decoder layers, per layer the q/k/v/o weights in nn.Linear layout
[out, in] (GPT-2's fused Conv1D c_attn is transposed and split, GPT-NeoX's fused query_key_value taken apart head by
head) and their biases, the k_norm/q_norm gains where the model has them, the per-layer norm gains (Gemma's RMSNorm
multiplies by 1 + weight: the effective gain is reported), the final norm, the input and output embeddings, and per
head the query/key weights as maps of the residual stream (`read_weights`, the norms' gains folded in), and RoPE as
data: `rotary_dims` (the first dims of each head that RoPE rotates; the rest pass unrotated, GPT-NeoX's partial
rotary), `rope_pairing` (which dims turn together: "half", dim j with j + rotary_dims / 2; None without RoPE),
`rotary_split` and `rotary_frequencies`, so no other code assumes a convention. Families differ by overriding a few
small methods and attributes, never by if-chains on a name.
During `capture`, forward hooks call back into a sink, layer by layer, with:

    sink.on_state(l, h_BTd)                         residual stream entering layer l (l = n_layers: leaving
                                                    the last layer, before the final norm)
    sink.on_keys(i, site, k_HBTD)                   keys of layer i at "k_proj" / "k_norm"
    sink.on_queries(i, "q_norm", q_HBTD)            (if the sink has it, and the model a q_norm) its output
    sink.on_attention(i, q_BHTD, k_BKTD, v, scaling, window, softcap) -> output [B, T, H, Dv] or None

Attention of Hugging Face models: inside `capture` only, the attention function of the model's own
implementation (sdpa, flash_attention_2, eager, ...) is wrapped, so the sink receives the post-RoPE q
and k exactly as the model's attention uses them (its own scaling, sliding window and soft-cap
arguments). When the sink returns an output, the model uses it (the inspection computes attention
blockwise itself: no [T, T] matrix of all heads is kept); when it returns None, the model's own
implementation computes the output as it always does (the training-time probe: the model keeps its
SDPA or flash attention and never falls back to eager). The wrapper is an entry of transformers'
attention registry for the implementation's name, set and removed by `capture`: while it is set, another
model of the process using that implementation passes through it untouched (no two captures at once).
This project's MinimalLLM gets q/k from its hook points (hook_q_rope, hook_k_rope) and keeps its own
SDPA output.

The package: base.py (the interface, InspectError), hf.py (HFAdapter: the Llama layout, which llama, mistral and
qwen2 read unchanged, the config checks and `capture` every Hugging Face family shares), llama_like.py (qwen3, apertus,
arcee, olmo2, gemma3: a few of its attributes changed), gpt2.py, gpt_neox.py; own_adapter.py: this project's model.
Other modules import from `research.access.adapters` only.
"""
from __future__ import annotations

from research.access.adapters.base import DEFAULT_ATTN, Adapter, InspectError
from research.access.adapters.gpt2 import GPT2Adapter
from research.access.adapters.gpt_neox import GPTNeoXAdapter
from research.access.adapters.hf import HFAdapter
from research.access.adapters.llama_like import ApertusAdapter, ArceeAdapter, Gemma3Adapter, Olmo2Adapter, Qwen3Adapter

__all__ = ["ADAPTERS", "DEFAULT_ATTN", "Adapter", "ApertusAdapter", "ArceeAdapter", "GPT2Adapter", "GPTNeoXAdapter",
           "Gemma3Adapter", "HFAdapter", "InspectError", "Olmo2Adapter", "Qwen3Adapter"]

# model_type -> adapter. Tested: llama, qwen3, gemma3_text, gpt2, gpt_neox, and apertus and arcee
# (tests/research/export); mistral, qwen2 and olmo2 share a tested layout and are accepted.
ADAPTERS: dict[str, type[HFAdapter]] = {
    "llama": HFAdapter, "mistral": HFAdapter, "qwen2": HFAdapter, "qwen3": Qwen3Adapter, "olmo2": Olmo2Adapter,
    "gemma3_text": Gemma3Adapter, "gpt2": GPT2Adapter, "gpt_neox": GPTNeoXAdapter, "apertus": ApertusAdapter,
    "arcee": ArceeAdapter}
