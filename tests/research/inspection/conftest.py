"""Tiny models of each family, built once per session, and their inspections."""
from __future__ import annotations

import pytest

from research.access import load_model
from research.inspection import inspect_model
from tests.research.inspection.builders import FAMILIES, PROMPT, make_hf_model, make_own_run

WORDS = ["cat", "dog", "sun", "sky", "king", "cat"]  # king: unknown to the tokenizer; cat: a repeat


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    dirs = {f: make_hf_model(f, root / f) for f in FAMILIES if f != "own"}
    dirs["own"] = make_own_run(root / "own")
    return dirs


@pytest.fixture(scope="session")
def results(model_dirs):
    """{family: (model, tokenizer, adapter, inspect.json dict)}; tests must not modify the models."""
    out = {}
    for f, d in model_dirs.items():
        model, tok, adapter = load_model(str(d))
        out[f] = (model, tok, adapter, inspect_model(adapter, tok, PROMPT, positions=[-1, 3], top_k=4,
                                                     words=WORDS, head_layer=1))
    return out
