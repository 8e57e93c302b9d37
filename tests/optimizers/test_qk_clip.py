"""QK-clip (optimizers/qk_clip.py) and the running max logit it reads (models.layers.causal_max_logit, taken at the
model's hook points by training.observers.LogitMax)."""
import dataclasses
import math

import pytest
import torch

from configs import ConfigError, apply_overrides, get_preset
from models import MinimalLLM
from models.layers import causal_max_logit
from optimizers.qk_clip import clip_factors, qk_clip_
from research.probing.probe import KeyProbe
from tests.tolerances import sum_rel_tol, ulps
from training.observers import LogitMax


def test_causal_max_logit_by_hand():
    """q_t = e_0 at every t; keys (2, 0), (0, 2), (4, 0): the future key 4 e_0 is seen only by t = 2."""
    k = torch.tensor([[2.0, 0], [0, 2], [4, 0]])[None, None]           # [B=1, K=1, T=3, D=2]
    q = torch.tensor([[1.0, 0]] * 3)[None, None]                       # [B=1, H=1, T=3, D=2]
    # Exact but for one fp32 rounding of the scale 1/sqrt(2) (the products with e_0 are exact): <= EPS / 2 off.
    assert causal_max_logit(q, k).item() == pytest.approx(4 / math.sqrt(2), rel=ulps("fp32", 1))
    assert causal_max_logit(q[:, :, :2], k[:, :, :2]).item() == pytest.approx(2 / math.sqrt(2), rel=ulps("fp32", 1))


