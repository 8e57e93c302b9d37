"""Muon orthogonalizers, the Muon update, and the Muon/AdamW parameter split.

Accuracy numbers quoted below were measured on this project's CPU (torch 2.13, MKL) with
seeds 0-2 on Gaussian matrices of the model's shapes, and again with AVX2 kernels (ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2, a host without native bf16); the asserted tolerances add a
small margin. Neither iteration converges exactly in 5 steps: the output's singular values are only near 1.
Rounding tolerances are derived from the compute precision (tests/tolerances.py, ortho_rounding).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import io
import math

import pytest
import torch

from configs import get_preset
from models import MinimalLLM
from optimizers import Muon, build_optimizers, format_split, newton_schulz, polar_express
from optimizers.muon import NEWTON_SCHULZ_COEFFS, POLAR_EXPRESS_COEFFS
from optimizers.split import check_coverage
from tests.tolerances import ortho_rounding, ulps


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Run this module single-threaded: these are small matmuls, and on the shared 2-core machine
    two OpenMP threads competing with another process slowed the file from ~9 s to over a minute."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


SHAPES = [(128, 128), (64, 128), (512, 128), (128, 512), (256, 256), (1024, 256), (256, 1024)]
DTYPES = [torch.float32, torch.bfloat16]


def gaussian(shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def svd64(G):
    U, S, Vh = torch.linalg.svd(G.double(), full_matrices=False)
    return U, S, Vh


@functools.lru_cache(maxsize=None)
def gaussian_with_svd(shape):
    """A seeded Gaussian matrix and its float64 SVD, computed once per shape for all tests."""
    G = gaussian(shape)
    return (G, *svd64(G))


def scalar_composition(x: torch.Tensor, coeffs) -> torch.Tensor:
    """The scalar map applied to each (normalised) singular value, in float64."""
    for a, b, c in coeffs:
        x = a * x + b * x ** 3 + c * x ** 5
    return x


def errors(O, shape):
    """(max |sigma_i(O) - 1|, ||O - U V^T||_F / ||U V^T||_F, max sigma(O), sigma_i along G's basis)."""
    _, U, S, Vh = gaussian_with_svd(shape)
    polar = U @ Vh
    sv = torch.linalg.svdvals(O.double())
    along = torch.diagonal(U.mT @ O.double() @ Vh.mT)  # O's gain along G's singular directions
    return (sv - 1).abs().max().item(), ((O.double() - polar).norm() / polar.norm()).item(), sv.max().item(), along


# ---------------------------------------------------------------------------------------------
# Polar Express
#
# Measured, 5 steps, Gaussian matrices (fp32 | bf16 compute):
#   rectangular shapes: max |sigma - 1| = 0.1264-0.1297 | 0.1278-0.1330,
#                       ||O - UV^T||_F / ||UV^T||_F = 0.084-0.090 | 0.084-0.090
#   every shape:        max sigma = 1.1236 | 1.1248 (the equioscillation overshoot of the last
#                       polynomial; see PE_INTERVAL_LOW below)
#   square shapes:      Gaussian square matrices have singular values far below 1e-3 * ||G||_F,
#                       which 5 steps cannot lift: min sigma 0.12-0.56, rel. Frobenius 0.094-0.112.
#                       Directions whose normalised sigma >= 1.2e-3 (see PE_INTERVAL_LOW) are all
#                       within 0.1297 | 0.133 of 1.
# ---------------------------------------------------------------------------------------------
# The coefficients are optimal for singular values in [1e-3, 1]. With the safety factor (the
# input divided by 1.01 ||G||_F and every polynomial evaluated at x / 1.01) the float64 scalar
# composition of the 5 polynomials maps sigma / (1.01 ||G||_F) in [1.2e-3, 1/1.01] into
# [0.8703, 1.1236], i.e. within 0.1297 of 1 (it is 0.154 from 1 at 1e-3).
# PE_TOL and NS_TOL are properties of the 5-step algorithms, not rounding: the fp32 rows sit on the float64 bands,
# the bf16 rows add bf16's rounding as measured (seed 0, native bf16 | AVX2 kernels: PE max |sigma - 1| 0.1322 |
# 0.1321, max sigma 1.1249 | 1.1248; NS 0.3201 | 0.3199, 1.2013 | 1.2013; fp32 identical on both).
PE_INTERVAL_LOW = 1.2e-3
PE_TOL = {torch.float32: dict(dev=0.131, sv_max=1.125, rel_rect=0.092, rel_square=0.115),
          torch.bfloat16: dict(dev=0.136, sv_max=1.127, rel_rect=0.093, rel_square=0.117)}


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
def test_polar_express_close_to_svd_polar_factor(shape, dtype):
    G, _, S, _ = gaussian_with_svd(shape)
    O = polar_express(G, steps=5, dtype=dtype)
    assert O.shape == G.shape and O.dtype == G.dtype and torch.isfinite(O).all()
    tol = PE_TOL[dtype]
    dev, rel, sv_max, along = errors(O, shape)
    assert sv_max <= tol["sv_max"]
    normalised = S / (1.01 * G.double().norm())
    inside = normalised >= PE_INTERVAL_LOW
    assert (along[inside] - 1).abs().max().item() <= tol["dev"]
    if shape[0] != shape[1]:
        assert inside.all()
        assert dev <= tol["dev"]
        assert rel <= tol["rel_rect"]
    else:
        assert rel <= tol["rel_square"]


@pytest.mark.parametrize("shape", [(256, 256), (128, 512), (512, 128)])
def test_polar_express_known_singular_values(shape):
    """G = U diag(s) V^T with s log-spaced over [1e-3, 1]: O must be U diag(p(s / (1.01 ||s||))) V^T.

    Measured (fp32, both kernel sets): max deviation from the float64 scalar composition 4.0e-6 .. 4.6e-6 on
    the diagonal, off-diagonal (in G's singular basis) <= 1.7e-6, 7x below ortho_rounding. Distance to the polar
    factor U V^T: 0.269 (256x256), 0.217 (128x512, 512x128); it is large because ||s|| = 3.1-4.4 pushes the
    smallest normalised singular values to ~2e-4, below the interval the coefficients target.
    """
    m, n = shape
    k = min(m, n)
    gen = torch.Generator().manual_seed(0)
    U, _ = torch.linalg.qr(torch.randn(m, k, generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, k, generator=gen, dtype=torch.float64))
    s = torch.logspace(-3, 0, k, dtype=torch.float64)
    G = ((U * s) @ V.T).float()
    O = polar_express(G, steps=5, dtype=torch.float32).double()
    in_basis = U.T @ O @ V  # should be diagonal
    expected = scalar_composition(s / (1.01 * s.norm()), POLAR_EXPRESS_COEFFS[:5])
    tol = ortho_rounding("fp32", max(m, n))  # fp32 iteration against the float64 composition: 3.3e-5
    torch.testing.assert_close(torch.diagonal(in_basis), expected, atol=tol, rtol=0)
    assert (in_basis - torch.diag(torch.diagonal(in_basis))).abs().max().item() < tol
    polar = U @ V.T
    assert ((O - polar).norm() / polar.norm()).item() < 0.28  # the algorithm's distance (measured 0.269), not rounding
    # Directions inside the design interval are within the 5-step bound of 1 (float64: the algorithm's own bound).
    inside = s / (1.01 * s.norm()) >= PE_INTERVAL_LOW
    assert inside.any() and (expected[inside] - 1).abs().max().item() <= 0.1298


def test_polar_express_converges_with_more_steps():
    """Past 5 steps the iteration keeps converging (the repeated last polynomial is 1.875/-1.25/0.375)."""
    G, U, _, Vh = gaussian_with_svd((128, 512))
    rels = [((polar_express(G, steps=k, dtype=torch.float32).double() - U @ Vh).norm() / (U @ Vh).norm()).item()
            for k in (3, 5, 8)]
    assert rels[0] > rels[1] > rels[2]
    # Measured 0.53, 0.086, 2.9e-6 after 3, 5, 8 steps; in float64 8 steps leave 1e-16, so 2.9e-6 is fp32 rounding.
    assert rels[2] < ortho_rounding("fp32", 512, steps=8)  # 5.3e-5


def test_batched_equals_single():
    G = torch.stack([gaussian((64, 128), seed=s) for s in range(3)])
    batched = polar_express(G, dtype=torch.float32)
    # Both fp32; a batch of 3 and of 1 need not share a kernel's summation order (measured: equal bit for bit).
    for i in range(3):
        torch.testing.assert_close(batched[i], polar_express(G[i], dtype=torch.float32),
                                   atol=2 * ortho_rounding("fp32", 128), rtol=0)
    tall = polar_express(G.mT, dtype=torch.float32)  # [3, 128, 64]: transposed back to the same wide matrices
    assert torch.equal(tall, batched.mT)  # the same fp32 arithmetic on the same memory
    assert polar_express(G.view(1, 3, 64, 128), dtype=torch.float32).shape == (1, 3, 64, 128)


def test_zero_matrix_stays_zero():
    assert torch.equal(polar_express(torch.zeros(8, 16)), torch.zeros(8, 16))
    assert torch.equal(newton_schulz(torch.zeros(16, 8)), torch.zeros(16, 8))


# ---------------------------------------------------------------------------------------------
# Newton-Schulz (Muon's fixed quintic): it does not converge, it oscillates around 1. NS_TOL: the algorithm's bands.
# Measured, 5 steps, Gaussian matrices (fp32 | bf16): rectangular max |sigma - 1| = 0.3171-0.3182 |
# 0.3174-0.3204; max sigma 1.2023 | 1.2023; rel. Frobenius distance to UV^T: rectangular
# 0.152-0.219 | 0.152-0.219, square 0.205-0.213 | 0.205-0.212.
# ---------------------------------------------------------------------------------------------
NS_TOL = {torch.float32: dict(dev=0.319, sv_max=1.205, rel=0.222),
          torch.bfloat16: dict(dev=0.323, sv_max=1.207, rel=0.223)}


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
def test_newton_schulz_close_to_svd_polar_factor(shape, dtype):
    G = gaussian_with_svd(shape)[0]
    O = newton_schulz(G, steps=5, dtype=dtype)
    assert O.shape == G.shape and O.dtype == G.dtype and torch.isfinite(O).all()
    tol = NS_TOL[dtype]
    dev, rel, sv_max, _ = errors(O, shape)
    assert sv_max <= tol["sv_max"]
    assert rel <= tol["rel"]
    if shape[0] != shape[1]:
        assert dev <= tol["dev"]


def test_newton_schulz_known_singular_values():
    m, n = 128, 512
    gen = torch.Generator().manual_seed(0)
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, m, generator=gen, dtype=torch.float64))
    s = torch.logspace(-3, 0, m, dtype=torch.float64)
    O = newton_schulz(((U * s) @ V.T).float(), steps=5, dtype=torch.float32).double()
    expected = scalar_composition(s / s.norm(), [NEWTON_SCHULZ_COEFFS] * 5)
    torch.testing.assert_close(torch.diagonal(U.T @ O @ V), expected, atol=ortho_rounding("fp32", n),
                               rtol=0)  # fp32 against float64: measured 9.5e-7, tolerance 3.3e-5
    assert ((O - U @ V.T).norm() / m ** 0.5).item() < 0.37  # the algorithm's distance (measured 0.356), not rounding


