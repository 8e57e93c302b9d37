"""Models that cannot work as given, refused where they load (research/access), one line naming the model, the
values and the fix, exit 2, for every tool: attention heads that do not divide, a head without a size, no context;
a window longer than the context (the fine-tuning study as the checkpoint study); missing or cut-off files; a GGUF of
a family no adapter reads, refused before any conversion; --steps against a checkpoint's own record; --revisions
with a local folder."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from research import checkpoint_keys_study, finetune_keys_study, inspect_pretrained, pretrained_keys_study
from research.access import InspectError, load_model
from research.probing.hf import ProbeError, record_keys
from tests.helpers import stops
from tests.research.inspection.builders import SENTENCES, make_hf, make_hf_model

FIX = ("the model's config.json is damaged or describes a model transformers cannot run: restore it, or pass another "
       "model")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A tiny Qwen3 folder (q/k norms, context 128) and a tiny GPT-2 folder, each with its tokenizer."""
    root = tmp_path_factory.mktemp("good")
    return {f: make_hf_model(f, root / f) for f in ("qwen3", "gpt2")}


def _edited(good, tmp_path, family, **fields):
    """A copy of a good folder whose config.json has `fields` changed."""
    d = tmp_path / f"{family}-edited"
    shutil.copytree(good[family], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(fields)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _written(folder):
    return sorted(p.name for p in folder.rglob("*") if p.name != ".lock") if folder.exists() else []


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(" ".join(SENTENCES * 40))
    return path


# ---------------------------------------------------------------- the structure, checked where a model loads

def test_heads_not_a_multiple_of_kv_heads_are_refused_by_every_tool(good, tmp_path, text_file, capsys):
    d = _edited(good, tmp_path, "qwen3", num_attention_heads=6, num_key_value_heads=4)
    line = (f"error: {d}: num_attention_heads = 6 is not a multiple of num_key_value_heads = 4 (each key/value head "
            f"serves the same number of query heads), so its attention cannot run; {FIX}")
    measure = ["--text", str(text_file), "--batches", "2", "--batch", "2", "--seq_len", "16"]
    assert stops(capsys, inspect_pretrained.main, ["--model", str(d), "--out", str(tmp_path / "i")]) == line
    assert stops(capsys, pretrained_keys_study.main, ["--models", str(d), *measure, "--out",
                                                      str(tmp_path / "p")]) == line
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copytree(d, ckpt / "a")
    shutil.copytree(d, ckpt / "b")
    line_a = line.replace(str(d), str(ckpt / "a"))
    assert stops(capsys, checkpoint_keys_study.main, ["--checkpoints", str(ckpt / "a"), str(ckpt / "b"), "--steps",
                                                      "1", "2", *measure, "--out", str(tmp_path / "c")]) == line_a
    assert stops(capsys, finetune_keys_study.main, ["--model", str(d), "--seeds", "0", "1", "--tokens", "256",
                                                    "--batch_size", "2", "--seq_len", "16", "--device", "cpu",
                                                    "--out", str(tmp_path / "f")]) == line
    for out in "ipcf":  # refused before anything was written (a lock left in a new --out: issue 39's U3)
        assert _written(tmp_path / out) == []


@pytest.mark.parametrize("family, fields, problem", [
    ("gpt2", {"n_head": 5}, "n_embd = 64 is not divisible by n_head = 5, and no head_dim is given, so a head has no "
                            "whole size"),
    ("qwen3", {"num_key_value_heads": 0}, "num_key_value_heads = 0 should be a whole number >= 1"),
    ("qwen3", {"head_dim": -16}, "head_dim = -16 should be a whole number >= 1"),
    ("qwen3", {"max_position_embeddings": 0}, "max_position_embeddings = 0 should be the context length, a whole "
                                              "number >= 1"),
    ("gpt2", {"n_positions": 0}, "n_positions = 0 should be the context length, a whole number >= 1"),
])
def test_a_structure_that_cannot_run_is_named_before_any_weight_is_read(good, tmp_path, family, fields, problem):
    d = _edited(good, tmp_path, family, **fields)
    with pytest.raises(InspectError) as e:
        load_model(str(d))
    assert str(e.value) == f"{d}: {problem}; {FIX}"


def test_the_probe_api_refuses_a_model_whose_structure_or_context_does_not_fit(tmp_path):
    model = make_hf("qwen3")
    ids = torch.randint(3, 30, (2, 16))
    model.config.num_key_value_heads = 3
    with pytest.raises(ProbeError) as e:
        record_keys(tmp_path / "r.json", model, ids, step=0, tokens=0)
    assert str(e.value) == (f"the qwen3 model: num_attention_heads = 4 is not a multiple of num_key_value_heads = 3 "
                            f"(each key/value head serves the same number of query heads), so its attention cannot "
                            f"run; {FIX}")
    model.config.num_key_value_heads, model.config.head_dim = 2, 8  # the weights hold heads of 16
    with pytest.raises(ProbeError, match=r"^the qwen3 model: layer 0's q projection has 64 rows, not 4 heads x "
                                         r"head_dim 8 = 32 as its config says. Fix: restore the model's folder"):
        record_keys(tmp_path / "r.json", model, ids, step=0, tokens=0)
    model.config.head_dim = 16
    with pytest.raises(ProbeError) as e:
        record_keys(tmp_path / "r.json", model, torch.randint(3, 30, (1, 130)), step=0, tokens=0)
    assert str(e.value) == ("the probe batch's windows of 130 tokens (probe_ids_BT's length) are longer than the "
                            "context of ? (max_position_embeddings = 128): pass probe_ids_BT's length 128 or less")
    assert not (tmp_path / "r.json").exists()


# ---------------------------------------------------------------- the context, one check for every tool

def test_the_finetune_study_refuses_windows_beyond_the_context_as_the_checkpoint_study(good, tmp_path, capsys):
    out = tmp_path / "f"
    line = stops(capsys, finetune_keys_study.main, ["--model", str(good["qwen3"]), "--seeds", "0", "1", "--tokens",
                                                    "800", "--batch_size", "2", "--seq_len", "200", "--device", "cpu",
                                                    "--out", str(out)])
    assert line == (f"error: windows of 200 tokens (--seq_len) are longer than the context of {good['qwen3']} "
                    f"(max_position_embeddings = 128): pass --seq_len 128 or less")
    assert _written(out) == []


# ---------------------------------------------------------------- files: missing, cut off

def test_a_folder_without_tokenizer_files_names_them(good, tmp_path, capsys):
    d = tmp_path / "notok"
    shutil.copytree(good["qwen3"], d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink()
    assert stops(capsys, inspect_pretrained.main, ["--model", str(d)]) == (
        f"error: {d} has no tokenizer files (none of tokenizer.json, tokenizer.model, vocab.json + merges.txt, "
        f"vocab.txt): copy the model's tokenizer into it (tokenizer.save_pretrained(\"{d}\")), or pass the folder "
        f"that holds them")
    (d / "model.safetensors").unlink()
    assert stops(capsys, inspect_pretrained.main, ["--model", str(d)]) == (
        f"error: {d} has no weights file (model.safetensors, or pytorch_model.bin): copy the model's weights into it "
        f"(model.save_pretrained(\"{d}\")), or pass the folder that holds them")


@pytest.mark.parametrize("keep, problem", [
    (0.5, "{size:,} bytes, where its header lists tensors up to byte {full:,}"),
    (100, "100 bytes, fewer than its header needs"),
    (3, "3 bytes, fewer than its header needs"),
])
def test_a_cut_off_safetensors_file_is_named_with_the_fix(good, tmp_path, capsys, keep, problem):
    d = tmp_path / "cut"
    shutil.copytree(good["gpt2"], d)
    f = d / "model.safetensors"
    data = f.read_bytes()
    size = int(len(data) * keep) if keep < 1 else keep
    f.write_bytes(data[:size])
    ckpt = [str(d), str(good["gpt2"]), "--steps", "1", "2"]
    assert stops(capsys, checkpoint_keys_study.main, ["--checkpoints", *ckpt, "--out", str(tmp_path / "o")]) == (
        f"error: {f} is damaged or cut off ({problem.format(size=size, full=len(data))}): copy or download the model "
        f"again (an interrupted copy or download leaves such a file)")
    assert not (tmp_path / "o" / "checkpoint_keys.json").exists()


def test_a_damaged_safetensors_header_is_named(good, tmp_path):
    d = tmp_path / "bad"
    shutil.copytree(good["gpt2"], d)
    f = d / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:12] = b"\xff\xfe{["
    f.write_bytes(bytes(data))
    with pytest.raises(InspectError, match=r"model\.safetensors is damaged or cut off \(its header is not readable\)"):
        load_model(str(d))


# ---------------------------------------------------------------- GGUF: refused before any conversion

def _gguf(path, arch, **settings):
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in settings.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_tensor("token_embd.weight", torch.zeros(4, 2).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _no_conversion(monkeypatch):
    import transformers
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the GGUF file was converted before it was refused"))


def test_a_gguf_family_without_an_adapter_is_refused_before_conversion(tmp_path, monkeypatch, capsys):
    _no_conversion(monkeypatch)
    path = _gguf(tmp_path / "phi.gguf", "phi3", **{"attention.head_count": 4, "attention.head_count_kv": 4})
    cache = tmp_path / "cache"
    assert stops(capsys, inspect_pretrained.main, ["--model", str(path), "--cache_dir", str(cache)]) == (
        "error: phi.gguf: architecture 'phi3' (model type 'phi3') has no adapter in research/access/adapters/ "
        "(nothing was converted). Fix: pass a model of apertus, arcee, gemma3_text, gemma4_text, gpt2, gpt_neox, "
        "llama, mistral, olmo2, olmo3, qwen2, qwen3, qwen3_5_text, smollm3, or add an adapter for it")
    assert not (cache / "hf-from-gguf").exists() or not any((cache / "hf-from-gguf").iterdir())


def test_a_gguf_whose_heads_do_not_divide_is_refused_before_conversion(tmp_path, monkeypatch):
    _no_conversion(monkeypatch)
    path = _gguf(tmp_path / "odd.gguf", "llama", **{"attention.head_count": 6, "attention.head_count_kv": 4,
                                                   "embedding_length": 96, "context_length": 64})
    with pytest.raises(InspectError) as e:
        load_model(str(path), cache_dir=tmp_path / "cache", log=lambda s: None)
    assert str(e.value) == ("odd.gguf (its GGUF settings, as a Hugging Face config): num_attention_heads = 6 is not a "
                            "multiple of num_key_value_heads = 4 (each key/value head serves the same number of query "
                            f"heads), so its attention cannot run; {FIX}")


# ---------------------------------------------------------------- checkpoints: steps and revisions

def _exports(good, tmp_path, steps, record="export.json"):
    dirs = []
    for i, step in enumerate(steps):
        d = tmp_path / f"ck{i}"
        shutil.copytree(good["gpt2"], d)
        field = "step" if record == "export.json" else "global_step"
        (d / record).write_text(json.dumps({field: step}))
        dirs.append(str(d))
    return dirs


@pytest.mark.parametrize("record", ["export.json", "trainer_state.json"])
def test_steps_that_contradict_the_recorded_ones_are_refused_naming_both(good, tmp_path, capsys, record):
    dirs = _exports(good, tmp_path, (100, 200, 300), record)
    out = tmp_path / "o"
    line = stops(capsys, checkpoint_keys_study.main, ["--checkpoints", *dirs, "--steps", "300", "200", "100",
                                                      "--out", str(out)])
    assert line == (f"error: --steps contradicts the steps the checkpoints record (ck0: --steps gives 300, its "
                    f"{record} records 100; ck2: --steps gives 100, its {record} records 300): leave out --steps to "
                    f"take the recorded steps, or correct the file that is wrong")
    assert _written(out) == []


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_revisions_with_a_local_checkpoint_say_revisions_are_for_hub_ids(good, tmp_path, capsys, kind):
    name = str(good["gpt2"]) if kind == "folder" else str(good["gpt2"] / "config.json")
    with pytest.raises(SystemExit) as e:
        checkpoint_keys_study.main(["--checkpoints", name, "--revisions", "step1", "step2"])
    assert e.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(
        f"error: --revisions applies to hub ids, and {name} is a local {kind}: pass each local checkpoint as its own "
        f"entry of --checkpoints, without --revisions")
