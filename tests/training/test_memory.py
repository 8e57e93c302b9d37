"""The memory plan (training/memory.py) against the peak measured on CPU, and the refusal of runs that do not fit.

What is compared: `plan.peak` (the planned largest phase of a training step, fp32 on CPU, before the 10%
headroom) with the largest total of live tensor bytes during one full step (forward, backward and both
optimizer steps, after a first step created the optimizer states): the bytes held before the step (weights,
buffers, optimizer states) plus the peak of the tensors created during it, from torch.profiler's memory
timeline (every CPU allocation and free by the c10 allocator). This is what tensors occupy, not the
process's RSS (glibc keeps freed pages). Measured here (torch 2.13 CPU), plan minus measured over measured:
debug preset +5.8%, tiny -0.1%, tiny with checkpointing -0.4%, tiny unfused loss +0.3%, tiny at
4 x 256 tokens +13.4% (the plan is conservative where attention's saved tensors are smaller than counted), tiny with
W_q and W_k in AdamW (--qk_optimizer adamw) -0.1%.
"""
from __future__ import annotations

import pytest
import torch

import train_llm
from configs import apply_overrides, get_preset
from models import MinimalLLM
from optimizers import build_optimizers
from training.memory import GIB, needed_bytes, plan_memory
from training import memory_fit
from training.memory_fit import MemoryPlanError, check_fits, fit_options
from utils.runtime import Runtime


