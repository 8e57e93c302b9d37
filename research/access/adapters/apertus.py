"""Apertus: the Llama layout with a q_norm / k_norm per head before RoPE (research/export_hf.py writes it for the
runs with qk_norm learned or frozen)."""
from __future__ import annotations

from research.access.adapters.hf import HFAdapter


class ApertusAdapter(HFAdapter):
    """Apertus: per-head q_norm / k_norm before RoPE (the export of qk_norm learned/frozen runs)."""

    family = "apertus"
