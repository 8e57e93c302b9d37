"""--shard fsdp: FSDP2 (fully_shard) over 2 CPU processes on gloo, which torch 2.13's CPU build supports.

Against the same run in one process (no sharding): the same global batches and initial weights; what differs
is the order of floating-point sums (half-batch gradients reduce-scattered, Muon's updates gathered from
shards, the norm of sharded gradients). Measured here over 6 steps with 2 micro-batches each: the largest
loss difference 4.8e-7 (losses ~6: one float32 rounding step there), the probe's participation ratios within
8.9e-8 relative, validation losses 1.1e-7 relative. The runs are deterministic on one machine, so the test
allows ten times what was measured (5e-6 on losses, 1e-6 on the ratios): room for another CPU's kernels,
not for an error in the sharded update, which would show at the first step (Muon's steps are ~1e-2).
"""
from __future__ import annotations

import pytest

from configs import get_preset
from models import MinimalLLM
from research.results import load_results
from tests.helpers import STEP_TOKENS, losses, run_train_llm
from training.checkpoint import list_checkpoints, load_model_weights

STEPS = 6


def _common(corpus_file, cache_dir, steps):
    return ["--preset", "debug", "--source", "files", "--paths", str(corpus_file), "--cache_dir", str(cache_dir),
            "--precision", "fp32", "--tokens", str(steps * STEP_TOKENS * 2), "--grad_accum", "2", "--no-progress",
            "--eval_batches", "2", "--probe-every", "3", "--ckpt_every", "3", "--device", "cpu"]




@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_file, cache_dir):
    root = tmp_path_factory.mktemp("fsdp")
    run_train_llm([*_common(corpus_file, cache_dir, STEPS), "--out", str(root / "one")], 1)
    run_train_llm([*_common(corpus_file, cache_dir, STEPS), "--shard", "fsdp", "--out", str(root / "two")], 2)
    return root


def test_fsdp_follows_the_single_process_curve_and_probes(runs):
    one, two = losses(runs / "one"), losses(runs / "two")
    assert len(one) == len(two) == STEPS
    assert max(abs(a - b) for a, b in zip(one, two)) < 5e-6
    # rank 0 probed its unsharded copy
    a, b = load_results(runs / "one" / "results.json"), load_results(runs / "two" / "results.json")
    assert a["steps"] == b["steps"] == [0, 3, 6]
    assert a["layer_pr"].keys() == b["layer_pr"].keys()
    for layer in a["layer_pr"]:
        assert b["layer_pr"][layer] == pytest.approx(a["layer_pr"][layer], rel=1e-6)
    assert b["gain_ablation"]  # the final ablation ran on the copy too


def test_fsdp_checkpoints_hold_whole_tensors_and_resume(runs, tmp_path, corpus_file, cache_dir):
    ckpt = list_checkpoints(runs / "two" / "checkpoints")[-1]
    load_model_weights(ckpt.path, MinimalLLM(get_preset("debug").model))  # an unsharded model loads it
    half = tmp_path / "half"
    run_train_llm([*_common(corpus_file, cache_dir, STEPS // 2), "--shard", "fsdp", "--out", str(half)], 2)
    run_train_llm([*_common(corpus_file, cache_dir, STEPS), "--shard", "fsdp", "--out", str(half), "--resume"], 2)
    assert losses(half) == losses(runs / "two")


def test_fsdp_needs_several_processes(capsys, corpus_file, cache_dir, tmp_path):
    import train_llm
    with pytest.raises(SystemExit, match="--shard fsdp divides the model over processes: launch with torchrun"):
        train_llm.main([*_common(corpus_file, cache_dir, STEPS), "--shard", "fsdp", "--out", str(tmp_path / "x")])
