"""Which rotary frequencies each head uses (Barbero et al. 2024, "Round and round we go"): the share of the keys' or
queries' energy in each rotary pair, the share in the pairs too slow to turn within the training context, and each
pair's part of a logit. Pure tensor functions, no model: rotary_use, pair_energy, low_freq_share, dominant_pair,
logit_pair_shares.

The pairing ("half" or "interleaved", PAIRINGS) and the frequencies are the model's, passed in, never assumed.
Shape legend: H heads (Hq query heads, Hkv key/value heads, G = Hq // Hkv), B batch, T sequence, D head size,
P = D/2 pairs. Definitions: docs/probing.md, "Rotary frequency use".
"""
from __future__ import annotations

import math

import torch

from research.results.vocabulary import ROTARY_PAIRINGS

PAIRINGS = ROTARY_PAIRINGS


def pair_dims(D: int, pairing: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two dims of each rotary pair, int64 [P] each: (i, i + D/2) for half, (2i, 2i + 1) for interleaved."""
    if pairing not in PAIRINGS:
        raise ValueError(f"unknown rotary pairing {pairing!r}: choose one of {', '.join(PAIRINGS)}")
    if D % 2:
        raise ValueError(f"rotary pairs need an even head size, got D={D}")
    i = torch.arange(D // 2)
    return (i, i + D // 2) if pairing == "half" else (2 * i, 2 * i + 1)


@torch.no_grad()
def pair_energy(x: torch.Tensor | None, pairing: str, *, moments: tuple[torch.Tensor, torch.Tensor] | None = None,
                energy: torch.Tensor | None = None) -> torch.Tensor:
    """[H, P] float64: each pair's share of each head's energy, sum over the tokens of the pair's two squared
    components over the sum of all D. x: keys or queries [H, B, T, D] (squares summed in float32, then float64), or
    None with their key_moments (M [H, D, D], mu) given, whose diagonal is that energy / N (no pass over the
    vectors), or with `energy` [H, D] given, any positive multiple of it per head (the sums of several kinds of
    vectors at once, say). A head of zero vectors reads 0."""
    if energy is not None:
        sq = energy.to(torch.float64)                                             # [H, D]
    elif moments is not None:
        sq = moments[0].diagonal(dim1=1, dim2=2).to(torch.float64)                # [H, D]
    elif x is not None:
        sq = x.detach().float().square().sum((1, 2)).double()                     # [H, D]
    else:
        raise ValueError("pair_energy needs vectors [H, B, T, D] or their moments (M, mu)")
    a, b = (i.to(sq.device) for i in pair_dims(sq.shape[-1], pairing))
    per_pair = sq[:, a] + sq[:, b]                                                # [H, P]
    total = per_pair.sum(-1, keepdim=True)
    return torch.where(total > 0, per_pair / total, 0.0)


def low_freq_share(shares: torch.Tensor, frequencies: torch.Tensor, context: int) -> torch.Tensor:
    """[H]: the share of energy (pair_energy's [H, P]) in the pairs whose wavelength 2 pi / f_i exceeds `context`
    (the training context length, in tokens): pairs that never turn a full circle within a sequence, a pair that
    does not rotate (f_i = 0) included. frequencies: [P] radians per position."""
    f = frequencies.to(torch.float64).to(shares.device)
    slow = f * context < 2 * math.pi                                              # 2 pi / f > context
    return (shares * slow).sum(-1)


def dominant_pair(shares: torch.Tensor) -> torch.Tensor:
    """[H] int64: the pair holding the most energy (the first where tied)."""
    return shares.argmax(-1)


@torch.no_grad()
def logit_pair_shares(q: torch.Tensor, k: torch.Tensor, at: torch.Tensor, pairing: str) -> torch.Tensor:
    """[Hq, P] float64: each pair's part of the logit q_t . k_j of each query head at its (batch row, query t,
    key j) = at[:, h] (attention_metrics' logit_at [3, Hq]: where the largest logit is), as a share of the whole
    dot product: (q_a k_a + q_b k_b) / (q . k) for the pair's dims (a, b). Shares sum to 1 and may be negative
    or above 1 where pairs pull apart; NaN where q . k = 0. q: [Hq, B, T, D], k: [Hkv, B, T, D] (query head h
    reads KV head h // G); after rotary they split the model's logit."""
    Hq, Hkv, D = q.shape[0], k.shape[0], q.shape[-1]
    b, t, j = at.to(q.device)
    heads = torch.arange(Hq, device=q.device)
    qv = q[heads, b, t].double()                                                  # [Hq, D]
    kv = k[heads // (Hq // Hkv), b, j].double()                                   # [Hq, D]
    prod = qv * kv
    da, db = pair_dims(D, pairing)
    per_pair = prod[:, da.to(q.device)] + prod[:, db.to(q.device)]                # [Hq, P]
    total = prod.sum(-1, keepdim=True)
    return torch.where(total != 0, per_pair / total, math.nan)


@torch.no_grad()
def rotary_use(x: torch.Tensor | None, frequencies: torch.Tensor, context: int, pairing: str, *,
               moments: tuple[torch.Tensor, torch.Tensor] | None = None,
               energy: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The frequency use of each head's keys or queries x [H, B, T, D] (or None and their key_moments, or their
    energy [H, D]: pair_energy's): pair_share [H, P] (pair_energy), low_freq_share [H] and dominant_pair [H]
    (int64)."""
    shares = pair_energy(x, pairing, moments=moments, energy=energy)
    return {"pair_share": shares, "low_freq_share": low_freq_share(shares, frequencies, context),
            "dominant_pair": dominant_pair(shares)}
