"""RoPE as it runs, measured from one layer's keys before and after rotation: the pairing under which every pair
keeps its norm, each pair's frequency from its phase along the positions, the dims that pass unrotated, and the θ
ladder fitted to the frequencies (docs/audit.md, "RoPE"). Pure tensor functions, float64.

    layout = measure_rope(pre_HBTD, post_HBTD)      # {"pairing", "pairs", "frequency", "scaling", "norm_error"}
    theta, intercept = fit_theta(frequency, denominator)
"""
from __future__ import annotations

import math

import torch


def pairings(D: int, rotated: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Candidate pairings of a head's D dims: name -> (first dims, second dims) of each pair.
    half: dim j with j + D/2 (this project's Rotary, transformers' rotate_half over the whole head); half_R: j with
    j + R/2 over the first R = `rotated` dims (transformers' partial rotary); interleaved: 2j with 2j + 1."""
    out = {"half": (torch.arange(D // 2), torch.arange(D // 2) + D // 2),
           "interleaved": (torch.arange(0, D, 2), torch.arange(1, D, 2))}
    if 0 < rotated < D and rotated % 2 == 0:
        out[f"half_{rotated}"] = (torch.arange(rotated // 2), torch.arange(rotated // 2) + rotated // 2)
    return out


def _pair_norms(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(x[..., a] ** 2 + x[..., b] ** 2)                         # [..., pairs]


def phases(pre: torch.Tensor, post: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The angle each pair turned by at each position [pairs, T], in (-pi, pi]: the weighted circular mean over
    heads and sequences of the angle from the pair's vector before to after (weighted by their norms); and the
    weight behind each angle [pairs, T] (0 where every key is zero there: a token whose embedding row is zero)."""
    x, y, u, v = pre[..., a], pre[..., b], post[..., a], post[..., b]           # [H, B, T, pairs]
    dot, cross = (x * u + y * v).sum((0, 1)), (x * v - y * u).sum((0, 1))         # [T, pairs]
    return torch.atan2(cross, dot).T, torch.hypot(dot, cross).T


def _wrap(x: torch.Tensor) -> torch.Tensor:
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


def frequencies(phase_PT: torch.Tensor, weight_PT: torch.Tensor | None = None) -> torch.Tensor:
    """Each pair's angle per position [pairs] from its phases [pairs, T] at positions 0..T-1: a first estimate
    from the steps between consecutive positions (wrapped into (-pi, pi]: frequencies below pi per position), the
    phases unwrapped around it, and their least-squares slope through the origin. weight: positions whose weight is
    below 1e-9 of the pair's largest carry no phase (their keys are zero) and are left out."""
    T = phase_PT.shape[1]
    keep = torch.ones_like(phase_PT, dtype=torch.bool) if weight_PT is None else \
        weight_PT > 1e-9 * weight_PT.amax(1, keepdim=True).clamp_min(1e-300)
    both = (keep[:, 1:] & keep[:, :-1]).to(phase_PT.dtype)
    first = (_wrap(phase_PT.diff(dim=1)) * both).sum(1) / both.sum(1).clamp_min(1)          # [pairs]
    t = torch.arange(T, dtype=phase_PT.dtype)
    unwrapped = first[:, None] * t + _wrap(phase_PT - first[:, None] * t)
    w = keep.to(phase_PT.dtype) * t
    return (unwrapped * w).sum(1) / (w * t).sum(1).clamp_min(1e-300)


def measure_rope(pre: torch.Tensor, post: torch.Tensor, declared_rotated: int = 0) -> dict:
    """The rotation that takes keys `pre` to `post` ([H, B, T, D] each, positions 0..T-1): the pairing among
    `pairings` whose pairs keep their norm best (a common factor allowed: transformers' attention_scaling), its
    worst relative norm error, the common factor, each pair's frequency (0: the pair passes unrotated) and mean
    energy, and the dims outside every pair of that pairing that pass unchanged."""
    pre, post = pre.double(), post.double()
    D = pre.shape[-1]
    unchanged = ((post - pre).abs().amax((0, 1, 2)) <= 1e-6 * pre.abs().amax().clamp_min(1e-30))   # [D]
    rotated = int((~unchanged).sum())
    best = None
    for name, (a, b) in pairings(D, declared_rotated or rotated).items():
        n0, n1 = _pair_norms(pre, a, b), _pair_norms(post, a, b)
        live = n0 > 1e-3 * n0.amax().clamp_min(1e-30)
        scaling = float((n1[live] / n0[live]).median()) if live.any() else 1.0
        err = float(((n1 - scaling * n0).abs() / n0.clamp_min(1e-30))[live].amax()) if live.any() else math.inf
        outside = torch.ones(D, dtype=torch.bool)
        outside[a], outside[b] = False, False
        if not bool(unchanged[outside].all()):
            err = math.inf  # a dim outside the pairs turned: not this pairing
        if best is None or err < best["norm_error"]:
            best = {"pairing": name, "pairs": (a, b), "norm_error": err, "scaling": scaling}
    a, b = best["pairs"]
    best["frequency"] = frequencies(*phases(pre, post, a, b))
    best["energy"] = _pair_norms(pre, a, b).square().mean((0, 1, 2))  # a pair the keys leave empty has no phase
    best["unrotated_dims"] = int(unchanged.sum())
    return best


def fit_theta(frequency: torch.Tensor, denominator: int,
              use: torch.Tensor | None = None) -> tuple[float | None, float | None]:
    """(theta, f_0) of the ladder f_j = f_0 theta^(-2j / denominator) fitted (least squares in log f) to the pairs
    j that turn (frequency > 0) and are `use`d (default: all), j their index; (None, None) with fewer than two."""
    j = torch.arange(frequency.numel(), dtype=torch.float64)
    turn = frequency.double() > 1e-12
    if use is not None:
        turn &= use
    if int(turn.sum()) < 2:
        return None, None
    x, y = -2 * j[turn] / denominator, frequency.double()[turn].log()
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    return math.exp(slope), math.exp(float(y.mean() - slope * x.mean()))
