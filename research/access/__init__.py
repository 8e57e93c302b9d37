"""Model access: the bottom floor of the research half, where a model is read, never studied.

What can be read: a training folder of this project (its config and newest checkpoint), a Hugging Face folder
or hub id, and a GGUF file (converted once into a cached Hugging Face folder). `adapters/` says where each
model family keeps its layers, q/k/v/o weights, norms and keys (one module per family, one sink interface for
the hooks; `own_adapter.py` for this project's own model); `loading.py` loads any of the three into a model,
tokenizer and adapter; `gguf.py` is the GGUF cache; `checkpoints.py` reads the training step a checkpoint was
saved at and hashes its weights.

Probing, inspection, export and the studies import this; it imports none of them (only models/, configs/,
data/, training/ and utils/ below it; tests/test_import_rules.py keeps it so).
"""
from research.access.adapters import ADAPTERS, Adapter, InspectError
from research.access.loading import load_model
from research.access.own_adapter import OwnAdapter

__all__ = ["ADAPTERS", "Adapter", "InspectError", "OwnAdapter", "load_model"]
