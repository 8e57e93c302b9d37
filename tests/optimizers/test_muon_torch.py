"""The project's Muon against torch.optim.Muon (torch 2.13, torch/optim/_muon.py), in both update-scale modes.

Same hyper-parameters on both sides: lr, momentum, Nesterov or not, decoupled weight decay, 5 Newton-Schulz steps
with the coefficients (3.4445, -4.7750, 2.0315) (asserted equal below) and eps 1e-7. What differs, and how each
test compares like with like:

- Scale. `muon_update_scale none` is torch's adjust_lr_fn "original", sqrt(max(1, rows / cols)), and
  `match_rms_adamw` is torch's "match_rms_adamw", 0.2 sqrt(max(rows, cols)): the same formulas (asserted below).
- Momentum. torch keeps the average of the gradients (buf.lerp_(grad, 1 - momentum), Nesterov
  grad.lerp(buf, momentum)), the project their sum (buf = momentum buf + grad, Nesterov grad + momentum buf):
  torch's buffer and update are (1 - momentum) times the project's. Newton-Schulz first divides by the Frobenius
  norm, so the scale drops out, up to eps.
- Normalization eps. torch divides by max(||G||_F, eps), the project by ||G||_F + eps: relative 1e-7 / ||G||_F,
  below fp32 rounding for these gradients (||G||_F > 1).
- Precision. torch always iterates in bf16 (grad.bfloat16()), normalizing after the cast, in bf16; the project
  iterates in its ortho_dtype (fp32 in an fp32 run), normalizing in fp32 before the cast. So:
  1. the whole update in fp32: torch.optim.Muon with its one cast to bf16 turned into an fp32 copy (everything
     else its own code), against the project's Muon in fp32, within fp32 rounding;
  2. the whole update as shipped: torch.optim.Muon unchanged against the project's Muon in bf16, within bf16
     rounding (the two round the normalized input differently, so exact agreement is not expected);
  3. the iteration alone on a matrix whose normalization is exact in bf16 (Frobenius norm 1, entries +-2^-k):
     both start from the same bf16 matrix and do the same bf16 matmuls (measured: equal bit for bit here).
Polar Express (the project's default orthogonalizer) has no counterpart in torch; these tests use newton_schulz.
"""
from __future__ import annotations

import pytest
import torch
import torch.optim._muon as torch_muon

from optimizers import Muon, newton_schulz
from optimizers.muon import NEWTON_SCHULZ_COEFFS, update_scale
from tests.tolerances import ortho_rounding, ulps

SHAPES = [(64, 32), (32, 64), (48, 48)]  # tall, wide, square
STEPS = 3
MODES = {"none": "original", "match_rms_adamw": "match_rms_adamw"}  # the project's mode -> torch's adjust_lr_fn


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # small matmuls on a shared machine
    yield
    torch.set_num_threads(before)


def make_params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(0.1 * torch.randn(*s, generator=g)) for s in SHAPES]


def grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)  # ||G||_F ~ 40: the eps terms are below fp32 rounding
    return [torch.randn(*s, generator=g) for s in SHAPES]