# ---------------------------------------------------------------------------------------------
# The Muon update
# ---------------------------------------------------------------------------------------------
# The factor on the orthogonalized update of a tall [128, 32], a wide [32, 128] and a square [32, 32] matrix, by hand:
# none: sqrt(max(1, rows / cols)) = 2, 1, 1; match_rms_adamw: 0.2 sqrt(max(rows, cols)) = 0.2 sqrt(128), again, 0.2
# sqrt(32), i.e. 1.6 sqrt(2) = 2.2627..., 2.2627..., 0.8 sqrt(2) = 1.1313...
SCALES = {"none": (2.0, 1.0, 1.0), "match_rms_adamw": (1.6 * 2 ** 0.5, 1.6 * 2 ** 0.5, 0.8 * 2 ** 0.5)}


@pytest.mark.parametrize("mode", SCALES)
@pytest.mark.parametrize("orthogonalizer", ["polar_express", "newton_schulz"])
def test_muon_update_scaling_and_weight_decay(orthogonalizer, mode):
    ortho = {"polar_express": polar_express, "newton_schulz": newton_schulz}[orthogonalizer]
    lr, wd = 0.05, 0.1
    tall = torch.nn.Parameter(gaussian((128, 32), seed=1))
    wide = torch.nn.Parameter(gaussian((32, 128), seed=2))
    square = torch.nn.Parameter(gaussian((32, 32), seed=3))  # joins no bucket with the others
    params = [tall, wide, square]
    before = [p.detach().clone() for p in params]
    for i, p in enumerate(params):
        p.grad = gaussian(p.shape, seed=10 + i)
    opt = Muon(params, lr=lr, momentum=0.0, nesterov=True, weight_decay=wd, orthogonalizer=orthogonalizer,
               ortho_dtype=torch.float32, update_scale=mode)
    opt.step()
    for p, p0, scale in zip(params, before, SCALES[mode]):
        expected = p0 * (1 - lr * wd) - lr * scale * ortho(p.grad, steps=5, dtype=torch.float32)
        # Both fp32: Muon orthogonalizes tall and wide in one batch (another summation order, 2 ortho_rounding,
        # scaled by lr * scale), and each side rounds p0 - step once (one ulp: EPS |p|). Measured: one ulp.
        torch.testing.assert_close(p.detach(), expected, rtol=ulps("fp32", 1),
                                   atol=2 * ortho_rounding("fp32", 128) * lr * scale)
    # Zero gradient: the step is pure decoupled weight decay.
    for p in params:
        p.grad = torch.zeros_like(p)
        opt.state[p]["momentum_buffer"].zero_()
    snapshot = [p.detach().clone() for p in params]
    opt.step()
    for p, p0 in zip(params, snapshot):
        assert torch.equal(p.detach(), p0 * (1 - lr * wd))  # the same one fp32 product (and + 0): bit for bit


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_momentum(nesterov):
    lr, mom = 0.01, 0.9
    p = torch.nn.Parameter(gaussian((32, 64), seed=4))
    opt = Muon([p], lr=lr, momentum=mom, nesterov=nesterov, ortho_dtype=torch.float32)
    g1, g2 = gaussian((32, 64), seed=5), gaussian((32, 64), seed=6)
    p.grad = g1
    opt.step()
    p0 = p.detach().clone()
    p.grad = g2
    opt.step()
    buf = mom * g1 + g2
    direction = g2 + mom * buf if nesterov else buf
    # Both fp32, the same single-matrix iteration (2 ortho_rounding: the direction may round differently), then
    # one rounding of p0 - step on each side (one ulp: EPS |p|). Measured: one ulp.
    torch.testing.assert_close(p.detach(), p0 - lr * polar_express(direction, dtype=torch.float32),
                               rtol=ulps("fp32", 1), atol=2 * ortho_rounding("fp32", 64) * lr)
    assert torch.equal(opt.state[p]["momentum_buffer"], buf)  # the same two fp32 operations in the same order


