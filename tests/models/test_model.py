import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from configs import ConfigError, ModelConfig, get_preset
from models import MinimalLLM, Rotary
from tests.tolerances import sum_rel_tol


def small_cfg(**kw) -> ModelConfig:
    return dataclasses.replace(get_preset("debug").model, **kw)


def test_config_validation_names_the_problem():
    with pytest.raises(ConfigError, match="n_heads=3 is not divisible by n_kv_heads=2"):
        ModelConfig(d_model=192, n_heads=3, n_kv_heads=2)
    with pytest.raises(ConfigError, match="d_model=100 is not divisible by n_heads=3"):
        ModelConfig(d_model=100, n_heads=3, n_kv_heads=1)
    with pytest.raises(ConfigError, match="qk_norm='rms'"):
        ModelConfig(qk_norm="rms")


def test_causality():
    torch.manual_seed(0)
    model = MinimalLLM(small_cfg()).eval()
    idx = torch.randint(0, 512, (2, 20))
    changed = idx.clone()
    t = 11
    changed[:, t] = (idx[:, t] + 7) % 512
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert torch.equal(a[:, :t], b[:, :t])  # positions before t are untouched, bit for bit
    assert not torch.allclose(a[:, t], b[:, t])  # and the change is visible at t


def test_rope_scores_depend_only_on_offset():
    torch.manual_seed(0)
    D, T = 64, 40
    rot = Rotary(D, T, theta=10000.0)
    q, k = torch.randn(D), torch.randn(D)
    # The same q at every position and the same k at every position.
    qr = rot(q.expand(1, T, 1, D))[0, :, 0]  # [T, D]
    kr = rot(k.expand(1, T, 1, D))[0, :, 0]
    scores = qr @ kr.T  # scores[m, n] = <R_m q, R_n k>
    # Two fp32 D-term dot products of rotated vectors, whose |terms| sum to <= |q| |k| (Cauchy-Schwarz): 2.0e-4.
    # Measured 5.7e-6; a wrong rotation moves scores by O(1).
    tol = 2 * sum_rel_tol("fp32", D) * (q.norm() * k.norm()).item()
    for offset in (0, 1, 5, 17):
        diag = torch.diagonal(scores, offset=-offset)  # all (m, m - offset)
        assert torch.allclose(diag, diag[0].expand_as(diag), rtol=0, atol=tol), offset
    # Rotation preserves length: two fp32 norms of D same-sign squares, 2.9e-6 (measured 1 EPS).
    assert torch.allclose(qr.norm(dim=-1), q.norm().expand(T), rtol=2 * sum_rel_tol("fp32", D), atol=0)


def test_gqa_with_equal_heads_is_multi_head_attention():
    torch.manual_seed(0)
    cfg = small_cfg(n_heads=2, n_kv_heads=2)
    attn = MinimalLLM(cfg).blocks[0].attn
    rot = Rotary(cfg.d_head, 64, cfg.rope_theta)
    x = torch.randn(3, 10, cfg.d_model)
    with torch.no_grad():
        got = attn(x, rot)
        # Plain multi-head attention written out by hand.
        B, T, H, D = 3, 10, 2, cfg.d_head
        q = rot(attn.q_norm(attn.wq(x).view(B, T, H, D))).transpose(1, 2)
        k = rot(attn.k_norm(attn.wk(x).view(B, T, H, D))).transpose(1, 2)
        v = attn.wv(x).view(B, T, H, D).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(D)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        want = attn.wo((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D))
    # Both fp32 (SDPA against the softmax written out); reductions <= d_model terms; atol: entries cancel.
    tol = 2 * sum_rel_tol("fp32", cfg.d_model)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())


def test_gqa_shares_kv_heads_across_query_groups():
    torch.manual_seed(0)
    cfg = small_cfg(d_model=256, n_heads=4, n_kv_heads=2)
    attn = MinimalLLM(cfg).blocks[0].attn
    rot = Rotary(cfg.d_head, 64, cfg.rope_theta)
    x = torch.randn(2, 9, cfg.d_model)
    with torch.no_grad():
        got = attn(x, rot)
        B, T, H, K, D = 2, 9, 4, 2, cfg.d_head
        q = rot(attn.q_norm(attn.wq(x).view(B, T, H, D))).transpose(1, 2)
        k = rot(attn.k_norm(attn.wk(x).view(B, T, K, D))).transpose(1, 2)
        v = attn.wv(x).view(B, T, K, D).transpose(1, 2)
        k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)  # q heads 0,1 -> kv 0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        want = attn.wo(y.transpose(1, 2).reshape(B, T, H * D))
    tol = 2 * sum_rel_tol("fp32", cfg.d_model)  # both fp32, reductions <= d_model terms; atol: entries cancel
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())


def _k_norm_outputs(model, idx):
    keys = []
    handles = [b.attn.hook_k_norm.register_forward_hook(lambda m, i, o: keys.append(o)) for b in model.blocks]
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for h in handles:
            h.remove()
    return keys


