"""The pretrained-model tour (the Llama 2 7B write-up): adapters (one class per model family),
loading (local folder, hub id, or a training folder of this project) and the tour itself."""
from research.inspection.adapters import ADAPTERS, Adapter, InspectError, OwnAdapter
from research.inspection.loading import load_model
from research.inspection.tour import DEFAULT_PROMPT, inspect_model

__all__ = ["ADAPTERS", "Adapter", "DEFAULT_PROMPT", "InspectError", "OwnAdapter", "inspect_model", "load_model"]
