"""The probe's exact savings (issue 66) give the records the longer routes gave, bit for bit: ranks read from the
spectra's eigenvalues instead of a second eigendecomposition, the metrics read out with one tolist() per length,
the attention's float64 logit sums without a float64 copy of each block."""
import dataclasses
import json

import pytest
import torch

from configs import get_preset
from models import MinimalLLM
from research.probing import metrics
from research.probing.key_rank import ENERGY_SHARES, UNCENTERED, energy_rank, key_rank
from research.probing.metrics import key_eigvals, key_moments, layer_means
from research.probing.probe import KeyProbe, ModelRope, as_lists, lists_and_means, site_metrics
from tests.helpers import probe_tensors


def perturbed(preset: str, qk_norm: str, seed: int = 0) -> MinimalLLM:
    """The preset's model with every weight moved off its init (gains off 1: k_hat is measured and differs)."""
    torch.manual_seed(seed)
    model = MinimalLLM(dataclasses.replace(get_preset(preset).model, qk_norm=qk_norm))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def second_eigendecomposition(moments) -> dict[str, torch.Tensor]:
    """key_rank as it was: its own eigvalsh of the covariances and second moments."""
    M, mu = moments
    H = M.shape[0]
    eig = torch.linalg.eigvalsh(torch.cat([M - mu.unsqueeze(2) * mu.unsqueeze(1), M]))
    out = {}
    for name, share in ENERGY_SHARES.items():
        ranks = energy_rank(eig, share)
        out[name], out[name + UNCENTERED] = ranks[:H], ranks[H:]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_ranks_from_the_spectra_eigenvalues_are_those_of_their_own_eigendecomposition(seed):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(3, 4, 50, 16, generator=g) @ torch.randn(16, 16, generator=g)  # correlated: ranks < D
    moments = key_moments(keys)
    want = second_eigendecomposition(moments)
    for got in (key_rank(eigvals=key_eigvals(moments)), key_rank(moments=moments), key_rank(keys)):
        assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in want.items()}


def test_the_sites_ranks_read_the_spectra_as_a_second_eigendecomposition_would():
    model = perturbed("debug", "learned")
    seen = probe_tensors(model, torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(2)))
    for i, t in enumerate(seen):
        records, _ = site_metrics(t, model.blocks[i].attn.k_norm.weight, ModelRope(model.rotary), exact=True)
        for site in ("k_norm", "k_rope"):  # the moments the ranks were read from before: each site's own
            want = second_eigendecomposition(key_moments(t[site].float()))
            assert {k: records[site][k].tolist() for k in want} == {k: v.tolist() for k, v in want.items()}


@pytest.mark.parametrize("H", [1, 2, 3, 8, 16, 33])
def test_one_readout_gives_the_lists_and_means_of_one_readout_each(H):
    g = torch.Generator().manual_seed(H)
    records = {"k_norm": {"a": torch.randn(H, generator=g, dtype=torch.float64) * 100,
                          "rank": torch.randint(1, 64, (H,), generator=g),
                          "b": torch.rand(H, generator=g)},
               "attn": {"c": torch.randn(2 * H, generator=g), "by_position": torch.rand(2 * H, 7, generator=g),
                        "d": torch.randn(2 * H, generator=g, dtype=torch.float64).exp()}}
    lists, means = lists_and_means(records)
    want_means = {f"{name}.{k}": v for name, m in records.items() for k, v in layer_means(m).items()}
    assert json.dumps(lists) == json.dumps({name: as_lists(m) for name, m in records.items()})
    assert json.dumps(means) == json.dumps(want_means)  # the same floats, in the same order


def float64_copy(seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention's logit sums as they were: over a float64 copy of the block."""
    d = seen.double()
    return d.sum((1, 3)), d.square_().sum((1, 3))


@pytest.mark.parametrize("preset, qk_norm", [pytest.param("tiny", "learned", marks=pytest.mark.slow),
                                             pytest.param("tiny", "none", marks=pytest.mark.slow),
                                             ("debug", "learned"), ("debug", "frozen")])
def test_the_probe_records_what_the_longer_routes_recorded(preset, qk_norm, monkeypatch):
    """The whole record, with the logit sums over a float64 copy against without: bit for bit (tiny: the first
    command's model and probe batch shape)."""
    cfg = get_preset(preset)
    model = perturbed(preset, qk_norm)
    ids = torch.randint(0, cfg.model.vocab_size, (cfg.probe.probe_batch, cfg.data.seq_len),
                        generator=torch.Generator().manual_seed(1))
    probe = KeyProbe(ids, "fp32", targets_BT=torch.roll(ids, -1, 1))

    def record():
        rec, loss = probe.measure(model, loss_rows=4)
        rec.pop("probe_time_s")
        return json.dumps([rec, loss])
    now = record()
    monkeypatch.setattr(metrics, "_logit_sums", float64_copy)
    assert record() == now
