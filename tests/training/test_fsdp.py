"""--shard fsdp: FSDP2 (fully_shard) over 2 CPU processes on gloo, which torch 2.13's CPU build supports.

Against the same run in one process (no sharding), both sides in the same precision (--precision pins it, and
with it Muon's orthogonalization dtype: optimizers.split.MUON_DTYPE): the same global batches and initial weights;
what differs is the order of floating-point sums (half-batch gradients reduce-scattered, Muon's updates gathered
from shards, the norm of sharded gradients). Tolerances: tests/tolerances.py, CURVE_REL_TOL (its derivation is
there). Measured on a 2-core AMD EPYC with AVX512-BF16 over 6 steps of 2 micro-batches: fp32 losses within 4.8e-7
(7.6e-8 relative), participation ratios within 9.3e-8 relative; bf16 losses within 3.3e-4 (5.5e-5 relative),
ratios within 4.4e-4 relative.
"""
from __future__ import annotations

import pytest

from configs import get_preset
from models import MinimalLLM
from research.results import load_results
from tests.helpers import STEP_TOKENS, losses, run_train_llm, stops, train_lines
from tests.tolerances import CURVE_REL_TOL
from training.checkpoint import list_checkpoints, load_model_weights

STEPS = 6


def _common(corpus_file, cache_dir, steps, precision="fp32"):
    return ["--preset", "debug", "--source", "files", "--paths", str(corpus_file), "--cache_dir", str(cache_dir),
            "--precision", precision, "--tokens", str(steps * STEP_TOKENS * 2), "--grad_accum", "2", "--no_progress",
            "--eval_batches", "2", "--probe_every", "3", "--ckpt_every", "3", "--device", "cpu"]




def _one_and_sharded(root, corpus_file, cache_dir, precision):
    """The same 6-step run in one process (root/one) and sharded over 2 processes (root/two)."""
    run_train_llm([*_common(corpus_file, cache_dir, STEPS, precision), "--out", str(root / "one")], 1)
    run_train_llm([*_common(corpus_file, cache_dir, STEPS, precision), "--shard", "fsdp", "--out", str(root / "two")],
                  2)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_file, cache_dir):
    return _one_and_sharded(tmp_path_factory.mktemp("fsdp"), corpus_file, cache_dir, "fp32")


def _assert_same_curve_and_probes(root, precision):
    one, two = losses(root / "one"), losses(root / "two")
    assert len(one) == len(two) == STEPS
    assert two == pytest.approx(one, rel=CURVE_REL_TOL[precision])
    # rank 0 probed its unsharded copy (the probe itself computes in fp32 on both sides)
    a, b = load_results(root / "one" / "results.json"), load_results(root / "two" / "results.json")
    assert a["steps"] == b["steps"] == [0, 3, 6]
    assert a["layer_pr"].keys() == b["layer_pr"].keys()
    for layer in a["layer_pr"]:
        assert b["layer_pr"][layer] == pytest.approx(a["layer_pr"][layer], rel=CURVE_REL_TOL[precision])
    assert b["gain_ablation"]  # the final ablation ran on the copy too


@pytest.mark.slow
def test_fsdp_follows_the_single_process_curve_and_probes(runs):
    _assert_same_curve_and_probes(runs, "fp32")  # both runs fp32 (pinned)


@pytest.mark.slow
def test_fsdp_in_bf16_follows_the_single_process_curve_within_bf16_rounding(tmp_path, corpus_file, cache_dir):
    """The bf16 path (autocast and bf16 Muon, both runs), native or emulated depending on the CPU."""
    _assert_same_curve_and_probes(_one_and_sharded(tmp_path, corpus_file, cache_dir, "bf16"), "bf16")


@pytest.mark.slow
def test_fsdp_with_the_optimizer_variants_follows_the_single_process_curve(tmp_path, corpus_file, cache_dir):
    """W_q and W_k in an AdamW group of their own (sharded moments) and Moonlight's Muon scale, which takes each
    matrix's whole shape under FSDP: no restriction between these fields and --shard fsdp."""
    variants = ["--qk_optimizer", "adamw", "--qk_lr_multiplier", "0.5", "--muon_update_scale", "match_rms_adamw",
                "--muon_lr", "0.005"]
    run_train_llm([*_common(corpus_file, cache_dir, STEPS), *variants, "--out", str(tmp_path / "one")], 1)
    run_train_llm([*_common(corpus_file, cache_dir, STEPS), *variants, "--shard", "fsdp", "--out",
                   str(tmp_path / "two")], 2)
    _assert_same_curve_and_probes(tmp_path, "fp32")  # both runs fp32 (pinned)


@pytest.mark.slow
def test_fsdp_checkpoints_hold_whole_tensors_and_resume(runs, tmp_path, corpus_file, cache_dir):
    ckpt = list_checkpoints(runs / "two" / "checkpoints")[-1]
    load_model_weights(ckpt.path, MinimalLLM(get_preset("debug").model))  # an unsharded model loads it
    half = tmp_path / "half"
    run_train_llm([*_common(corpus_file, cache_dir, STEPS // 2), "--shard", "fsdp", "--out", str(half)], 2)
    run_train_llm([*_common(corpus_file, cache_dir, STEPS), "--shard", "fsdp", "--out", str(half), "--resume"], 2)
    assert losses(half) == losses(runs / "two")


def test_fsdp_needs_several_processes(capsys, corpus_file, cache_dir, tmp_path):
    import train_llm
    argv = [*_common(corpus_file, cache_dir, STEPS), "--shard", "fsdp", "--out", str(tmp_path / "x")]
    assert "--shard fsdp divides the model over processes: launch with torchrun" in stops(capsys, train_llm.main, argv)


@pytest.mark.slow
def test_fsdp_telemetry_follows_the_single_process_one(runs):
    """update_rms from each rank's shards (one all-reduce) and key_norm over both ranks' tokens: the single process's
    values up to the order of sums; logit_max samples each rank's first sequences, so only its shape is the same."""
    one, two = train_lines(runs / "one"), train_lines(runs / "two")
    for a, b in zip(one, two, strict=True):
        assert b["key_norm"] == pytest.approx(a["key_norm"], rel=CURVE_REL_TOL["fp32"])
        for group in ("muon", "adamw"):
            assert b["update_rms"][group] == pytest.approx(a["update_rms"][group], rel=1e-4)
        assert len(b["logit_max"]) == len(a["logit_max"])
