"""CUDA paths: bf16 autocast, fused AdamW, compile. Skipped where there is no GPU."""
import pytest
import torch

from tests.helpers import build_trainer

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