def test_the_values_hook_point_holds_the_values_and_fires_before_the_keys():
    """hook_v's output is wv(x) as [B, T, K, D], bit for bit, and it fires before hook_k_rope, the layer's last."""
    torch.manual_seed(0)
    model = MinimalLLM(small_cfg(n_heads=4, n_kv_heads=2))
    attn, seen = model.blocks[0].attn, []
    handles = [attn.hook_v.register_forward_hook(lambda m, i, o: seen.append(("v", o))),
               attn.hook_k_rope.register_forward_hook(lambda m, i, o: seen.append(("k", o))),
               model.blocks[0].attn_norm.register_forward_hook(lambda m, i, o: seen.append(("x", o)))]
    try:
        with torch.no_grad():
            model(torch.randint(0, 512, (2, 16)))
    finally:
        for h in handles:
            h.remove()
    assert [name for name, _ in seen] == ["x", "v", "k"]
    x, v = seen[0][1], seen[1][1]
    assert torch.equal(v, attn.wv(x).view(2, 16, 2, -1))


@pytest.mark.parametrize("mode", ["learned", "frozen"])
def test_keys_have_norm_sqrt_d_head_at_init(mode):
    torch.manual_seed(0)
    cfg = small_cfg(qk_norm=mode)
    model = MinimalLLM(cfg)
    keys = _k_norm_outputs(model, torch.randint(0, 512, (2, 16)))
    assert len(keys) == cfg.n_layers
    for k in keys:
        assert k.shape == (2, 16, cfg.n_kv_heads, cfg.d_head)
        # RMSNorm gives sqrt(D) * sqrt(ms / (ms + eps)); with eps = 1e-6 that is 8 to ~1e-5: eps / (2 ms) = 1.6e-5
        # here, a property of the norm, not rounding (the fp32 64-term norm adds sum_rel_tol = 1.4e-6).
        assert torch.allclose(k.norm(dim=-1), torch.full(k.shape[:-1], 8.0), rtol=1e-4)


def test_no_qk_norm_keys_are_raw_projections():
    torch.manual_seed(0)
    model = MinimalLLM(small_cfg(qk_norm="none"))
    assert not any("q_norm" in n or "k_norm" in n for n, _ in model.named_parameters())
    keys = _k_norm_outputs(model, torch.randint(0, 512, (2, 16)))
    assert keys[0].norm(dim=-1).mean() < 4.0  # far from sqrt(D): nothing normalizes them


def test_frozen_gain_stays_exactly_one_after_training():
    from optimizers import build_optimizers

    torch.manual_seed(0)
    run = get_preset("debug")
    model = MinimalLLM(dataclasses.replace(run.model, qk_norm="frozen"))
    opts, _ = build_optimizers(model, run.train)  # no precision: fp32 Muon on every host (the check is exact anyway)
    idx = torch.randint(0, 512, (4, 17))
    for _ in range(3):
        model(idx[:, :-1], idx[:, 1:]).backward()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
    for b in model.blocks:
        for norm in (b.attn.q_norm, b.attn.k_norm):
            assert not norm.weight.requires_grad
            assert torch.equal(norm.weight, torch.ones_like(norm.weight))
    assert not torch.equal(model.blocks[0].attn_norm.weight, torch.ones(run.model.d_model))  # others did train


def test_parameter_count_matches_formula():
    cfg = small_cfg()
    d, D, V, F_ = cfg.d_model, cfg.d_head, cfg.vocab_size, cfg.d_ff
    per_layer = d * d * 2 + d * cfg.n_kv_heads * D * 2 + 2 * d * F_ + 2 * d + 2 * D
    assert MinimalLLM(cfg).num_params() == V * d + cfg.n_layers * per_layer + d


def test_gradient_checkpointing_gives_same_gradients():
    torch.manual_seed(0)
    model = MinimalLLM(small_cfg())
    idx = torch.randint(0, 512, (2, 17))
    model(idx[:, :-1], idx[:, 1:]).backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.grad_checkpointing = True
    model(idx[:, :-1], idx[:, 1:]).backward()
    # The same fp32 ops on the same inputs: equal bit for bit here, but a BLAS may take another code path for another
    # buffer's alignment, so allow two fp32 evaluations (longest reduction: the vocabulary's logsumexp).
    tol = 2 * sum_rel_tol("fp32", model.cfg.vocab_size)
    for g, p in zip(want, model.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=tol, atol=tol * g.abs().max().item())


def test_fused_loss_equals_the_plain_lm_head_and_cross_entropy():
    torch.manual_seed(0)
    model = MinimalLLM(small_cfg())
    idx, tgt = torch.randint(0, 512, (3, 20)), torch.randint(0, 512, (3, 20))
    grads = []
    for fused in (True, False):
        model.fused_loss = fused
        model.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        grads.append((loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (fused_loss, fused_grads), (plain_loss, plain_grads) = grads
    # Both fp32, summing in their own orders; the longest reduction is the logsumexp over the vocabulary: 4.3e-6.
    # Measured: losses equal, gradients at most 1.0e-6 of their largest entry (atol: entries cancel).
    tol = 2 * sum_rel_tol("fp32", model.cfg.vocab_size)
    assert fused_loss == pytest.approx(plain_loss, rel=tol)
    for a, b in zip(fused_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * b.abs().max().item())
