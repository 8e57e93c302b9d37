"""The pretrained-model tour (the Llama 2 7B write-up) and the key study on text windows: the tour itself and
its dictionary sections (token dictionaries, input lens, head words). Loading the models (a local folder, a hub
id, a GGUF file or a training folder of this project) and the adapters are model access (research.access)."""
from research.inspection.dictionaries import DEFAULT_WORDS, DICT_SAMPLE
from research.inspection.tour import DEFAULT_PROMPT, inspect_model

__all__ = ["DEFAULT_PROMPT", "DEFAULT_WORDS", "DICT_SAMPLE", "inspect_model"]
