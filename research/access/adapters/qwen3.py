"""Qwen3: the Llama layout with a q_norm / k_norm per head before RoPE."""
from __future__ import annotations

from research.access.adapters.hf import HFAdapter


class Qwen3Adapter(HFAdapter):
    family = "qwen3"
