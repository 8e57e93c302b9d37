"""The one memory check before a model is built from a config (training.memory_fit.check_fits): the whole model
(parameters, gradients, Muon + AdamW state, activations, RoPE tables) against this machine's available memory, or a
CUDA device's free memory; a refusal gives the numbers and a fix naming the size field that costs the most, exit 2,
nothing written. Numbers checked by hand on the debug preset."""
from __future__ import annotations

import json

import pytest
import torch

import train_llm
from configs import apply_overrides, get_preset
from models.llm import MinimalLLM
from research import export_hf, inspect_pretrained
from training import memory_fit
from training.memory import GIB, param_counts
from training.memory_fit import MemoryPlanError, check_fits, host_parts, largest_fit
from tests.helpers import stops
from tests.research.inspection.builders import make_own_run
from utils.runtime import Runtime

CPU = Runtime(torch.device("cpu"), "fp32")
# debug: vocab 512, d_model 128, 2 layers, 2 heads of 64 (1 KV head), d_ff 256, learned q/k norms
EMBED = 512 * 128
BLOCK = 128 * 128 + 64 * 128 + 64 * 128 + 128 * 128 + 256 * 128 + 128 * 256  # wq wk wv wo up down (Muon)
GAINS = 2 * (128 + 128 + 64 + 64) + 128  # attn_norm, ffn_norm, q_norm, k_norm per block; the final norm


@pytest.mark.parametrize("qk_norm", ["learned", "frozen", "none"])
def test_the_parameter_count_is_that_of_the_built_model(qk_norm):
    cfg = apply_overrides(get_preset("debug"), {"qk_norm": qk_norm})
    built = sum(p.numel() for p in MinimalLLM(cfg.model).parameters())
    assert param_counts(cfg.model).total == built
    if qk_norm == "learned":
        assert built == EMBED + 2 * BLOCK + GAINS == 295_808


def test_the_host_parts_by_hand():
    cfg = get_preset("debug")
    parts = host_parts(cfg, CPU)
    assert parts["weights"] == parts["gradients"] == 4 * 295_808
    # Muon momentum over the block matrices, two AdamW moments over the embedding and the gains, and the larger
    # of the two optimizers' step temporaries
    assert parts["optimizer_state"] >= 4 * 2 * BLOCK + 8 * (EMBED + GAINS)
    # activations: at least what the blocks save of their d_model-wide tensors, 8 x 32 tokens, fp32
    assert parts["activations"] >= 2 * 8 * 32 * 4 * 128
    assert parts["rope_tables"] == 64 * (8 + 32 * 24)  # max_seq_len x the bytes per position while building
    assert host_parts(cfg, None) == {"weights": 4 * 295_808, "rope_tables": 64 * (8 + 32 * 24)}  # only built
    two = host_parts(cfg, Runtime(torch.device("cpu"), "fp32", world_size=2, local_world_size=2))
    assert two["weights"] == 2 * 4 * 295_808 and two["rope_tables"] == 2 * parts["rope_tables"]  # one per process


