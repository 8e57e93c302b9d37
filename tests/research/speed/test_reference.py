"""The benchmark's plain reference step computes what the project computes."""
import dataclasses

import pytest
import torch

from configs import get_preset
from models import MinimalLLM
from optimizers.muon import newton_schulz
from research.speed.reference import ReferenceLM, newton_schulz5


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
    assert theirs.item() == pytest.approx(ours.item(), rel=1e-6)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(ref.blocks[1].attn.k.weight.grad, model.blocks[1].attn.wk.weight.grad,
                               rtol=1e-4, atol=1e-7)


def test_reference_newton_schulz_is_the_projects_on_one_matrix():
    G = torch.randn(64, 96, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(newton_schulz5(G, torch.float32), newton_schulz(G, 5, torch.float32),
                               rtol=1e-4, atol=1e-5)
