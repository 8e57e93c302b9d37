"""How low-rank each head's keys are, as a compressed key cache would use it: the rank that holds 90% or 99% of
their energy (Loki's Rank@90, Singhania et al. 2024), and the attention error when queries and keys are projected
on the top r directions of the keys. Pure tensor functions, no model; definitions in docs/probing.md.

Shape legend: H heads (Hq query heads, Hkv key/value heads, G = Hq // Hkv), B batch, T sequence, D head size,
N = B * T tokens. The keys' float64 moments (M = K^T K / N [H, D, D], mu [H, D]) are
research.probing.metrics.key_moments', which the probe already has.
"""
from __future__ import annotations

import torch

from research.probing.attention_error import attention_errors
from research.probing.metrics import key_eigvals, key_metrics, key_moments

ENERGY_SHARES = {"rank90": 0.90, "rank99": 0.99}
UNCENTERED = "_uncentered"  # the suffix of the ranks of K^T K / N (without it: of the covariance, Loki's)


def energy_rank(eigvals: torch.Tensor, share: float) -> torch.Tensor:
    """The smallest r whose r largest eigenvalues hold at least `share` of their sum, int64 [...].

    eigvals: [..., D] in ASCENDING order (torch.linalg.eigvalsh's); negative ones (rounding of a positive
    semidefinite matrix) count as 0; all zero gives 0."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    lam = eigvals.to(torch.float64).clamp_min(0).flip(-1)                         # [..., D] descending
    held = lam.cumsum(-1)                                                         # [..., D]: top-r energy
    total = held[..., -1:]
    below = (held < share * total).sum(-1)                                        # prefixes short of the share
    return torch.where(total[..., 0] > 0, below + 1, 0)


@torch.no_grad()
def key_rank(keys: torch.Tensor | None = None, *, moments: tuple[torch.Tensor, torch.Tensor] | None = None,
             eigvals: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """rank90, rank99 of each head's keys from their (population) covariance (Loki's definition), and
    rank90_uncentered, rank99_uncentered from the uncentered second moment K^T K / N: int64 [H] each.

    keys: [H, B, T, D], or their key_moments (M [H, D, D], mu [H, D], float64) where the caller has them: one
    batched eigvalsh of the 2H D x D matrices, no pass over the keys; or those eigenvalues themselves where the
    caller has them (key_eigvals' [2H, D]: M's rows first, C's after), no eigendecomposition."""
    if eigvals is None:
        if moments is None:
            if keys is None:
                raise ValueError("key_rank needs keys [H, B, T, D], their moments (M, mu) or their eigenvalues")
            moments = key_moments(keys)
        eigvals = key_eigvals(moments)
    H = eigvals.shape[0] // 2
    out = {}
    for name, share in ENERGY_SHARES.items():
        ranks = energy_rank(eigvals, share)
        out[name], out[name + UNCENTERED] = ranks[H:], ranks[:H]
    return out


@torch.no_grad()
def ranked_key_metrics(keys: torch.Tensor) -> dict[str, torch.Tensor]:
    """key_metrics and key_rank of each head's keys [H, B, T, D] from one set of float64 moments, [H] each."""
    moments = key_moments(keys.float())
    eigvals = key_eigvals(moments)
    return {**key_metrics(keys, moments, eigvals), **key_rank(eigvals=eigvals)}


@torch.no_grad()
def key_basis(moments: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """[H, D, D] float64: the eigenvectors of each head's uncentered K^T K / N as columns, largest eigenvalue
    first (one torch.linalg.eigh per head); its first r columns span the keys' top-r directions."""
    M, _ = moments
    return torch.linalg.eigh(M)[1].flip(-1)


@torch.no_grad()
def projection_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, ranks, basis: torch.Tensor, *,
                     scale: float | None = None, softcap: float | None = None, block_size: int = 32,
                     dtype: torch.dtype = torch.float32) -> dict[int, dict[str, torch.Tensor]]:
    """The causal attention with queries and keys projected on the top r eigenvectors of the keys' uncentered
    K^T K / N, against the exact one, for each r in `ranks` (the caller's: D/8, D/4, D/2, say).

    q: [Hq, B, T, D], k: [Hkv, B, T, D], v: [Hkv, B, T, Dv] or None, before or after rotary (the basis from the
    same keys' moments); basis: key_basis' [Hkv, D, D] (query head h uses its KV head's, h // G). The projected
    logits are (q U_r) . (k U_r) x scale, scale 1/sqrt(D) as the model's (the r coordinates are used directly: no
    D-sized product). Returns {r: attention_errors' {logit_error, attention_kl, output_error}, float64 [Hq]};
    output_error is the relative error of the attention output, sqrt(sum |o_r - o|^2 / sum |o|^2) over the batch's
    queries."""
    Hkv, D = k.shape[0], q.shape[-1]
    if basis.shape != (Hkv, D, D):
        raise ValueError(f"basis must be [Hkv, D, D] = {(Hkv, D, D)}, got {tuple(basis.shape)}")
    ranks = [int(r) for r in ranks]
    if any(not 1 <= r <= D for r in ranks):
        raise ValueError(f"each rank must be in 1..{D}, got {ranks}")
    U = basis.to(dtype)
    coords = lambda x, r: (x.to(dtype).unflatten(0, (Hkv, -1)).flatten(1, -2) @ U[..., :r]).view(*x.shape[:3], r)
    approx = [(coords(q, r), coords(k, r)) for r in ranks]
    errors = attention_errors(q, k, v, approx, scale=D ** -0.5 if scale is None else scale, softcap=softcap,
                              block_size=block_size, dtype=dtype)
    return dict(zip(ranks, errors))
