"""models/loss.py: the chunked LM head + cross-entropy against the plain two-step loss."""
import math

import pytest
import torch
import torch.nn.functional as F

from models.loss import linear_cross_entropy
from tests.tolerances import sum_rel_tol, ulps


def _plain(h, W, y):
    return F.cross_entropy(F.linear(h, W).float(), y)


@pytest.mark.parametrize("chunk_elements", [7 * 50, 64 * 50, 10 ** 9])  # ragged chunks, several, one
def test_loss_and_gradients_equal_the_plain_loss_in_fp32(chunk_elements):
    torch.manual_seed(0)
    h = torch.randn(64, 16, requires_grad=True)
    W = torch.randn(50, 16, requires_grad=True)
    y = torch.randint(0, 50, (64,))
    loss = linear_cross_entropy(h, W, y, chunk_elements)
    ref = _plain(h, W, y)
    assert loss.dtype == torch.float32
    # Both fp32 in their own orders; the longest reduction is over the N = 64 rows (the mean of the CEs, dL/dW;
    # logsumexp and dL/dh sum V = 50): 2 sum_rel_tol(64) = 2.9e-6. Measured: loss 0.8 EPS, gradients <= 4.1e-7 of max.
    tol = 2 * sum_rel_tol("fp32", 64)
    assert loss.item() == pytest.approx(ref.item(), rel=tol)
    (2.5 * loss).backward()  # a non-unit upstream gradient is applied to both inputs
    gh, gW = h.grad.clone(), W.grad.clone()
    h.grad = W.grad = None
    (2.5 * ref).backward()
    # atol: gradient entries cancel, so their rounding is relative to the largest entry's scale
    torch.testing.assert_close(gh, h.grad, rtol=tol, atol=tol * h.grad.abs().max().item())
    torch.testing.assert_close(gW, W.grad, rtol=tol, atol=tol * W.grad.abs().max().item())


def test_uniform_logits_give_log_vocab():
    """W = 0: every logit is 0, so the loss is ln(V) whatever the targets, and dL/dh = 0."""
    h = torch.randn(10, 4, requires_grad=True)
    W = torch.zeros(8, 4, requires_grad=True)
    loss = linear_cross_entropy(h, W, torch.arange(10) % 8, chunk_elements=16)
    # ln 8 by hand; fp32 rounds the log (<= 1 ulp), 3 of the 5 chunk additions and the mean: <= 3 EPS (measured 0.02)
    assert loss.item() == pytest.approx(math.log(8), rel=ulps("fp32", 4))
    loss.backward()
    assert torch.count_nonzero(h.grad) == 0


def test_bf16_autocast_follows_the_plain_loss_within_bf16_rounding():
    torch.manual_seed(0)
    h = torch.randn(32, 64, requires_grad=True)
    W = (0.1 * torch.randn(100, 64)).requires_grad_()
    y = torch.randint(0, 100, (32,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(h, W, y, chunk_elements=1000)
        ref = _plain(h, W, y)
    # Both sides round the same 64-term fp32 dot products to bf16 logits: equal, or where two summation orders
    # straddle a rounding, one bf16 spacing (<= EPS |logit|) apart; a row's CE moves by at most two such (its target
    # logit and the logsumexp). Measured: equal on both kernel sets.
    logits = (h @ W.T).detach()
    assert loss.item() == pytest.approx(ref.item(), abs=ulps("bf16", 2) * logits.abs().max().item())
    loss.backward()
    gW = W.grad.clone()
    W.grad = None
    ref.backward()
    assert W.grad.dtype == gW.dtype == torch.float32
    # Each entry of dL/dW sums N = 32 rows' terms |softmax - onehot| |h| / N: fused rounds 4 chunk sums to bf16, plain
    # the whole sum once, each <= u |sum| (<= EPS in all), and their softmaxes may round to bf16 apart (<= EPS more).
    # Measured: <= 0.82 EPS_bf16 of the terms, over seeds 0-5 and both kernel sets.
    with torch.no_grad():
        err = torch.softmax(logits, -1) - F.one_hot(y, 100)
        terms = err.abs().T @ h.detach().abs() / len(y)
    assert ((gW - W.grad).abs() <= ulps("bf16", 2) * terms).all(), ((gW - W.grad).abs() / terms).max()
    W.grad = None
    linear_cross_entropy(h, W, y, chunk_elements=1000).backward()  # without autocast: fp32 throughout
    assert ((gW - W.grad).abs() > 2 * sum_rel_tol("fp32", 32) * terms).any()  # the autocast run did round to bf16


def test_no_grad_computes_only_the_loss():
    torch.manual_seed(0)
    h, W, y = torch.randn(8, 4), torch.randn(6, 4), torch.randint(0, 6, (8,))
    with torch.no_grad():
        loss = linear_cross_entropy(h, W, y)
    assert not loss.requires_grad
    # Both fp32, the mean over N = 8 rows the longest reduction: 1.4e-6 (measured 0.6 EPS)
    assert loss.item() == pytest.approx(_plain(h, W, y).item(), rel=2 * sum_rel_tol("fp32", 8))