def test_muon_rejects_bad_params():
    with pytest.raises(ValueError, match="2-D"):
        Muon([torch.nn.Parameter(torch.ones(4))], lr=0.01)
    with pytest.raises(ValueError, match="orthogonalizer"):
        Muon([torch.nn.Parameter(torch.ones(4, 4))], lr=0.01, orthogonalizer="svd")
    with pytest.raises(ValueError, match="update_scale='rms': choose one of none, match_rms_adamw"):
        Muon([torch.nn.Parameter(torch.ones(4, 4))], lr=0.01, update_scale="rms")


def test_muon_implements_every_update_scale_the_config_accepts():
    from configs.config import MUON_UPDATE_SCALES
    from optimizers.muon import UPDATE_SCALES
    assert UPDATE_SCALES == MUON_UPDATE_SCALES


def test_a_state_dict_saved_before_update_scale_loads_as_none():
    p = torch.nn.Parameter(torch.ones(4, 4))
    sd = Muon([p], lr=0.01).state_dict()
    del sd["param_groups"][0]["update_scale"]  # as a checkpoint written before the field existed
    opt = Muon([p], lr=0.01, update_scale="match_rms_adamw")
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["update_scale"] == "none"


def test_base_lr_in_every_group():
    opt = Muon([torch.nn.Parameter(torch.ones(4, 4))], lr=0.03)
    opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2, 4))], "lr": 0.01})
    assert [g["base_lr"] for g in opt.param_groups] == [0.03, 0.01]


