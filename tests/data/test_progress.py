"""--no_progress: no progress bar of datasets, huggingface_hub or transformers either (utils.progress)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import train_llm
from tests.helpers import REPO, STEP_TOKENS
from utils.progress import library_progress, quiet_imported

pytestmark = pytest.mark.skipif(any(os.environ.get(v) for v in ("HF_DATASETS_DISABLE_PROGRESS_BARS",
                                                                "HF_HUB_DISABLE_PROGRESS_BARS")),
                                reason="the environment sets the libraries' bars itself")


def _jsonl(path, corpus_file, salt: str):
    """The corpus as JSON lines, one document per paragraph; `salt` makes it a corpus no test has cached."""
    docs = [d for d in corpus_file.read_text().split("\n\n") if d.strip()]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in [salt, *docs]))
    return path


def _run(jsonl, cache_dir, out, *extra):
    train_llm.main(["--preset", "debug", "--source", "files", "--paths", str(jsonl), "--cache_dir", str(cache_dir),
                    "--precision", "fp32", "--eval_batches", "2", "--probe_every", "0", "--ckpt_every", "0",
                    "--tokens", str(STEP_TOKENS), "--out", str(out), *extra])


def test_no_progress_draws_no_library_bar(corpus_file, cache_dir, tmp_path, capsys):
    _run(_jsonl(tmp_path / "a.jsonl", corpus_file, "no bars"), cache_dir, tmp_path / "quiet", "--no_progress")
    err = capsys.readouterr().err
    assert "Generating train split" not in err and "%|" not in err and "it/s]" not in err, err[-2000:]
    _run(_jsonl(tmp_path / "b.jsonl", corpus_file, "bars"), cache_dir, tmp_path / "drawn")  # what the switch stops
    err = capsys.readouterr().err
    assert "Generating train split" in err and "train: 100%" in err


def test_the_switch_turns_the_bars_off_in_its_block_and_back_on_after():
    import datasets
    from huggingface_hub import utils as hub
    from transformers.utils import logging as tf_logging
    on = lambda: (datasets.is_progress_bar_enabled(), not hub.are_progress_bars_disabled(),  # noqa: E731
                  tf_logging.is_progress_bar_enabled())
    assert on() == (True, True, True)
    with library_progress(False):
        assert on() == (False, False, False)
        with library_progress(False):
            quiet_imported()
            assert on() == (False, False, False)
        assert on() == (False, False, False)  # the outer block still holds
    assert on() == (True, True, True)
    with library_progress(True):
        assert on() == (True, True, True)
    quiet_imported()  # outside a block: nothing
    assert on() == (True, True, True)


def test_the_switch_imports_no_datasets():
    code = ("import sys\nfrom utils.progress import library_progress\nwith library_progress(False):\n    pass\n"
            "print('datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"  # 0.6 s a cached run never spends (data/corpus.py calls quiet_imported)
