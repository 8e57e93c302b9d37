"""models/loss.py: the chunked LM head + cross-entropy against the plain two-step loss."""
import math

import pytest
import torch
import torch.nn.functional as F

from models.loss import linear_cross_entropy


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
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    (2.5 * loss).backward()  # a non-unit upstream gradient is applied to both inputs
    gh, gW = h.grad.clone(), W.grad.clone()
    h.grad = W.grad = None
    (2.5 * ref).backward()
    torch.testing.assert_close(gh, h.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(gW, W.grad, rtol=1e-5, atol=1e-7)


def test_uniform_logits_give_log_vocab():
    """W = 0: every logit is 0, so the loss is ln(V) whatever the targets, and dL/dh = 0."""
    h = torch.randn(10, 4, requires_grad=True)
    W = torch.zeros(8, 4, requires_grad=True)
    loss = linear_cross_entropy(h, W, torch.arange(10) % 8, chunk_elements=16)
    assert loss.item() == pytest.approx(math.log(8), rel=1e-7)
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
    assert loss.item() == pytest.approx(ref.item(), rel=1e-3)
    loss.backward()
    gW = W.grad.clone()
    W.grad = None
    ref.backward()
    assert W.grad.dtype == gW.dtype == torch.float32
    torch.testing.assert_close(gW, W.grad, rtol=0.02, atol=2e-4)


def test_no_grad_computes_only_the_loss():
    torch.manual_seed(0)
    h, W, y = torch.randn(8, 4), torch.randn(6, 4), torch.randint(0, 6, (8,))
    with torch.no_grad():
        loss = linear_cross_entropy(h, W, y)
    assert not loss.requires_grad
    assert loss.item() == pytest.approx(_plain(h, W, y).item(), rel=1e-6)