# ---------------------------------------------------------------------------------------------
# The split on the debug model: 2 layers, d_model 128, 2 heads, 1 kv head (d_head 64), d_ff 256,
# vocab 512. Per layer: wq 128x128 + wk 64x128 + wv 64x128 + wo 128x128 + up 256x128 +
# down 128x256 = 16384 + 8192 + 8192 + 16384 + 32768 + 32768 = 114688 in 6 tensors.
# Gains per layer: attn_norm 128 + ffn_norm 128 + q_norm 64 + k_norm 64 = 384 in 4 tensors;
# plus final_norm 128. Embedding 512 x 128 = 65536.
# ---------------------------------------------------------------------------------------------
def debug_model(**model_overrides):
    run = get_preset("debug")
    torch.manual_seed(0)
    return MinimalLLM(dataclasses.replace(run.model, **model_overrides)), run.train


def names_in(opt, model):
    by_id = {id(p): n for n, p in model.named_parameters()}
    return {g["name"]: [by_id[id(p)] for p in g["params"]] for g in opt.param_groups}


def test_split_counts_debug_model():
    model, tcfg = debug_model()
    (muon, adamw), summary = build_optimizers(model, tcfg)
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    assert summary["muon"] == {"tensors": 2 * 6, "params": 2 * 114688}
    assert summary["adamw"] == {"tensors": 1 + 2 * 4 + 1, "params": 65536 + 2 * 384 + 128}
    assert summary["frozen"] == {"tensors": 0, "params": 0}
    groups = names_in(adamw, model)
    assert groups["embed"] == ["embed.weight"]
    assert len(groups["gains"]) == 9 and all(n.endswith("norm.weight") for n in groups["gains"])
    assert all(n.startswith("blocks.") for n in names_in(muon, model)["muon"])
    assert sum(summary[k]["params"] for k in summary) == model.num_params()
    # Hyperparameters come from the TrainConfig; base_lr is the peak LR of each group.
    mg = muon.param_groups[0]
    assert (mg["lr"], mg["base_lr"], mg["momentum"], mg["nesterov"], mg["weight_decay"], mg["orthogonalizer"],
            mg["ortho_steps"]) == (tcfg.muon_lr, tcfg.muon_lr, tcfg.momentum, tcfg.nesterov,
                                   tcfg.muon_weight_decay, tcfg.orthogonalizer, tcfg.ortho_steps)
    for g in adamw.param_groups:
        assert g["lr"] == g["base_lr"] == tcfg.adamw_lr
        assert g["betas"] == (tcfg.adam_beta1, tcfg.adam_beta2) and g["eps"] == 1e-8
        assert g["weight_decay"] == tcfg.adamw_weight_decay  # wd_on_gains defaults to True
        assert not g["fused"]
    text = format_split(summary)
    assert "muon 12 tensors / 229,376 params" in text and "adamw 10 tensors / 66,432 params" in text


