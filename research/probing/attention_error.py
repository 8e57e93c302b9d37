"""How far an approximate attention is from the exact one: the errors a compressed key cache causes (a low-rank
projection, key_rank.py; fake quantization, key_bits.py). Pure tensor functions, no model.

Shape legend: Hq query heads, Hkv key/value heads (G = Hq // Hkv; query head h reads KV head h // G, as SDPA's
enable_gqa and research.probing.metrics.attention_metrics), B batch, T sequence, D head size (Dr: the size of an
approximate pair's vectors, which may differ from D), Dv value size.
"""
from __future__ import annotations

import torch

from research.results.vocabulary import KV_ERRORS

ERROR_NAMES = KV_ERRORS
_MASKED = -1e30  # masked logits: exp gives exactly 0, and p * (log p - log p') stays 0 * finite there


@torch.no_grad()
def attention_errors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None,
                     approximations: list[tuple[torch.Tensor, torch.Tensor]], *, scale: float | None = None,
                     softcap: float | None = None, block_size: int = 32,
                     dtype: torch.dtype = torch.float32) -> list[dict[str, torch.Tensor]]:
    """The causal attention of each (q', k') in `approximations` against the exact (q, k), per query head.

    q: [Hq, B, T, D], k: [Hkv, B, T, D], v: [Hkv, B, T, Dv] or None; each approximation (q' [Hq, B, T, Dr],
    k' [Hkv, B, T, Dr]) gives logits s' = scale q' . k' with the exact pair's scale (1/sqrt(D) of q unless given),
    soft-capped as the exact ones when softcap is given; the attention is causal (key j <= query t). Returns, per
    approximation, float64 [Hq] tensors:
    - logit_error: sqrt(sum (s' - s)^2 / sum s^2) over every allowed (query, key) pair of the batch (the logits
      softmax sees: after the cap where there is one), a relative Frobenius error;
    - attention_kl: mean over the batch's query rows of KL(p || p') = sum_j p_j (ln p_j - ln p'_j), in nats
      (rounding can leave it a hair below 0, ~1e-8 in float32, where p' = p);
    - output_error: sqrt(sum |o' - o|^2 / sum |o|^2) over the batch's queries, o = sum_j p_j v_j the attention
      output (NaN without v).
    Work: one exact attention, then one per approximation, `block_size` queries at a time (memory: a few
    Hq x B x block_size x T tensors of `dtype`)."""
    _check(q, k, v, approximations)
    Hq, B, T, D = q.shape
    Hkv = k.shape[0]
    scale = D ** -0.5 if scale is None else scale
    group = lambda x: x.to(dtype).unflatten(0, (Hkv, -1))                      # [Hkv, G or 1, B, T, .]
    exact, others = (group(q) * scale, group(k)), [(group(a) * scale, group(b)) for a, b in approximations]
    vg = group(v) if v is not None else None
    sums = torch.zeros(len(approximations), 5, Hkv, Hq // Hkv, dtype=torch.float64, device=q.device)
    for start in range(0, T, block_size):
        end = min(start + block_size, T)
        _block(exact, others, vg, sums, start, end, softcap)
    err, logit_sq, kl, out_err, out_sq = sums.flatten(2).unbind(1)              # each [n, Hq]
    rel = lambda num, den: torch.where(den > 0, (num / den).sqrt(), torch.where(num > 0, torch.inf, 0.0))
    nan = torch.full_like(out_sq, torch.nan)
    return [{"logit_error": rel(err[i], logit_sq[i]), "attention_kl": kl[i] / (B * T),
             "output_error": rel(out_err[i], out_sq[i]) if v is not None else nan[i]}
            for i in range(len(approximations))]


def _check(q, k, v, approximations) -> None:
    """ValueError unless the shapes are those attention_errors takes."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[1:] != k.shape[1:] or q.shape[0] % k.shape[0]:
        raise ValueError(f"need q [Hq, B, T, D], k [Hkv, B, T, D], Hq % Hkv == 0; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}")
    if v is not None and (v.dim() != 4 or v.shape[:3] != k.shape[:3]):
        raise ValueError(f"need v [Hkv, B, T, Dv] matching k {tuple(k.shape)}; got {tuple(v.shape)}")
    for a, b in approximations:
        if a.shape[:3] != q.shape[:3] or b.shape[:3] != k.shape[:3] or a.shape[-1] != b.shape[-1]:
            raise ValueError(f"an approximation must be q' [Hq, B, T, Dr], k' [Hkv, B, T, Dr] with q's and k's "
                             f"first three sizes; got {tuple(a.shape)}, {tuple(b.shape)}")


def _logits(qg: torch.Tensor, kg: torch.Tensor, start: int, end: int, softcap: float | None,
            future: torch.Tensor) -> torch.Tensor:
    """The logits [Hkv, G, B, n, end] of queries start..end-1 (scale folded into qg) against keys 0..end-1, soft-capped
    where there is a cap, _MASKED where the key is in the query's future (there s' - s = 0 exactly)."""
    s = qg[..., start:end, :] @ kg[..., :end, :].mT
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    return s.masked_fill_(future, _MASKED)


def _block(exact, others, vg, sums: torch.Tensor, start: int, end: int, softcap) -> None:
    """Add the block's sums of every approximation to sums [n, 5, Hkv, G]: squared logit error, squared logits,
    KL, squared output error, squared output. Sums over the keys run in float32 (at most T terms), the rest in
    float64."""
    future = torch.ones(end - start, end, dtype=torch.bool, device=sums.device).triu(start + 1)
    s = _logits(*exact, start, end, softcap, future)
    logp = torch.log_softmax(s, dim=-1)
    p = logp.exp()
    o = p @ vg[..., :end, :] if vg is not None else None
    over = lambda x: x.sum(-1).double().sum(tuple(range(2, x.dim() - 1)))     # [Hkv, G, ...] -> [Hkv, G]
    sums[:, 1] += over(s.masked_fill(future, 0.0).square_())
    if o is not None:
        sums[:, 4] += over(o.square())
    for i, (qa, ka) in enumerate(others):
        s2 = _logits(qa, ka, start, end, softcap, future)
        logp2 = torch.log_softmax(s2, dim=-1)
        if o is not None:
            sums[i, 3] += over((logp2.exp() @ vg[..., :end, :]).sub_(o).square_())
        sums[i, 0] += over(s2.sub_(s).square_())
        sums[i, 2] += over(logp2.neg_().add_(logp).mul_(p))                    # p (ln p - ln p')