@pytest.mark.parametrize("option, value, fix", [
    ("d_ff", 10 ** 11, "--d_ff"), ("n_layers", 10 ** 6, "--n_layers"), ("vocab_size", 10 ** 12, "--vocab_size"),
    ("d_model", 10 ** 9, "--d_model"), ("max_seq_len", 10 ** 9, "--max_seq_len"), ("batch_size", 10 ** 6,
                                                                                   "--batch_size"),
    ("probe_batch", 10 ** 7, "--probe_batch"),  # the probe's batch is planned where the run probes: see argv
])
def test_a_model_too_large_for_this_machine_is_refused_naming_the_field(tmp_path, monkeypatch, capsys, option,
                                                                        value, fix):
    monkeypatch.setattr(memory_fit, "available_memory", lambda: 16 * GIB)
    out = tmp_path / "run"
    argv = ["--preset", "debug", "--device", "cpu", "--precision", "fp32", f"--{option}", str(value),
            "--tokens", str(10 ** 12), "--probe_every", "1", "--out", str(out)]
    line = stops(capsys, train_llm.main, argv)
    assert line.startswith("error: the model (") and "does not fit in this machine's memory: training it on cpu " \
        "needs" in line and "but 16.0 GiB is available" in line, line
    preset = get_preset("debug")
    base = getattr(getattr(preset, {"batch_size": "train", "probe_batch": "probe"}.get(option, "model")), option)
    assert f"; the largest contributor is {fix} {value:,} (the debug preset has {base:,}). Fix: {fix} " in line
    assert not out.exists()
    named = line.split(f"Fix: {fix} ")[1].split()[0]
    cfg = apply_overrides(preset, {option: value, "tokens": 10 ** 12, "probe_every": 1})
    if named[0].isdigit() and "and smaller other sizes" not in line:  # the value named fits, one more does not
        n = int(named.replace(",", ""))
        check_fits(apply_overrides(cfg, {option: n}), CPU)
        step = 2 * preset.model.n_heads if option == "d_model" else 1
        with pytest.raises(MemoryPlanError):
            check_fits(apply_overrides(cfg, {option: n + step}), CPU)


def test_the_exact_message_of_a_wide_ffn(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(memory_fit, "available_memory", lambda: 16 * GIB)
    line = stops(capsys, train_llm.main, ["--preset", "debug", "--device", "cpu", "--precision", "fp32", "--d_ff",
                                          str(10 ** 11), "--out", str(tmp_path / "run")])
    cfg = apply_overrides(get_preset("debug"), {"d_ff": 10 ** 11})
    parts = host_parts(cfg, CPU)
    fit = largest_fit(cfg, "d_ff", lambda c: sum(host_parts(c, CPU).values()), 16 * GIB)
    g = lambda n: f"{n / GIB:,.1f}"  # noqa: E731
    assert line == (f"error: the model ({param_counts(cfg.model).total:,} parameters) does not fit in this machine's "
                    f"memory: training it on cpu needs {g(sum(parts.values()))} GiB (weights {g(parts['weights'])}, "
                    f"gradients {g(parts['gradients'])}, optimizer state {g(parts['optimizer_state'])}, activations "
                    f"{g(parts['activations'])}) but 16.0 GiB is available; the largest contributor is --d_ff "
                    f"100,000,000,000 (the debug preset has 256). Fix: --d_ff {fit:,} or less (the other sizes as "
                    f"given)")


def test_a_cuda_run_no_option_fits_names_the_field(monkeypatch):
    monkeypatch.setattr(memory_fit, "available_memory", lambda: 2 ** 50)
    monkeypatch.setattr(memory_fit, "cuda_free", lambda device: (1 * GIB, 80 * GIB))
    cfg = apply_overrides(get_preset("debug"), {"d_ff": 10 ** 8})
    with pytest.raises(MemoryPlanError) as e:
        check_fits(cfg, Runtime(torch.device("cuda", 0), "bf16"))
    assert "GiB free of 80.0. the largest contributor is --d_ff 100,000,000 (the debug preset has 256). Fix: --d_ff " \
        in str(e.value)


def test_a_run_folder_whose_model_cannot_be_built_is_refused_by_the_tools_that_load_it(tmp_path, monkeypatch,
                                                                                      capsys):
    monkeypatch.setattr(memory_fit, "available_memory", lambda: 1 * GIB)
    run = make_own_run(tmp_path / "run")
    cfg = json.loads((run / "config.json").read_text())
    cfg["model"]["n_layers"] = 10 ** 6
    (run / "config.json").write_text(json.dumps(cfg))
    for main, argv in ((inspect_pretrained.main, ["--model", str(run)]),
                       (export_hf.main, [str(run), str(tmp_path / "hf")])):
        line = stops(capsys, main, argv)
        assert "does not fit in this machine's memory: building it needs" in line and "but 1.0 GiB is available; " \
            "the largest contributor is --n_layers 1,000,000 (the debug preset has 2). Fix: --n_layers " in line, line
    assert not (tmp_path / "hf").exists()
