"""Model access: the bottom floor of the research half, where a model is read, never studied.

What can be read: a training folder of this project, a Hugging Face folder or hub id, and a GGUF file (converted
once into a cached Hugging Face folder). `adapters/` says where each family keeps its layers, weights, norms and keys
(`own_adapter.py`: this project's own model); `loading.py` loads any of the three into a model, tokenizer and
adapter; `gguf.py` is the GGUF cache; `checkpoints.py` reads a checkpoint's step and hashes its weights. Probing,
inspection, export and the studies import this; it imports none of them (tests/test_import_rules.py).
"""
from research.access.adapters import ADAPTERS, Adapter, InspectError
from research.access.loading import load_model
from research.access.own_adapter import OwnAdapter

__all__ = ["ADAPTERS", "Adapter", "InspectError", "OwnAdapter", "load_model"]