def test_split_frozen_qk_norm_and_no_wd_on_gains():
    model, tcfg = debug_model(qk_norm="frozen")
    tcfg = dataclasses.replace(tcfg, wd_on_gains=False, adamw_weight_decay=0.1, muon_weight_decay=0.05)
    optimizers, summary = build_optimizers(model, tcfg)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {f"blocks.{i}.attn.{q}_norm.weight" for i in range(2) for q in "qk"}
    optimized = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    assert not any(id(p) in optimized for n, p in model.named_parameters() if n in frozen)
    assert summary["frozen"] == {"tensors": 4, "params": 4 * 64}
    assert summary["adamw"] == {"tensors": 1 + 2 * 2 + 1, "params": 65536 + 2 * 256 + 128}
    assert summary["muon"] == {"tensors": 12, "params": 229376}
    wd = {g["name"]: g["weight_decay"] for g in optimizers[1].param_groups}
    assert wd == {"embed": 0.1, "gains": 0.0}
    assert optimizers[0].param_groups[0]["weight_decay"] == 0.05


def test_split_none_qk_norm():
    model, tcfg = debug_model(qk_norm="none")
    _, summary = build_optimizers(model, tcfg)
    assert summary["adamw"] == {"tensors": 1 + 2 * 2 + 1, "params": 65536 + 2 * 256 + 128}


