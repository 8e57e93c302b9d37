"""A Hugging Face model's RoPE as its adapter describes it: the rotation reproduces the model's own rotated keys, the
inverse undoes it, rotary use reads the pairs where they are (partial rotary too), and the HF probe records rank
and rotary use as the training probe does."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from research.probing.hf import HFKeyProbe
from research.probing.hf.model import adapter_for
from research.probing.hf.rotary import AdapterRope, RopeError, head_rotary_use
from tests.research.inspection.builders import make_hf


class _Keys:
    """A sink that keeps the keys before rotary (k_norm, else k_proj) and the rotated ones the attention reads."""

    def __init__(self):
        self.pre, self.post = {}, {}

    def on_state(self, l, h):
        pass

    def on_keys(self, i, site, k):
        if site == "k_norm" or i not in self.pre:
            self.pre[i] = k

    def on_attention(self, i, q, k, v, *rest):
        self.post[i] = k.transpose(0, 1)


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt_neox"])
def test_the_rotation_is_the_models_own(family):
    """RoPE of the keys before rotary gives the keys the model's attention reads (all dims, partial rotary's
    unrotated ones unchanged), and the inverse gives back the keys before rotary: float32, a few roundings."""
    model = make_hf(family).float().eval()
    adapter = adapter_for(model)
    sink = _Keys()
    with torch.no_grad(), adapter.capture(sink):
        adapter.forward(torch.randint(3, 290, (2, 24), generator=torch.Generator().manual_seed(0)))
    for i in range(adapter.n_layers):
        rope, pre, post = AdapterRope(adapter, i), sink.pre[i], sink.post[i]
        scale = post.abs().max().item()
        assert (rope(pre) - post).abs().max().item() <= 1e-6 * scale
        assert (rope.inverse(post) - pre).abs().max().item() <= 1e-6 * scale
        R = adapter.rotary_dims
        assert torch.equal(rope(pre)[..., R:], pre[..., R:])


def _adapter(D, R, theta=10000.0, pairing="half"):
    f = theta ** (-torch.arange(0, R, 2).float() / R)
    return SimpleNamespace(head_dim=D, rotary_dims=R, rope_pairing=pairing, family="toy",
                           rotary_frequencies=lambda i: f, head_dim_of=lambda i: D, rotary_dims_of=lambda i: R)


def test_rotary_use_finds_the_pair_of_a_partial_rotary_head():
    """D = 16, 4 dims rotated (pairs (0, 2), (1, 3) in the half pairing): energy in dims 0 and 2 is pair 0, which
    turns once per 2 pi tokens (fast: low_freq_share 0); energy in unrotated dim 5 is pair 3 (the unrotated dims
    4..15 pair as (4, 10), (5, 11), ...), frequency 0: all slow."""
    rope = AdapterRope(_adapter(16, 4), 0)
    assert rope.order.tolist() == [0, 1, 4, 5, 6, 7, 8, 9, 2, 3, 10, 11, 12, 13, 14, 15]
    assert rope.pair_frequencies.tolist() == pytest.approx([1.0, 0.01, 0, 0, 0, 0, 0, 0])
    energy = torch.zeros(2, 16, dtype=torch.float64)
    energy[0, 0], energy[0, 2] = 3.0, 1.0
    energy[1, 5] = 2.0
    use = head_rotary_use(energy, rope, context=128)
    assert use["pair_share"][0, 0].item() == 1.0 and use["pair_share"][1, 3].item() == 1.0
    assert use["dominant_pair"].tolist() == [0, 3]
    assert use["low_freq_share"].tolist() == [0.0, 1.0]


def test_a_model_without_rope_is_refused():
    with pytest.raises(RopeError, match="no RoPE"):
        AdapterRope(_adapter(16, 0, pairing=None), 0)


def test_the_hf_probe_records_rank_and_rotary_use():
    """Llama, D = 16, theta 10^4, context 128: keys living in pair 3 (dims 3 and 11 of each KV head's k_proj rows)
    read pair_share 1 there, dominant pair 3, and low_freq_share 1 (wavelength 2 pi x 10^(4 x 6/16) = 199 tokens
    > 128); their covariance has rank 2 at most, so rank90 <= 2; the record names the pairing and context."""
    model = make_hf("llama").float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.self_attn.k_proj.weight.view(2, 16, 64)
            keep = torch.zeros(16, dtype=torch.bool)
            keep[[3, 11]] = True
            w[:, ~keep] = 0
    rec = HFKeyProbe(torch.randint(3, 290, (2, 24), generator=torch.Generator().manual_seed(1)))(model)
    assert rec["rotary"] == {"pairing": "half", "context": 128, "rotary_dims": 16}
    assert 2 * math.pi / 10000 ** (-6 / 16) > 128
    for layer in rec["layers"]:
        k = layer["k_norm"]
        assert k["dominant_pair"] == [3, 3] and k["low_freq_share"] == [1.0, 1.0]
        assert [row[3] for row in layer["pair_share"]["k_norm"]] == [1.0, 1.0]
        assert all(1 <= r <= 2 for r in k["rank90"] + layer["k_rope"]["rank90"])
        assert len(layer["attn"]["q_low_freq_share"]) == 4 and len(layer["pair_share"]["logit"][0]) == 8
