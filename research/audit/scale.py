"""The attention's logit scale and soft-cap as they run, measured from one layer's own q, k, v and output: at the
first positions each query's attention weights are solved from its output (out_t = sum_j p_tj v_j, the values of
keys 0..t independent), and their log-ratios against q . k give the scale, with or without a soft-cap
(docs/audit.md, "Scale and soft-cap"). Pure tensor functions, float64.

    fit = measure_scale(q_HBTD, k_KBTD, v_KBTD, out_HBTD, cap=None)   # {"scale", "residual", "logit_peak", ...}
"""
from __future__ import annotations

import math

import torch

MIN_WEIGHT = 1e-3  # attention weights below this: their log is too loose to read (their share of rounding)


def weights(v_BtD: torch.Tensor, out_BD: torch.Tensor) -> torch.Tensor:
    """p [B, t] with out = p @ v (least squares; v [B, t, Dv] of t <= Dv independent rows)."""
    return torch.linalg.lstsq(v_BtD.transpose(1, 2), out_BD.unsqueeze(-1)).solution.squeeze(-1)


def observations(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, positions: int):
    """(dot, log-ratio) pairs of each query head, sequence and position t in 1..positions-1 and key j in 1..t:
    q_t . k_j - q_t . k_0 and log p_tj - log p_t0, where both weights are readable; q [Hq, B, T, D], k and v
    [Hkv, B, T, D], out [Hq, B, T, Dv]; query head h reads KV head h // (Hq / Hkv)."""
    G = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(G, 0), v.repeat_interleave(G, 0)
    dots, ratios, a0, aj = [], [], [], []
    for t in range(1, positions):
        V = v[:, :, :t + 1].flatten(0, 1)                                               # [H*B, t+1, Dv]
        p = weights(V, out[:, :, t].flatten(0, 1))                                      # [H*B, t+1]
        s = (q[:, :, t:t + 1] * k[:, :, :t + 1]).sum(-1).flatten(0, 1)                 # [H*B, t+1]
        sv = torch.linalg.svdvals(V)                   # values of one token twice (layer 0): weights not solvable
        solvable = (sv[:, -1] > 1e-3 * sv[:, 0]).unsqueeze(1)
        ok = solvable & (p[:, :1] > MIN_WEIGHT) & (p[:, 1:] > MIN_WEIGHT)
        dots.append((s[:, 1:] - s[:, :1])[ok])
        ratios.append((p[:, 1:].log() - p[:, :1].log())[ok])
        a0.append(s[:, :1].expand_as(s[:, 1:])[ok])
        aj.append(s[:, 1:][ok])
    return torch.cat(dots), torch.cat(ratios), torch.cat(a0), torch.cat(aj)


def _capped_residual(scale: float, cap: float, r, a0, aj) -> float:
    pred = cap * torch.tanh(scale * aj / cap) - cap * torch.tanh(scale * a0 / cap)
    return float(((pred - r) ** 2).mean().sqrt())


def _best_capped(cap: float, r, a0, aj, start: float) -> float:
    """The scale minimising _capped_residual at a given cap: golden-section search on log(scale) within a factor
    of 100 of `start`."""
    lo, hi = math.log(start) - math.log(100), math.log(start) + math.log(100)
    g = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        m1, m2 = hi - g * (hi - lo), lo + g * (hi - lo)
        if _capped_residual(math.exp(m1), cap, r, a0, aj) < _capped_residual(math.exp(m2), cap, r, a0, aj):
            hi = m2
        else:
            lo = m1
    return math.exp((lo + hi) / 2)


def measure_scale(q, k, v, out, cap: float | None = None) -> dict | None:
    """The scale s for which log p_tj - log p_t0 = s (q_t . k_j - q_t . k_0) fits best (least squares through the
    origin) and its RMS residual; with a declared soft-cap also the scale that fits best under cap x tanh(s a /
    cap) and its residual, and the largest |s a| / cap seen (how far the logits reach into the cap). None where
    no weight can be read (fewer than 2 positions, or values of more keys than dims)."""
    q, k, v, out = (x.double() for x in (q, k, v, out))
    positions = min(q.shape[2], v.shape[-1])
    if positions < 2:
        return None
    dot, r, a0, aj = observations(q, k, v, out, positions)
    if dot.numel() < 2 or float((dot * dot).sum()) == 0:
        return None
    s = float((dot * r).sum() / (dot * dot).sum())
    fit = {"scale": s, "residual": float(((s * dot - r) ** 2).mean().sqrt()),
           "spread": float(r.abs().amax()), "observations": int(dot.numel())}
    if cap:
        sc = _best_capped(cap, r, a0, aj, abs(s) or 1.0)
        fit.update(capped_scale=sc, capped_residual=_capped_residual(sc, cap, r, a0, aj),
                   logit_peak=float(torch.maximum(a0.abs(), aj.abs()).amax() * sc / cap))
    return fit