QK_NAMES = [f"blocks.{i}.attn.w{x}.weight" for i in range(2) for x in "qk"]


def test_default_split_keeps_wq_and_wk_in_the_one_muon_group():
    model, tcfg = debug_model()
    (muon, adamw), _ = build_optimizers(model, tcfg)
    assert [g["name"] for g in muon.param_groups] == ["muon"] and set(QK_NAMES) <= set(names_in(muon, model)["muon"])
    assert [g["name"] for g in adamw.param_groups] == ["embed", "gains"]
    assert muon.param_groups[0]["update_scale"] == "none"


def test_qk_optimizer_adamw_moves_wq_and_wk_to_their_own_adamw_group():
    model, tcfg = debug_model()
    tcfg = dataclasses.replace(tcfg, qk_optimizer="adamw", qk_lr_multiplier=0.5, muon_weight_decay=0.07,
                               adamw_weight_decay=0.05)
    (muon, adamw), summary = build_optimizers(model, tcfg)
    assert names_in(adamw, model)["qk"] == QK_NAMES and not set(QK_NAMES) & set(names_in(muon, model)["muon"])
    qk = adamw.param_groups[2]
    # AdamW's lr times the multiplier, its betas and its weight decay: the embedding's settings (docs/training.md)
    assert (qk["lr"], qk["base_lr"], qk["betas"], qk["weight_decay"]) == (0.003, 0.003, (0.9, 0.999), 0.05)
    wq_wk = 128 * 128 + 64 * 128  # per layer (the comment above the debug model)
    assert summary["muon"] == {"tensors": 2 * 4, "params": 2 * (114688 - wq_wk)}
    assert summary["adamw"] == {"tensors": 1 + 2 * 4 + 1 + 4, "params": 65536 + 2 * 384 + 128 + 2 * wq_wk}


def test_qk_lr_multiplier_gives_wq_and_wk_their_own_muon_group():
    model, tcfg = debug_model()
    tcfg = dataclasses.replace(tcfg, qk_lr_multiplier=2.0, muon_update_scale="match_rms_adamw")
    (muon, adamw), summary = build_optimizers(model, tcfg)
    assert [g["name"] for g in muon.param_groups] == ["muon", "muon_qk"]
    assert names_in(muon, model)["muon_qk"] == QK_NAMES
    assert [(g["lr"], g["base_lr"], g["update_scale"]) for g in muon.param_groups] == \
        [(0.024, 0.024, "match_rms_adamw"), (0.048, 0.048, "match_rms_adamw")]
    assert summary["muon"] == {"tensors": 12, "params": 2 * 114688}  # the same split as by default
    assert [g["name"] for g in adamw.param_groups] == ["embed", "gains"]


