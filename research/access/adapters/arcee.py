"""Arcee: Llama attention with a non-gated MLP (research/export_hf.py writes it for the runs with qk_norm none)."""
from __future__ import annotations

from research.access.adapters.hf import HFAdapter


class ArceeAdapter(HFAdapter):
    """Arcee: Llama attention with a non-gated MLP (the export of qk_norm='none' runs)."""

    family = "arcee"