@pytest.mark.parametrize("block", [1, 4, 256])
def test_causal_max_logit_matches_the_full_masked_matrix_with_gqa(block):
    g = torch.Generator().manual_seed(0)
    B, H, K, T, D = 2, 4, 2, 11, 8
    q, k = torch.randn(B, H, T, D, generator=g), torch.randn(B, K, T, D, generator=g)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    q64, k64 = q.double(), k.double()  # float64: the exact logits of these fp32 inputs, as a reference
    expected = [(q64[:, h] @ k64[:, h // 2].mT / math.sqrt(D)).masked_fill(future, -math.inf).max().item()
                for h in range(H)]
    # fp32 against float64: one D = 8-term dot each (the |terms| of these maxima sum to <= 1.8x them); measured
    # 0.8 EPS, tolerance 6 EPS.
    assert causal_max_logit(q, k, block=block).tolist() == pytest.approx(expected, rel=sum_rel_tol("fp32", D))


def test_clip_factors_scale_each_heads_logits_by_its_own_gamma():
    """Group of 2 query heads on one KV head: head 0 at 2 tau (gamma 1/2), head 1 below tau (gamma 1).
    Keys take sqrt(1/2); head 0's queries 1/2 / sqrt(1/2) = sqrt(1/2), head 1's 1 / sqrt(1/2)."""
    q_H, k_K = clip_factors(torch.tensor([20.0, 5.0, 30.0, 10.0]), tau=10.0, n_kv_heads=2)
    # Known by hand; fp32 rounds tau / S, the sqrt, the division and the product once each: 4 u = 2 EPS.
    assert k_K.tolist() == pytest.approx([math.sqrt(0.5), math.sqrt(1 / 3)], rel=ulps("fp32", 2))
    logit_factor = q_H * k_K.repeat_interleave(2)  # head 3 sits at tau: untouched
    assert logit_factor.tolist() == pytest.approx([0.5, 1.0, 1 / 3, 1.0], rel=ulps("fp32", 2))


def _gqa_model():
    # One layer: clipping a layer changes what later layers see, so only its own logits are exact.
    cfg = dataclasses.replace(get_preset("debug").model, qk_norm="none", n_heads=4, n_kv_heads=2, d_model=128,
                              n_layers=1)
    torch.manual_seed(0)
    model = MinimalLLM(cfg)
    with torch.no_grad():  # large projections, so that logits are far above 1
        for block in model.blocks:
            block.attn.wq.weight.mul_(40)
            block.attn.wk.weight.mul_(40)
    return model


def _max_logits(model, ids):
    probe = KeyProbe(ids)
    return [torch.tensor(layer["attn"]["logit_max"]) for layer in probe(model)["layers"]]


def test_qk_clip_brings_the_largest_logit_of_each_clipped_head_to_tau_and_leaves_the_others():
    model = _gqa_model()
    ids = torch.randint(0, model.cfg.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    model.train()
    logits = LogitMax(model.blocks, torch.device("cpu"))
    with torch.no_grad():
        model(ids)
    logits.remove()
    before = _max_logits(model, ids)
    # Two fp32 forwards (training, the fp32 probe), each a d_model-term projection and a d_head-term logit, the
    # largest logit's terms of one sign mostly: 2 sum_rel_tol(d_model) = 3.3e-6. Measured: equal.
    tol = 2 * sum_rel_tol("fp32", model.cfg.d_model)
    for tracked, seen in zip(logits.maxima, before, strict=True):  # the tracked max is the probe's, same batch
        assert tracked.tolist() == pytest.approx(seen.tolist(), rel=tol)
    tau = float(torch.cat(before).median())
    counts = qk_clip_(model.blocks, logits.maxima, tau)
    after = _max_logits(model, ids)
    assert counts == [int((b > tau).sum()) for b in before] and sum(counts) > 0
    for b, a in zip(before, after):  # the same rounding as above (the clip's own few roundings aside): 5 EPS measured
        expected = torch.where(b > tau, torch.full_like(b, tau), b)
        assert a.tolist() == pytest.approx(expected.tolist(), rel=tol)


def test_qk_clip_needs_a_model_without_qk_norm():
    with pytest.raises(ConfigError, match="QK-clip applies only with --qk_norm none"):
        apply_overrides(get_preset("debug"), {"qk_clip": 50.0})
    assert apply_overrides(get_preset("debug"), {"qk_clip": 50.0, "qk_norm": "none"}).train.qk_clip == 50.0
    with pytest.raises(ConfigError, match="--qk_clip does not work with --shard fsdp yet"):  # before any data work
        apply_overrides(get_preset("debug"), {"qk_clip": 50.0, "qk_norm": "none", "shard": "fsdp"})


def test_training_with_qk_clip_logs_clips_per_layer_and_keeps_logits_near_tau(debug_cfg, tmp_path):
    """Projections scaled up so the logits start far above tau: every step clips, and after a step the
    largest logit seen on the next batch is close to tau (its own batch's would be tau exactly)."""
    import json

    from tests.helpers import build_trainer
    tau = 5.0
    t = build_trainer(debug_cfg(qk_norm="none", qk_clip=tau, tokens=6 * 256), tmp_path)  # fp32 (debug_cfg pins it)
    with torch.no_grad():
        for block in t.model.blocks:
            block.attn.wq.weight.mul_(30)
            block.attn.wk.weight.mul_(30)
    t.fit()
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "loss" in r]
    assert all(len(r["qk_clipped_heads"]) == 2 and len(r["max_logit"]) == 2 for r in logged)
    # Training behaviour, not rounding: the logits start far above tau and end near it.
    assert logged[0]["qk_clipped_heads"][0] > 0 and logged[0]["max_logit"][0] > 10 * tau
    assert max(logged[-1]["max_logit"]) < 2 * tau


def test_checkpointing_does_not_track_the_logits_twice(monkeypatch):
    """The recompute in backward skips the max-logit pass (the forward took it); the maxima are the same."""
    import training.observers as observers
    calls = []
    real = observers.causal_max_logit
    monkeypatch.setattr(observers, "causal_max_logit", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = _gqa_model()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2))
    logits = LogitMax(model.blocks, torch.device("cpu"))
    maxima = []
    for ckpt in (False, True):
        model.grad_checkpointing = ckpt
        logits.reset()
        calls.clear()
        model(ids[:, :-1], ids[:, 1:]).backward()
        assert len(calls) == model.cfg.n_layers
        maxima.append(torch.stack(logits.maxima).clone())
    assert torch.equal(maxima[0], maxima[1]) and not any(b.recomputing for b in model.blocks)
