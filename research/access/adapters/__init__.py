"""Where things are inside a causal LM: one adapter class per model family, the same interface for all.

    adapter = ADAPTERS[model_type](hf_model)      # or OwnAdapter(minimal_llm), own_adapter.py
    with adapter.capture(sink): adapter.forward(ids_BT)

The layers, q/k/v/o weights, norms' gains, query/key maps of the residual stream (`read_weights`), RoPE as data,
and `capture`, which calls back into a sink layer by layer. base.py (the interface), hf.py (the Llama layout and every
HF family's capture), llama_like.py, gpt2.py, gpt_neox.py, qwen3_5.py, gemma4.py; other modules import from here
only. docs/inspection.md, "Model access: the adapters".
"""
from __future__ import annotations

from research.access.adapters.base import DEFAULT_ATTN, Adapter, InspectError
from research.access.adapters.gemma4 import Gemma4Adapter
from research.access.adapters.gpt2 import GPT2Adapter
from research.access.adapters.gpt_neox import GPTNeoXAdapter
from research.access.adapters.hf import HFAdapter
from research.access.adapters.qwen3_5 import Qwen35Adapter
from research.access.adapters.llama_like import (ApertusAdapter, ArceeAdapter, Gemma3Adapter, Olmo2Adapter,
                                                 Olmo3Adapter, Qwen3Adapter, SmolLM3Adapter)

__all__ = ["ADAPTERS", "DEFAULT_ATTN", "Adapter", "ApertusAdapter", "ArceeAdapter", "GPT2Adapter", "GPTNeoXAdapter",
           "Gemma3Adapter", "Gemma4Adapter", "HFAdapter", "InspectError", "Olmo2Adapter", "Olmo3Adapter",
           "Qwen3Adapter", "Qwen35Adapter", "SmolLM3Adapter"]

# model_type -> adapter. Tested: llama, qwen3, gemma3_text, gpt2, gpt_neox, and apertus and arcee
# (tests/research/export); olmo3, smollm3, qwen3_5_text and gemma4_text (tests/research/access/test_2026_layouts.py);
# mistral, qwen2 and olmo2 share a tested layout and are accepted (qk-audit's clean tests run all of them).
ADAPTERS: dict[str, type[HFAdapter]] = {
    "llama": HFAdapter, "mistral": HFAdapter, "qwen2": HFAdapter, "qwen3": Qwen3Adapter, "olmo2": Olmo2Adapter,
    "gemma3_text": Gemma3Adapter, "gpt2": GPT2Adapter, "gpt_neox": GPTNeoXAdapter, "apertus": ApertusAdapter,
    "arcee": ArceeAdapter, "olmo3": Olmo3Adapter, "smollm3": SmolLM3Adapter, "qwen3_5_text": Qwen35Adapter,
    "gemma4_text": Gemma4Adapter}
