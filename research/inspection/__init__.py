"""The pretrained-model tour (the Llama 2 7B write-up): adapters (one class per model family),
loading (local folder, hub id, or a training folder of this project), the tour itself and its
dictionary sections (token dictionaries, input lens, head words)."""
from research.inspection.adapters import ADAPTERS, Adapter, InspectError, OwnAdapter
from research.inspection.dictionaries import DEFAULT_WORDS, DICT_SAMPLE
from research.inspection.loading import load_model
from research.inspection.tour import DEFAULT_PROMPT, inspect_model

__all__ = ["ADAPTERS", "Adapter", "DEFAULT_PROMPT", "DEFAULT_WORDS", "DICT_SAMPLE", "InspectError", "OwnAdapter",
           "inspect_model", "load_model"]
