"""Issue 54, item 3: which rotary pairs each head uses (research/probing/rotary_use.py), against values known by
hand, in both pairing conventions, with the pairing read from the model."""
import math

import pytest
import torch

from configs.config import ModelConfig
from models import MinimalLLM, Rotary
from research.access.own_adapter import OwnAdapter
from research.probing.metrics import key_moments
from research.probing.rotary_use import (low_freq_share, logit_pair_shares, pair_dims, pair_energy,
                                         rotary_use)


def test_pair_dims_of_each_convention():
    assert [t.tolist() for t in pair_dims(6, "half")] == [[0, 1, 2], [3, 4, 5]]
    assert [t.tolist() for t in pair_dims(6, "interleaved")] == [[0, 2, 4], [1, 3, 5]]
    with pytest.raises(ValueError, match="unknown rotary pairing 'rotate_half'"):
        pair_dims(6, "rotate_half")
    with pytest.raises(ValueError, match="needs vectors"):
        pair_energy(None, "half")


def test_a_head_living_in_one_pair_reads_1_there():
    """Head 0 only in dims 2 and 2 + D/2 (pair 2, half); head 1 evenly in pairs 0 and 5: 0.5 each."""
    D = 16
    x = torch.zeros(2, 3, 5, D)
    g = torch.Generator().manual_seed(0)
    x[0, ..., 2], x[0, ..., 10] = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    x[1, ..., 0] = x[1, ..., 5] = 1.0
    out = rotary_use(x, Rotary(D, 8, 10000.0).frequencies(), 4, "half")
    assert out["pair_share"][0, 2].item() == 1.0 and out["pair_share"][0].sum().item() == 1.0
    assert out["pair_share"][1].tolist() == [0.5, 0, 0, 0, 0, 0.5, 0, 0]
    assert out["dominant_pair"].tolist() == [2, 0]


def test_the_same_keys_in_both_layouts_read_the_same():
    """Dims laid out half (i, i + D/2) and moved to interleaved (2i, 2i + 1): every reading is equal, bit for bit;
    read in the wrong layout they are not."""
    g = torch.Generator().manual_seed(0)
    D = 16
    x = torch.randn(2, 2, 6, D, generator=g) * torch.linspace(0.1, 3, D)
    order = torch.stack(pair_dims(D, "half"), -1).flatten()                      # interleaved dim 2i <- half dim i
    assert order.tolist()[:4] == [0, 8, 1, 9]
    inter = x[..., order]
    assert torch.equal(pair_energy(x, "half"), pair_energy(inter, "interleaved"))
    torch.testing.assert_close(pair_energy(None, "half", moments=key_moments(x)), pair_energy(x, "half"))
    assert not torch.allclose(pair_energy(x, "half"), pair_energy(x, "interleaved"))
    at = torch.tensor([[0, 1], [5, 3], [2, 3]])                                   # (batch row, t, j) per head
    assert torch.equal(logit_pair_shares(x, x, at, "half"), logit_pair_shares(inter, inter, at, "interleaved"))


def test_the_pairs_energy_is_the_same_before_and_after_the_models_rotary_in_its_pairing():
    """A rotation within each pair keeps its energy: read in the model's own pairing (Rotary.pairing, and the
    adapter's rope_pairing) the shares before and after rotary agree; in the other pairing they do not."""
    model = MinimalLLM(ModelConfig(vocab_size=8, n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=8,
                                   max_seq_len=16))
    pairing = OwnAdapter(model).rope_pairing
    assert pairing == model.rotary.pairing == "half"
    x = torch.randn(2, 16, 2, 16, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.1, 3, 16)
    before, after = x.permute(2, 0, 1, 3), model.rotary(x).permute(2, 0, 1, 3)    # [H, B, T, D]
    torch.testing.assert_close(pair_energy(after, pairing), pair_energy(before, pairing), rtol=1e-6, atol=0)
    assert not torch.allclose(pair_energy(after, "interleaved"), pair_energy(before, "interleaved"), rtol=1e-3)


def test_low_frequency_share_by_hand():
    """D = 64, theta 10,000, context 128: pair i's wavelength 2 pi 10,000^(i/32) exceeds 128 from i = 11 (10.47 is
    the crossing): 21 of 32 pairs, so evenly spread energy reads 21/32. With rope_fraction 0.25 only pairs 0-7
    rotate; the 24 others carry no position and count as slow."""
    shares = torch.full((1, 32), 1 / 32, dtype=torch.float64)
    assert low_freq_share(shares, Rotary(64, 8, 10000.0).frequencies(), 128).item() == pytest.approx(21 / 32)
    partial = Rotary(64, 8, 10000.0, fraction=0.25).frequencies()
    assert low_freq_share(shares, partial, 128).item() == pytest.approx(24 / 32)
    assert 2 * math.pi / Rotary(64, 8, 10000.0).frequencies()[11].item() > 128 > \
        2 * math.pi / Rotary(64, 8, 10000.0).frequencies()[10].item()


def test_logit_pair_shares_by_hand_and_grouped_heads():
    """q = k = e_0 + 2 e_1 (half, D = 4: pairs (0, 2) and (1, 3)): q . k = 1 + 4, shares 0.2 and 0.8. Two query
    heads on one KV head both read it; query head 1 = -e_0 + 2 e_1 gives (-1 + 4): -1/3 and 4/3."""
    k = torch.tensor([1.0, 2.0, 0.0, 0.0]).view(1, 1, 1, 4)
    q = torch.stack([k[0], torch.tensor([-1.0, 2.0, 0.0, 0.0]).view(1, 1, 4)])
    shares = logit_pair_shares(q, k, torch.zeros(3, 2, dtype=torch.long), "half")
    torch.testing.assert_close(shares, torch.tensor([[0.2, 0.8], [-1 / 3, 4 / 3]], dtype=torch.float64))
    zero = logit_pair_shares(torch.zeros(1, 1, 1, 4), k, torch.zeros(3, 1, dtype=torch.long), "half")
    assert torch.isnan(zero).all()
