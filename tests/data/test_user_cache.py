"""The data cache: the user cache by default, wherever a run starts; a run's cache may move (resume included)."""
from __future__ import annotations

import json

import train_llm
from tests.helpers import STEP_TOKENS


def _argv(corpus_file, out, steps: int, *extra) -> list[str]:
    return ["--preset", "debug", "--source", "files", "--paths", str(corpus_file), "--precision", "fp32",
            "--no_progress", "--eval_batches", "2", "--probe_every", "0", "--ckpt_every", "2",
            "--tokens", str(steps * STEP_TOKENS), "--out", str(out), *extra]


def test_a_run_on_an_old_relative_cache_resumes_on_the_user_cache(corpus_file, user_cache, tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    train_llm.main(_argv(corpus_file, out, 2, "--cache_dir", ".cache/data"))  # as before: the working folder's
    old_config = tmp_path / "old_config.json"  # a resume writes config.json again
    old_config.write_text((out / "config.json").read_text())
    assert json.loads(old_config.read_text())["data"]["cache_dir"] == ".cache/data"
    assert (tmp_path / ".cache" / "data" / "tokenizers").is_dir()
    capsys.readouterr()

    summary = train_llm.main(_argv(corpus_file, out, 4, "--resume"))  # the default: the user cache
    assert summary["steps"] == 4
    log = capsys.readouterr().out
    assert "resum" in log and f"{user_cache / 'data'}" in log  # same data, another cache: the run goes on

    summary = train_llm.main(["--config", str(old_config), *_argv(corpus_file, out, 6, "--resume")])
    assert summary["steps"] == 6  # the old config.json's relative cache_dir still works
    assert "data: cache hit .cache/data/" in capsys.readouterr().out


def test_the_default_cache_is_the_user_cache_from_any_folder(debug_cfg, user_cache, tmp_path, monkeypatch):
    from data import prepare_data
    from tests.helpers import quiet
    monkeypatch.chdir(tmp_path)
    data = prepare_data(debug_cfg(cache_dir="auto"), log=quiet)
    assert data.cache_dir.parent == user_cache / "data"
    assert not (tmp_path / ".cache").exists()  # nothing in the working folder