def run(make_optimizer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(parameters before, after STEPS steps on fixed gradients) of the optimizer make_optimizer(params)."""
    params = make_params()
    before = [p.detach().clone() for p in params]
    opt = make_optimizer(params)
    for step in range(STEPS):
        for p, g in zip(params, grads(step)):
            p.grad = g
        opt.step()
    return before, [p.detach().clone() for p in params]


def hyper(nesterov: bool) -> dict:
    return dict(lr=0.02, momentum=0.9, nesterov=nesterov, weight_decay=0.1)


def ours(mode: str, nesterov: bool, dtype: torch.dtype):
    return lambda params: Muon(params, orthogonalizer="newton_schulz", ortho_steps=5, ortho_dtype=dtype,
                               update_scale=mode, **hyper(nesterov))


def torchs(mode: str, nesterov: bool):
    return lambda params: torch.optim.Muon(params, adjust_lr_fn=MODES[mode], ns_steps=5, eps=1e-7,
                                           ns_coefficients=NEWTON_SCHULZ_COEFFS, **hyper(nesterov))


def test_the_same_iteration_constants_and_scales_as_torch():
    assert NEWTON_SCHULZ_COEFFS == (torch_muon.DEFAULT_A, torch_muon.DEFAULT_B, torch_muon.DEFAULT_C)
    assert torch_muon.EPS == 1e-7  # the project's eps too (optimizers/muon.py, _iterate_quintic)
    for rows, cols in [*SHAPES, (128, 512), (512, 128)]:
        for mode, theirs in MODES.items():  # the same expression: equal bit for bit
            assert update_scale(rows, cols, mode) == torch_muon._adjust_lr(1.0, theirs, torch.Size((rows, cols)))


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_muon_in_fp32_equals_torch_muon_with_its_iteration_in_fp32(monkeypatch, mode, nesterov):
    before, mine = run(ours(mode, nesterov, torch.float32))
    # torch's one cast to bf16 becomes a copy in fp32 (a copy: torch normalizes it in place, and without
    # Nesterov it is the momentum buffer itself).
    monkeypatch.setattr(torch.Tensor, "bfloat16", lambda t: t.to(torch.float32, copy=True))
    _, theirs = run(torchs(mode, nesterov))
    monkeypatch.undo()
    _, wrong_mode = run(ours("match_rms_adamw" if mode == "none" else "none", nesterov, torch.float32))
    for p0, a, b, c in zip(before, mine, theirs, wrong_mode):
        rows, cols = p0.shape
        # Each step: one fp32 iteration on each side (2 ortho_rounding relative to the update's spectral norm,
        # ~1, which bounds its entries), times lr and the scale; each side rounds p - step once (one ulp of p).
        # Summed over the steps (the gradients are fixed, so the differences do not feed back). Measured: at
        # most 6.0e-8 absolute, 40x below the tolerance.
        atol = STEPS * 2 * ortho_rounding("fp32", min(rows, cols)) * 0.02 * update_scale(rows, cols, mode)
        torch.testing.assert_close(a, b, rtol=ulps("fp32", STEPS), atol=atol)
        assert (c - b).abs().max() > 100 * atol  # the other scale mode is far outside it: the test can fail


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_muon_in_bf16_matches_torch_muon_as_shipped(mode, nesterov):
    before, mine = run(ours(mode, nesterov, torch.bfloat16))
    _, theirs = run(torchs(mode, nesterov))
    other = "match_rms_adamw" if mode == "none" else "none"
    _, wrong_mode = run(ours(other, nesterov, torch.bfloat16))
    for p0, a, b, c in zip(before, mine, theirs, wrong_mode):
        tol = ortho_rounding("bf16", min(p0.shape))
        # Both iterate in bf16 from inputs rounded differently (normalized then cast, or cast then normalized
        # in bf16): each step's update may differ by ortho_rounding("bf16") relative to its size (0.059 for
        # n <= 64). Measured: 0.012-0.015 of the parameters' total change.
        rel = ((a - b).norm() / (b - p0).norm()).item()
        assert rel <= tol, rel
        ratio = update_scale(*p0.shape, other) / update_scale(*p0.shape, mode)
        if abs(ratio - 1) > 2 * tol:  # the other mode's step is that much larger or smaller: the test can fail
            assert ((c - b).norm() / (b - p0).norm()).item() > tol


@pytest.mark.parametrize("shape", [(32, 32), (16, 64), (64, 16), (128, 32)])
def test_newton_schulz_in_bf16_equals_torchs_iteration(shape):
    rows, cols = shape
    signs = torch.randint(0, 2, shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
    G = signs.float() / (rows * cols) ** 0.5  # entries +-2^-k and ||G||_F = 1: normalized exactly in bf16 too
    mine = newton_schulz(G, steps=5, dtype=torch.bfloat16)
    theirs = torch_muon._zeropower_via_newtonschulz(G, NEWTON_SCHULZ_COEFFS, 5, 1e-7)
    assert theirs.dtype == torch.bfloat16 and mine.dtype == torch.float32  # the project returns G's dtype
    # The same bf16 matmuls on the same bf16 start: measured equal bit for bit; another CPU's bf16 kernels
    # may sum in another order (ortho_rounding("bf16") relative to the spectral norm, ~1).
    torch.testing.assert_close(mine, theirs.float(), rtol=0, atol=ortho_rounding("bf16", min(shape)))
