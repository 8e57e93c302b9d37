"""The benchmark's plain reference step computes what the project computes."""
import dataclasses

import pytest
import torch

from configs import get_preset
from models import MinimalLLM
from optimizers.muon import newton_schulz
from research.speed.reference import ReferenceLM, newton_schulz5
from tests.tolerances import ortho_rounding, sum_rel_tol


@pytest.mark.parametrize("qk_norm", ["learned", "frozen", "none"])
def test_reference_model_gives_the_project_models_loss_and_gradients(qk_norm):
    torch.manual_seed(0)
    cfg = dataclasses.replace(get_preset("debug").model, qk_norm=qk_norm)
    model = MinimalLLM(cfg)
    with torch.no_grad():  # gains away from 1, so a mismatched norm would show
        for name, p in model.named_parameters():
            if p.ndim == 1 and p.requires_grad:
                p.uniform_(0.5, 1.5)
    ref = ReferenceLM(cfg).load_from(model)
    idx = torch.randint(0, cfg.vocab_size, (2, 17))
    ours, theirs = model(idx[:, :-1], idx[:, 1:]), ref(idx[:, :-1], idx[:, 1:])
    # Both fp32, summing in their own orders; the longest reduction is the logsumexp over the vocabulary (hidden
    # ones are <= d_ff terms): 2 sum_rel_tol(V) = 4.3e-6. Measured: loss 0.6 EPS apart, gradient 3.6 EPS of its max.
    tol = 2 * sum_rel_tol("fp32", cfg.vocab_size)
    assert theirs.item() == pytest.approx(ours.item(), rel=tol)
    ours.backward()
    theirs.backward()
    want = model.blocks[1].attn.wk.weight.grad
    # atol: gradient entries cancel, so their rounding is relative to the largest entry's scale
    torch.testing.assert_close(ref.blocks[1].attn.k.weight.grad, want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])  # bf16: the benchmark's default (ReferenceMuon)
def test_reference_newton_schulz_is_the_projects_on_one_matrix(precision):
    G = torch.randn(64, 96, generator=torch.Generator().manual_seed(0))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    # Both in `precision`, each its own order of operations: 5 steps x 3 matmuls of <= 96 terms, accumulated in fp32
    # and rounded to `precision` (ortho_rounding), on entries <= the spectral norm ~1, twice (the reference's 2
    # more roundings of G and its norm are within that). fp32: 4.9e-5, measured 5.4e-7; bf16: 0.117, measured 0.018.
    tol = 2 * ortho_rounding(precision, 96)
    torch.testing.assert_close(newton_schulz5(G, dtype), newton_schulz(G, 5, dtype), rtol=0, atol=tol)