@pytest.mark.parametrize("qk_optimizer", ["muon", "adamw"])
def test_one_step_of_wq_by_hand(qk_optimizer):
    """W_q after one step from gradient g, with qk_lr_multiplier 0.5 and weight decay 0.1 on the matrices.
    AdamW's first step: m = (1 - b1) g and v = (1 - b2) g^2, bias-corrected to g and g^2, so the step is
    lr g / (|g| + eps). Muon's first step (Nesterov): buf = g, direction g + momentum g, orthogonalized
    (the scale drops out), times sqrt(max(1, 128 / 128)) = 1."""
    model, tcfg = debug_model()
    tcfg = dataclasses.replace(tcfg, qk_optimizer=qk_optimizer, qk_lr_multiplier=0.5, muon_weight_decay=0.1,
                               adamw_weight_decay=0.1)
    optimizers, _ = build_optimizers(model, tcfg)
    wq = model.blocks[0].attn.wq.weight
    w0 = wq.detach().clone()
    x, y = fixed_batch(model.cfg.vocab_size)
    model(x, y).backward()
    g = wq.grad.clone()
    for opt in optimizers:
        opt.step()
    if qk_optimizer == "adamw":
        lr = 0.5 * tcfg.adamw_lr
        expected = w0 * (1 - lr * 0.1) - lr * g / (g.abs() + 1e-8)
        # torch's AdamW: a few fp32 operations per entry (moments, bias corrections, sqrt, division, the decay):
        # each entry within a few ulps of its size.
        torch.testing.assert_close(wq.detach(), expected, rtol=ulps("fp32", 4), atol=ulps("fp32", 4) * lr)
    else:
        lr = 0.5 * tcfg.muon_lr
        expected = w0 * (1 - lr * 0.1) - lr * polar_express((1 + tcfg.momentum) * g, dtype=torch.float32)
        # The same fp32 iteration on the same matrix, in another batch (2 ortho_rounding, times lr), and one
        # rounding of w - step on each side (one ulp).
        torch.testing.assert_close(wq.detach(), expected, rtol=ulps("fp32", 1),
                                   atol=2 * ortho_rounding("fp32", 128) * lr)


def test_coverage_check_names_duplicated_parameter():
    model, tcfg = debug_model()
    optimizers, _ = build_optimizers(model, tcfg)
    extra = torch.optim.SGD([model.blocks[0].attn.wq.weight], lr=0.1)
    with pytest.raises(AssertionError, match=r"'blocks\.0\.attn\.wq\.weight' is in 2"):
        check_coverage(model, optimizers + [extra])
    missing = torch.optim.SGD([model.embed.weight], lr=0.1)  # the first model parameter left out:
    with pytest.raises(AssertionError, match=r"'blocks\.0\.attn_norm\.weight' is in 0"):
        check_coverage(model, [missing])


# ---------------------------------------------------------------------------------------------
# Training behaviour
# ---------------------------------------------------------------------------------------------
def fixed_batch(vocab, B=8, T=32):
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (B, T), generator=gen), torch.randint(0, vocab, (B, T), generator=gen)


def train_step(model, optimizers, x, y):
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    for opt in optimizers:
        opt.step()
    return loss.item()


@pytest.mark.parametrize("orthogonalizer", ["polar_express", "newton_schulz"])
def test_few_steps_lower_the_loss(orthogonalizer):
    model, tcfg = debug_model()
    tcfg = dataclasses.replace(tcfg, orthogonalizer=orthogonalizer)
    optimizers, _ = build_optimizers(model, tcfg)  # no precision: fp32 Muon on every host (bf16: test below)
    x, y = fixed_batch(model.cfg.vocab_size)
    losses = [train_step(model, optimizers, x, y) for _ in range(20)]
    with torch.no_grad():
        final = model(x, y).item()
    assert math.isfinite(final)
    # Properties of the initialization and of the optimization, not rounding: the same on both kernel sets.
    assert losses[0] == pytest.approx(math.log(512), abs=0.2)  # near-uniform prediction at init
    assert final < 1.0, losses  # measured: 6.30 -> 0.073 (polar_express), 0.098 (newton_schulz); bf16 Muon the same


def test_build_optimizers_orthogonalizes_in_the_runs_precision():
    """The run's precision alone sets Muon's compute dtype, on every host: fp32 unless asked, bf16 for a bf16 run.
    One step from the same gradients moves each matrix in bf16 by the fp32 step within bf16 rounding."""
    model, tcfg = debug_model()
    assert build_optimizers(model, tcfg)[0][0].ortho_dtype == torch.float32  # no precision given: fp32
    x, y = fixed_batch(model.cfg.vocab_size)
    model(x, y).backward()  # an fp32 forward and backward: the gradients both steps start from
    steps = {}
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        m = copy.deepcopy(model)
        for p, p0 in zip(m.parameters(), model.parameters()):
            p.grad = p0.grad.clone()
        (muon, _), _ = build_optimizers(m, tcfg, precision=precision)
        assert muon.ortho_dtype == dtype
        params = muon.param_groups[0]["params"]
        before = [p.detach().clone() for p in params]
        muon.step()
        steps[precision] = [b - p.detach() for b, p in zip(before, params)]
    # One iteration in bf16 against one in fp32 (n <= d_ff = 256 terms): 0.059 relative; measured 0.011-0.020
    # (3-5 u_bf16). Above two fp32 runs' difference (5.9e-5): the bf16 path really rounded to bf16.
    for a, b in zip(steps["bf16"], steps["fp32"]):
        rel = ((a - b).norm() / b.norm()).item()
        assert 2 * ortho_rounding("fp32", 256) < rel <= ortho_rounding("bf16", 256) + ortho_rounding("fp32", 256)


