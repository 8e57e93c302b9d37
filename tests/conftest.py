"""Shared fixtures: a small offline text corpus and tiny run configs."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from configs import apply_overrides, get_preset


def pytest_report_header(config):
    """Which precision this host trains in (tests that compare numbers pin theirs or derive their tolerance from
    it: tests/tolerances.py)."""
    import torch

    from utils.runtime import cpu_has_native_bf16, cpu_name, resolve_precision
    native = cpu_has_native_bf16()
    return (f"cpu: {cpu_name()}, native bf16 (AVX512-BF16/AMX): {'yes' if native else 'no'}; --precision auto "
            f"picks {resolve_precision('auto', torch.device('cpu'))} on CPU; torch {torch.__version__}")

# Twelve modules of CPython 3.11.7's standard library, shipped (tests/fixtures/corpus/make_corpus.py wrote it):
# real code text, 110,958 characters, the same bytes on every Python and machine.
CORPUS = Path(__file__).parent / "fixtures" / "corpus" / "corpus.txt"


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    """A copy of the shipped corpus in a folder of its own (tests may put files beside it)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    shutil.copyfile(CORPUS, path)
    return path


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory) -> Path:
    """The user cache (utils.cache) of this session: QK_KEYS_CACHE points at a temporary folder for every test
    and every process a test starts, so no test reads or writes the real ~/.cache/qk-keys."""
    root = tmp_path_factory.mktemp("user_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QK_KEYS_CACHE", str(root))
        yield root


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One folder of converted real models (research.access.gguf) for the session: each converts once."""
    return tmp_path_factory.mktemp("converted-models")


@pytest.fixture(scope="session")
def cache_dir(user_cache) -> Path:
    """The data cache every test shares (tests pass it as --cache_dir, and the default "auto" names it too), so
    a corpus is prepared once per session."""
    folder = user_cache / "data"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture
def debug_cfg(corpus_file, cache_dir):
    """The debug preset on the small corpus: 2 layers, d_model 128, vocab 512, 32-token blocks."""
    def make(**overrides):
        base = {"source": "files", "paths": [str(corpus_file)], "cache_dir": str(cache_dir),
                "precision": "fp32", "eval_batches": 2}
        return apply_overrides(get_preset("debug"), {**base, **overrides})
    return make


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory, corpus_file, cache_dir) -> Path:
    """A 6-step debug run through train_llm.py, never interrupted: what every recovered run must equal."""
    import train_llm
    from tests.helpers import cli_args
    out = tmp_path_factory.mktemp("straight") / "run"
    train_llm.main(cli_args(corpus_file, cache_dir, out, 6))
    return out