def _held_bytes(model, optimizers) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [v for o in optimizers for state in o.state.values() for v in state.values() if torch.is_tensor(v)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def measured_peak(cfg) -> int:
    """Largest live tensor bytes during one training step of cfg on CPU in fp32 (the second step)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action  # the timeline behind profile.export_memory_timeline
    torch.manual_seed(0)
    model = MinimalLLM(cfg.model)
    model.grad_checkpointing, model.fused_loss = cfg.train.grad_checkpointing, cfg.train.fused_loss
    optimizers, _ = build_optimizers(model, cfg.train)
    x = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.data.seq_len))

    def step():
        model(x, x).backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
    step()
    held = _held_bytes(model, optimizers)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as p:
        step()
    created, live, peak = set(), 0, 0
    for _, action, (key, _), size in p._memory_profile().timeline:
        if action == Action.CREATE:
            created.add(key)
            live += size
        elif action == Action.DESTROY and key in created:
            live -= size
        peak = max(peak, live)
    return held + peak


@pytest.mark.parametrize("preset, overrides, low, high", [
    ("debug", {}, 0.0, 0.10),
    ("tiny", {}, -0.03, 0.03),
    ("tiny", {"grad_checkpointing": True}, -0.03, 0.03),
    ("tiny", {"fused_loss": False}, -0.03, 0.03),
    ("tiny", {"batch_size": 4, "seq_len": 256}, 0.0, 0.16),
    ("tiny", {"qk_optimizer": "adamw"}, -0.03, 0.03),
])
@pytest.mark.slow
def test_plan_matches_the_measured_peak(preset, overrides, low, high):
    torch.set_num_threads(1)
    cfg = apply_overrides(get_preset(preset), {"precision": "fp32", "compile": "off", **overrides})
    plan = plan_memory(cfg, "cpu", "fp32")
    measured = measured_peak(cfg)
    assert low <= (plan.peak - measured) / measured <= high, (plan.peak, measured, plan.phases)


def test_wq_and_wk_in_adamw_are_planned_as_adamw_moments():
    """tiny: 6 layers, d_model 128, 2 heads and 2 kv heads of 64, so W_q and W_k are 128 x 128 in every layer."""
    cfg = get_preset("tiny")
    assert (cfg.model.n_layers, cfg.model.d_model, cfg.model.n_kv_heads * cfg.model.d_head) == (6, 128, 128)
    muon = plan_memory(cfg, "cuda", "bf16")
    adamw = plan_memory(apply_overrides(cfg, {"qk_optimizer": "adamw"}), "cuda", "bf16")
    moved = 6 * 2 * 128 * 128
    assert muon.parts["muon_momentum"] - adamw.parts["muon_momentum"] == 4 * moved  # one fp32 buffer each
    assert adamw.parts["adamw_moments"] - muon.parts["adamw_moments"] == 8 * moved  # two fp32 moments each
    for key in ("weights", "gradients", "bf16_weight_copies", "muon_step"):  # Muon's largest chunk: the MLP's
        assert adamw.parts[key] == muon.parts[key], key
    # On CPU the AdamW step's temporaries are those of its largest group: the embedding, 4096 x 128 > 12 x 128 x 128
    assert plan_memory(apply_overrides(cfg, {"qk_optimizer": "adamw"}), "cpu", "fp32").parts["adamw_step"] == \
        4 * 4096 * 128
    assert plan_memory(apply_overrides(cfg, {"qk_lr_multiplier": 2.0}), "cuda", "bf16").parts == muon.parts


def test_fsdp_and_checkpointing_shrink_the_1b_plan():
    cfg = apply_overrides(get_preset("1b"), {"grad_checkpointing": False})
    plain = plan_memory(cfg, "cuda", "bf16")
    ckpt = plan_memory(apply_overrides(cfg, {"grad_checkpointing": True}), "cuda", "bf16")
    fsdp = plan_memory(apply_overrides(cfg, {"shard": "fsdp"}), "cuda", "bf16", world_size=4)
    assert ckpt.peak < 0.5 * plain.peak
    assert fsdp.parts["weights"] * 4 == plain.parts["weights"] and fsdp.peak < plain.peak


def test_a_cuda_run_that_does_not_fit_is_refused_naming_what_fits(monkeypatch):
    monkeypatch.setattr(memory_fit, "cuda_free", lambda device: (20 * GIB, 80 * GIB))
    monkeypatch.setattr(memory_fit, "available_memory", lambda: 2 ** 50)  # a host that holds any model
    cfg = apply_overrides(get_preset("1b"), {"device": "cuda:0", "grad_checkpointing": False})
    with pytest.raises(MemoryPlanError) as e:
        check_fits(cfg, Runtime(torch.device("cuda", 0), "bf16"))
    msg = str(e.value)
    assert "GiB free of 80.0" in msg and "options that fit" in msg and "\n" not in msg
    assert "--shard fsdp under torchrun --nproc_per_node" in msg
    for option in fit_options(cfg, 1, 20 * GIB):  # each option named does fit
        assert float(option.rsplit("(", 1)[1].split()[0]) <= 20
    check_fits(cfg, Runtime(torch.device("cpu"), "fp32"))  # on CPU: this machine's memory, here 1 PiB
    monkeypatch.setattr(memory_fit, "cuda_free", lambda device: (79 * GIB, 80 * GIB))
    check_fits(apply_overrides(cfg, {"grad_checkpointing": True}), Runtime(torch.device("cuda", 0), "bf16"))


def test_plan_option_prints_and_exits_without_out(capsys):
    assert train_llm.main(["--preset", "1b", "--device", "cuda", "--plan"]) is None
    out = capsys.readouterr().out
    assert "preset 1b, 1,577,199,616 parameters, cuda bf16" in out and "peak" in out
    planned = needed_bytes(plan_memory(get_preset("1b"), "cuda", "bf16"))
    assert f"headroom {planned / GIB:.2f} GiB" in out


def test_a_study_plans_its_largest_run_without_training(capsys, tmp_path):
    from research.studies import QK_NORM
    from research.studies.runner import run_study
    run_study(QK_NORM, ["--device", "cuda", "--plan", "--out", str(tmp_path / "study")])
    out = capsys.readouterr().out
    assert "the largest of its 3 runs" in out and "preset 1b" in out and "probe working set" in out
    assert not (tmp_path / "study").exists()