def test_state_dict_round_trip_resumes_identically():
    model, tcfg = debug_model()
    optimizers, _ = build_optimizers(model, tcfg)
    x, y = fixed_batch(model.cfg.vocab_size)
    for _ in range(3):
        train_step(model, optimizers, x, y)
    for opt in optimizers:  # a schedule scaling the LR mid-run
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * 0.5

    # Checkpoint through bytes, as a real checkpoint would, into a fresh copy.
    model2 = copy.deepcopy(model)
    optimizers2, _ = build_optimizers(model2, tcfg)
    for opt, opt2 in zip(optimizers, optimizers2):
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        buf.seek(0)
        opt2.load_state_dict(torch.load(buf))
    muon2 = optimizers2[0]
    assert all("momentum_buffer" in muon2.state[p] for p in muon2.param_groups[0]["params"])
    assert muon2.param_groups[0]["lr"] == 0.5 * muon2.param_groups[0]["base_lr"] == 0.5 * tcfg.muon_lr

    for _ in range(3):
        train_step(model, optimizers, x, y)
        train_step(model2, optimizers2, x, y)
    for (n, p), (n2, p2) in zip(model.named_parameters(), model2.named_parameters()):  # the same fp32 arithmetic
        assert n == n2 and torch.equal(p, p2), n


def test_muon_chunked_batches_match_unchunked():
    def run(max_numel):
        params = [torch.nn.Parameter(gaussian((64, 32), seed=s)) for s in range(5)]
        for i, p in enumerate(params):
            p.grad = gaussian(p.shape, seed=20 + i)
        opt = Muon(params, lr=0.02, ortho_dtype=torch.float32)
        opt.max_batch_numel = max_numel
        opt.step()
        return [p.detach() for p in params]
    # One batch of 5 vs batches of 2, 2, 1, all fp32: two summation orders (2 ortho_rounding of the [32, 64]
    # iteration, times lr sqrt(2)) and one rounding of p - step each (one ulp). Measured: equal bit for bit.
    for a, b in zip(run(2 ** 26), run(2 * 64 * 32)):
        torch.testing.assert_close(a, b, rtol=ulps("fp32", 1), atol=2 * ortho_rounding("fp32", 64) * 0.02 * 2 ** 0.5)


@pytest.mark.parametrize("model_fields", [{}, {"attn_gate": "elementwise", "d_ff": 1024}, {"n_kv_heads": 2}])
def test_the_update_scale_stays_under_the_config_checks_bound(model_fields):
    """configs.config.RunConfig refuses a rate whose step cannot be a float32 using sqrt(max(d_model, d_ff)) as the
    largest update_scale of any Muon matrix (issue 50): it holds for every Muon matrix of the model, in both modes, so
    no rate the check lets through overflows in Muon's step."""
    from configs import apply_overrides
    from optimizers.muon import UPDATE_SCALES, update_scale
    cfg = apply_overrides(get_preset("debug"), model_fields)
    model = MinimalLLM(cfg.model)
    (muon, _), _ = build_optimizers(model, cfg.train)
    bound = math.sqrt(max(cfg.model.d_model, cfg.model.d_ff))
    shapes = {tuple(p.shape) for g in muon.param_groups for p in g["params"]}
    assert (cfg.model.d_ff, cfg.model.d_model) in shapes  # the FFN's up projection, the tallest
    for mode in UPDATE_SCALES:
        assert max(update_scale(rows, cols, mode) for rows, cols in shapes) <= bound
