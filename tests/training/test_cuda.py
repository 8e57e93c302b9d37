"""CUDA paths: bf16 autocast, fused AdamW, compile. Skipped where there is no GPU."""
import math

import pytest
import torch

from tests.helpers import STEP_TOKENS, build_trainer, losses
from tests.tolerances import forward_rel_tol, ulps

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_cuda_training_picks_bf16_and_fused_adamw(debug_cfg, tmp_path):
    t = build_trainer(debug_cfg(tokens=4 * 8 * 32, precision="auto", device="auto"), tmp_path)
    assert t.device.type == "cuda" and t.precision == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
    adamw = [o for o in t.optimizers if isinstance(o, torch.optim.AdamW)][0]
    assert adamw.defaults["fused"] is True
    summary = t.fit()
    assert summary["steps"] == 4 and summary["final_loss"] < 7.0


def test_probe_on_cuda_matches_cpu(debug_cfg):
    from models import MinimalLLM
    from research.probing.probe import KeyProbe
    torch.manual_seed(0)
    model = MinimalLLM(debug_cfg().model)
    ids = torch.randint(0, 512, (2, 16))
    cpu = KeyProbe(ids)(model)
    gpu = KeyProbe(ids)(model.cuda())
    for a, b in zip(cpu["layers"], gpu["layers"]):
        assert a["k_norm"]["pr_sv"] == pytest.approx(b["k_norm"]["pr_sv"], rel=1e-4)
        assert a["attn"]["entropy"] == pytest.approx(b["attn"]["entropy"], rel=1e-4)


def test_gpu_benchmark_measures_the_trainers_step():
    from research.speed.gpu import measure
    r = measure("debug", 2, {"precision": "bf16"}, ceiling=1e15)
    assert r["compiled"] is False and r["precision"] == "bf16" and r["tokens_per_s"] > 0
    assert 0 < r["muon_share"] < 1 and r["peak_train_gib"] > 0 and r["probe_s"] > 0


def _run(cfg, out, resume=False) -> list[float]:
    build_trainer(cfg, out, resume=resume).fit()
    return losses(out)


def test_compiled_and_eager_agree_over_100_steps_on_cuda(debug_cfg, tmp_path):
    """The same 100 bf16 steps compiled and eager: other kernels, other orders of sums, so the curves part by
    rounding that training carries on. Held to 4 bf16 ulps a step, relative (2^-5), a bound not yet measured on a
    GPU; where it fails, the assertion's message names the largest gap."""
    cfg = lambda c: debug_cfg(tokens=100 * STEP_TOKENS, device="cuda", precision="bf16", compile=c)  # noqa: E731
    eager, compiled = _run(cfg("off"), tmp_path / "eager"), _run(cfg("on"), tmp_path / "compiled")
    worst = max(abs(a - b) / abs(a) for a, b in zip(eager, compiled))
    assert len(eager) == len(compiled) == 100 and worst <= 4 * ulps("bf16", 1), f"largest relative gap {worst:.2e}"


def test_resume_is_bit_exact_on_cuda(debug_cfg, tmp_path):
    """Eager bf16 on CUDA, 4 steps, stopped and resumed to 8, against 8 straight: the same losses bit for bit, as
    on CPU (tests/training/test_training.py)."""
    pinned = dict(device="cuda", precision="bf16", compile="off")
    straight = _run(debug_cfg(tokens=8 * STEP_TOKENS, ckpt_every=4, **pinned), tmp_path / "straight")
    _run(debug_cfg(tokens=4 * STEP_TOKENS, **pinned), tmp_path / "split")
    assert _run(debug_cfg(tokens=8 * STEP_TOKENS, **pinned), tmp_path / "split", resume=True) == straight


@pytest.mark.parametrize("variant", [{"attn_softcap": 15.0}, {"attn_gate": "headwise"}, {"attn_gate": "elementwise"},
                                     {"z_loss": 1e-4}, {"qk_norm_scope": "full"}])
def test_attention_variants_and_z_loss_on_cuda_start_where_the_cpu_does(debug_cfg, tmp_path, variant):
    """The first step's loss (the initial weights', seeded) of each variant on CUDA in bf16 (soft-capping's written-out
    attention, the gates, z-loss in the fused loss) against the same run on CPU in fp32, within the bf16 forward
    tolerance of the debug model; then 4 finite steps."""
    cpu = _run(debug_cfg(tokens=4 * STEP_TOKENS, **variant), tmp_path / "cpu")
    gpu = _run(debug_cfg(tokens=4 * STEP_TOKENS, device="cuda", precision="bf16", **variant), tmp_path / "gpu")
    m = debug_cfg().model
    assert gpu[0] == pytest.approx(cpu[0], rel=forward_rel_tol(m.n_layers, m.d_model, "bf16"))
    assert len(gpu) == 4 and all(math.isfinite(x) for x in gpu)
