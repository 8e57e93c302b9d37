"""Metrics of attention keys and attention patterns: pure tensor functions.

No hooks and no model here: the probe collects the tensors and calls these. Every
function runs under torch.no_grad() itself (callers need not), works on the inputs' device
and accepts bfloat16, float16, float32 or float64 input (converted internally). The definitions
are in docs/probing.md.

Shape legend: H heads (Hq query heads, Hkv key/value heads, G = Hq // Hkv), B batch,
T sequence, D head size, N = B*T tokens. A "key" is one D-vector; K is the [N, D]
matrix of one head's keys.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from research.results.vocabulary import ATTENTION_METRICS, KEY_METRICS  # noqa: F401 (the names returned)
from research.results.vocabulary import LOGIT_SPLIT, UNCAPPED  # the names of the soft-capped model's extra records


# Per-head metrics beyond key_metrics' and attention_metrics', declared here once (their names in the vocabulary) and
# recorded by both probes (research.probing.probe.layer_record): (record, name, fn). record: a key site or "attn";
# fn(layer) -> [Hkv] or [Hq], layer: layer_record's captured tensors, its "rope" and "attention" (attention_metrics').
LAYER_METRICS: tuple[tuple[str, str, Callable[[dict], torch.Tensor]], ...] = ()


def _ratio_or_zero(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, with 0 where den == 0 (the 0/0 cases: zero keys, zero matrices)."""
    return torch.where(den > 0, num / den, 0)


def _pop_std(x: torch.Tensor) -> torch.Tensor:
    """Population std (unbiased=False) over dim 1 of [H, n], two-pass."""
    return (x - x.mean(1, keepdim=True)).square_().mean(1).sqrt()


def _participation(x: torch.Tensor) -> torch.Tensor:
    """(sum x)^2 / sum x^2 over the last dim; 0 when all x are 0."""
    return _ratio_or_zero(x.sum(-1).square(), x.square().sum(-1))


@torch.no_grad()
def key_moments(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 second moment M = K^T K / N [H, D, D] and mean key mu [H, D] of each head's keys [H, B, T, D],
    from the input values: what key_metrics' spectra and std are computed from."""
    H, B, T, D = keys.shape
    K = keys.detach().reshape(H, B * T, D).to(torch.float64)                   # [H, N, D], input values
    return K.mT @ K / (B * T), K.mean(1)


@torch.no_grad()
def key_eigvals(moments: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The eigenvalues of each head's M = K^T K / N (rows :H) and of its covariance C = M - mu mu^T (rows H:), from
    key_moments' (M [H, D, D], mu [H, D]): float64 [2H, D], ascending, as eigvalsh gives them (no threshold), in one
    batched call; key_metrics' spectra and key_rank's ranks both read them."""
    M, mu = moments
    C = M - mu.unsqueeze(2) * mu.unsqueeze(1)                                  # [H, D, D]
    return torch.linalg.eigvalsh(torch.cat([M, C]))                           # [2H, D] ascending


@torch.no_grad()
def divided_moments(moments: tuple[torch.Tensor, torch.Tensor], gain: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """key_moments of the keys divided by a gain (0 where the gain is 0), from the keys' own: M_ij / (g_i g_j) and
    mu_i / g_i, in float64 from the exact quotients (the keys divided in float32 differ by its rounding alone).
    gain: [D] shared by the heads, or [H * D]."""
    M, mu = moments
    g = gain.detach().to(torch.float64).reshape(-1, M.shape[-1])              # [1 or H, D]
    inv = torch.where(g != 0, 1 / g, 0)
    return M * inv.unsqueeze(2) * inv.unsqueeze(1), mu * inv


@torch.no_grad()
def key_metrics(keys: torch.Tensor, moments: tuple[torch.Tensor, torch.Tensor] | None = None,
                eigvals: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """All key metrics of each head, batched over heads.

    keys: [H, B, T, D] (any float dtype); moments: their key_moments where the caller has them (else computed
    here); eigvals: key_eigvals of those moments where the caller has them. Returns name -> float64 tensor [H] for
    the names in KEY_METRICS. Units: norm_mean, norm_std, max_abs,
    mean_max_abs, std are in the units of the keys; cos_mean is a cosine in [-1, 1]; peak_frac is a fraction in
    [1/D, 1]; pr_sv, pr_var, erank, pr_vec are numbers of dimensions in [1, D] (or 0, see below).

    - norm_mean, norm_std: mean and population std (unbiased=False) over the N tokens of |k|_2.
    - max_abs: max over tokens and components of |k_j|; mean_max_abs: mean over tokens of max_j |k_j|.
    - peak_frac: mean over tokens of max_j k_j^2 / sum_j k_j^2.
    - std: population std (unbiased=False) of all N*D components, as sqrt(E[x^2] - E[x]^2) in
      float64 (relative error ~1e-16 * E[x^2] / var: exact enough unless |mean| >> std).
    - cos_mean: exact mean cosine over all ordered pairs (i, j), i != j, of keys of the same
      sequence, pooled over sequences (same T(T-1) pairs per sequence), via
      sum_{i!=j} u_i.u_j = |sum_i u_i|^2 - sum_i |u_i|^2 with u = k/|k|: O(B*T*D). NaN if T == 1.
    - pr_sv: (sum s)^2 / sum s^2, s = singular values of the uncentered K.
    - pr_var: (sum l)^2 / sum l^2, l = eigenvalues of the (population) covariance of K.
    - erank: exp(-sum p ln p), p = s / sum s (Roy & Vetterli 2007), 0 ln 0 = 0.
    - pr_vec: mean over tokens of (sum_j k_j^2)^2 / sum_j k_j^4.

    Precision: the per-key reductions over D (|k|^2, sum k^4, max |k_j|) and sum_t u_t run in
    float32 (relative error ~1e-7; with the Gram matrix these are the only passes over all
    N*D values); everything after them is float64. Spectra are float64 from the input values:
    s = sqrt(N * eigenvalues of M = K^T K / N) and l = eigenvalues of C = M - mu mu^T (mu =
    mean key), from one batched torch.linalg.eigvalsh over the D x D matrices. Eigenvalues of
    M or C below lambda_max(M) * D * eps(float64) are rounding noise of this route (as in
    matrix_rank's default tolerance) and are set to 0: for singular values, s < ~1.2e-7 s_max.

    Conventions for degenerate input: a zero key has unit vector 0 (its cosine with every
    other key counts as 0, its pairs stay in the denominator) and contributes 0 to peak_frac
    and pr_vec; an all-zero K has pr_sv = erank = 0; a K with zero covariance (all keys
    equal) has pr_var = 0.
    """
    if keys.dim() != 4:
        raise ValueError(f"keys must be [H, B, T, D], got shape {tuple(keys.shape)}")
    H, B, T, D = keys.shape
    N = B * T
    k = keys.detach().float().contiguous()  # [H, B, T, D]: one copy of a hook's [B, T, H, D] view, read many times
    energy, fourth, peak, nonzero, inv_norm = _per_key(k)
    norm = energy.sqrt()                                                       # [H, B, T]  |k|_2
    per_token = (lambda t: t.reshape(H, N))                                    # [H, B, T] -> [H, N]
    # the input values: float32 holds bf16/fp16/fp32 input exactly (and is contiguous here), float64 stays
    moments = moments or key_moments(keys if keys.dtype == torch.float64 else k)
    s, lam, erank, std = _spectra(moments, key_eigvals(moments) if eigvals is None else eigvals, N)
    return {
        "norm_mean": per_token(norm).mean(1),
        "norm_std": _pop_std(per_token(norm)),
        "max_abs": per_token(peak).amax(1),
        "mean_max_abs": per_token(peak).mean(1),
        "peak_frac": per_token(_ratio_or_zero(peak.square(), energy)).mean(1),
        "std": std,
        "cos_mean": _cos_mean(k, inv_norm, nonzero),
        "pr_sv": _participation(s),
        "pr_var": _participation(lam),
        "erank": erank,
        "pr_vec": per_token(_ratio_or_zero(energy.square(), fourth)).mean(1),
    }


def _per_key(k: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The per-key reductions over D of float32 keys k [H, B, T, D] (the [H, B, T, D] passes, in float32), each
    [H, B, T]: sum_j k_j^2 and sum_j k_j^4 and max_j |k_j| (float64), whether the key is nonzero, and 1/|k| (0 for
    a zero key, float32)."""
    sq = k.square()                                                            # [H, B, T, D]
    energy = sq.sum(-1)                                                        # [H, B, T]  sum_j k_j^2
    fourth = sq.square_().sum(-1).double()                                     # [H, B, T]  sum_j k_j^4
    peak = torch.maximum(k.amax(-1), -k.amin(-1)).double()                     # [H, B, T]  max_j |k_j|
    nonzero = energy > 0                                                       # [H, B, T]
    inv_norm = torch.where(nonzero, energy.rsqrt(), 0)                         # [H, B, T]  1/|k| or 0
    return energy.double(), fourth, peak, nonzero, inv_norm


def _cos_mean(k: torch.Tensor, inv_norm: torch.Tensor, nonzero: torch.Tensor) -> torch.Tensor:
    """The mean cosine over ordered pairs of keys of one sequence [H]: u = k/|k| (0 for zero keys), and
    sum_i |u_i|^2 = the number of nonzero keys."""
    H, B, T, _ = k.shape
    u_sum = (inv_norm.unsqueeze(-2) @ k).squeeze(-2).double()                  # [H, B, D]  sum_t u_t
    pair_sum = u_sum.square().sum((1, 2)) - nonzero.sum((1, 2))                # [H]
    return pair_sum / (B * T * (T - 1)) if T > 1 else u_sum.new_full((H,), math.nan)


def _rounding_noise(eig_M: torch.Tensor) -> torch.Tensor:
    """[H, 1]: the eigenvalues of M below which they are rounding noise (key_metrics' docstring)."""
    return eig_M[:, -1:].clamp_min(0) * eig_M.shape[-1] * torch.finfo(torch.float64).eps


@torch.no_grad()
def key_pr_sv(keys: torch.Tensor) -> torch.Tensor:
    """key_metrics' pr_sv alone, float64 [H], of keys [H, B, T, D] (float32, or bf16/fp16 read as float32): the same
    values from the same moments and eigenvalues (eigvalsh of each head's M alone, which a batch does not change),
    without the other metrics' passes."""
    H, B, T, D = keys.shape
    M, _ = key_moments(keys.detach().float().contiguous())
    eig = torch.linalg.eigvalsh(M)                                             # [H, D] ascending
    return _participation((torch.where(eig > _rounding_noise(eig), eig, 0) * (B * T)).sqrt())


def _spectra(moments: tuple[torch.Tensor, torch.Tensor], eig: torch.Tensor, N: int) -> tuple[torch.Tensor, ...]:
    """Singular values s and covariance eigenvalues lam of each head's N keys [H, D], the effective rank [H] and
    the population std of all components [H], in float64 from their key_moments (M [H, D, D], mu [H, D]) and
    key_eigvals of them (eig [2H, D])."""
    M, mu = moments
    H, D = mu.shape
    tol = _rounding_noise(eig[:H])                                             # [H, 1]
    eig = torch.where(eig > tol.repeat(2, 1), eig, 0)
    s, lam = (eig[:H] * N).sqrt(), eig[H:]                                     # [H, D] each
    p = _ratio_or_zero(s, s.sum(-1, keepdim=True))                             # [H, D]
    erank = torch.where(s.sum(-1) > 0, torch.exp(-torch.special.xlogy(p, p).sum(-1)), 0)
    # Population std of all N*D components from the float64 moments: E[x^2] - E[x]^2.
    std = (M.diagonal(dim1=1, dim2=2).mean(1) - mu.mean(1).square()).clamp_min(0).sqrt()
    return s, lam, erank, std


def _key_mask(start: int, end: int, lo: int, window: int | None, device) -> torch.Tensor:
    """[n, 1, end - lo] True where query t in start..end-1 may attend key j in lo..end-1: j <= t, and
    t - j < window when there is a window."""
    t = torch.arange(start, end, device=device)[:, None]
    j = torch.arange(lo, end, device=device)[None, :]
    allowed = j <= t
    if window is not None:
        allowed &= t - j < window
    return allowed.unsqueeze(1)


def _masked(allowed: torch.Tensor, fill: float) -> torch.Tensor:
    """0 where allowed, `fill` elsewhere (float32, allowed's shape): masks applied as arithmetic on the finite
    logits s, exact and several times faster than where/masked_fill broadcasting a bool mask over them:
    s + 0 = s, and s + fill = fill for fill = -inf, or -1e30 while |s| < 1e22; likewise s * allowed is s or 0."""
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill_(~allowed, fill)


def _grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, scale: float | None):
    """Float32 copies laid out for blocked attention, and the mean norms of queries and keys.

    Row t*G + g of qg[kv*B + b] is query head kv*G + g at position t (position-major), so a block
    of positions is a slice of rows; the scale is folded into the keys."""
    Hq, B, T, D = q.shape
    Hkv = k.shape[0]
    G = Hq // Hkv
    qg = torch.empty(Hkv, B, T, G, D, device=q.device)
    qg.copy_(q.detach().unflatten(0, (Hkv, G)).permute(0, 2, 3, 1, 4))   # [Hkv, B, T, G, D]
    kf = k.detach().float()                                                  # [Hkv, B, T, D]
    q_norm = qg.norm(dim=-1).mean((1, 2)).reshape(Hq)                       # [Hq] mean |q|
    k_norm = kf.norm(dim=-1).mean((1, 2)).repeat_interleave(G)              # [Hq] mean |k| of the KV head
    kg = torch.empty(Hkv, B, T, D, device=q.device)                         # scaled in one pass into [HB, T, D]
    torch.mul(kf, D ** -0.5 if scale is None else scale, out=kg)
    vg = v.detach().float().reshape(Hkv * B, T, -1) if v is not None else None   # [HB, T, Dv]
    return qg.view(Hkv * B, T * G, D), kg.view(Hkv * B, T, D), vg, q_norm / k_norm


class _Sums:
    """Running per-(KV head x batch, query group) sums over query blocks, in float64."""

    def __init__(self, HB: int, G: int, T: int, device):
        z = lambda: torch.zeros(HB, G, dtype=torch.float64, device=device)
        self.entropy, self.sink, self.logit, self.logit_sq = z(), z(), z(), z()
        self.logit_max = torch.full((HB, G), -math.inf, device=device)
        self.max_at = torch.zeros(2, HB, G, dtype=torch.long, device=device)  # (query t, key j) of logit_max
        # with a soft-cap: the largest logit before the cap, and where it is (ties under tanh's saturation can put
        # the capped maximum elsewhere)
        self.raw_max = torch.full((HB, G), -math.inf, device=device)
        self.raw_at = torch.zeros(2, HB, G, dtype=torch.long, device=device)
        self.pairs = 0  # causal (query, key) pairs per (KV head x batch, query group)
        self.sink_pos = torch.zeros(HB, T, G, device=device)


def _track_max(s: torch.Tensor, sums: _Sums, best: str, at: str, start: int, lo: int) -> torch.Tensor:
    """Raise sums.<best> [HB, G] to the block's largest logit of s [HB, n, G, L] and keep its (query t, key j) in
    sums.<at>; returns the rows' maxima [HB, n, G, 1]."""
    row_max = s.amax(-1, keepdim=True)                                       # [HB, n, G, 1]
    block_max, t_in = row_max.squeeze(-1).max(1)                             # [HB, G]: the block's best query
    better = block_max > getattr(sums, best)
    # its best key: the first largest logit of that query's row alone (max's indices over every row cost more)
    rows = s.gather(1, t_in[:, None, :, None].expand(-1, 1, -1, s.shape[-1]))  # [HB, 1, G, L]
    j = rows.argmax(-1).squeeze(1) + lo                                      # [HB, G]
    setattr(sums, at, torch.where(better, torch.stack([t_in + start, j]), getattr(sums, at)))
    setattr(sums, best, torch.maximum(getattr(sums, best), block_max))
    return row_max


def _logit_sums(seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum and the sum of squares over dims 1 and 3 of float32 logits [HB, n, G, L], float64 [HB, G] each,
    converted as they are read (no float64 copy of the block): the sum of squares as the squared float64 2-norm,
    the sum of the float64 squares up to float64 rounding (~1e-15 relative), far below the float32 that the
    logits' mean and std are recorded in."""
    return seen.sum((1, 3), dtype=torch.float64), \
        torch.linalg.vector_norm(seen, 2, (1, 3), dtype=torch.float64).square_()


def _attend_block(qg, kg, vg, out, sums: _Sums, start: int, end: int, G: int, *, window, softcap) -> None:
    """Queries start..end-1 against the keys they may see: accumulate into `sums`, write `out`."""
    HB, n = qg.shape[0], end - start
    lo = 0 if window is None else max(0, start - window + 1)                # first key any query here sees
    s = torch.bmm(qg[:, start * G:end * G], kg[:, lo:end].mT).view(HB, n, G, end - lo)   # logits
    allowed = _key_mask(start, end, lo, window, s.device)                    # [n, 1, L]
    if softcap:
        _track_max(s + _masked(allowed, -math.inf), sums, "raw_max", "raw_at", start, lo)
        s.div_(softcap).tanh_().mul_(softcap)
    logit, logit_sq = _logit_sums(s * allowed.float())
    sums.logit += logit
    sums.logit_sq += logit_sq
    # keys each query sees, counted on the host (reading `allowed` back would wait for the GPU every block)
    sums.pairs += sum(t + 1 if window is None else min(t + 1, window) for t in range(start, end))
    # Masked keys get -1e30 rather than -inf (exp gives exactly 0 either way), so that p_j s'_j =
    # 0 * finite = 0 there: the 0 ln 0 = 0 convention.
    s.add_(_masked(allowed, -1e30))
    row_max = _track_max(s, sums, "logit_max", "max_at", start, lo)
    s.sub_(row_max)                                                          # s' <= 0, max 0
    p = torch.softmax(s, dim=-1)
    if lo == 0:
        sums.sink_pos[:, start:end] = p[..., 0]
        sums.sink += p[..., 0].sum(1)
    if out is not None:
        out[:, start * G:end * G] = p.view(HB, n * G, end - lo) @ vg[:, lo:end]
    log_z = -p.amax(-1).log()                                                # [HB, n, G]
    sums.entropy += (log_z - p.mul_(s).sum(-1)).sum(1)


def _logit_split(qg, kg, logit_max: torch.Tensor, max_at: torch.Tensor, Hkv: int, B: int, G: int,
                 scale: float) -> dict[str, torch.Tensor]:
    """The largest logit of each query head (logit_max [HB, G], at (query t, key j) max_at [2, HB, G]) taken
    apart: scale x |q| x |k| x cos(q, k) at the (query, key) pair where it occurs (over the batch), and the query
    position / key distance of that pair."""
    HB = qg.shape[0]
    t, j = max_at                                                            # [HB, G] each
    rows = torch.arange(HB, device=qg.device)[:, None]
    q = qg.view(HB, -1, G, qg.shape[-1])[rows, t, torch.arange(G, device=qg.device)[None, :]]   # [HB, G, D]
    k = kg[rows, j] / scale                                                  # [HB, G, D] unscaled keys
    qn, kn = q.norm(dim=-1), k.norm(dim=-1)
    cos = (q * k).sum(-1) / (qn * kn).clamp_min(torch.finfo(torch.float32).tiny)
    b = logit_max.view(Hkv, B, G).argmax(1, keepdim=True)                   # [Hkv, 1, G]: the batch row
    pick = lambda x: x.view(Hkv, B, G).gather(1, b).reshape(Hkv * G).float()
    return {"logit_q_norm": pick(qn), "logit_k_norm": pick(kn), "logit_cos": pick(cos),
            "logit_scale": torch.full((Hkv * G,), float(scale), device=qg.device),
            "logit_query_pos": pick(t.float()), "logit_key_dist": pick((t - j).float()),
            "logit_at": torch.stack([b.expand(Hkv, 1, G).reshape(-1), pick(t.float()).long(), pick(j.float()).long()])}


@torch.no_grad()
def gain_factor(x_HBTD: torch.Tensor, gain: torch.Tensor, at: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """|x| / |x / gain| of the vectors x[heads[i], b_i, t_i], (b_i, t_i) = at[:, i]: how much a norm's gain
    lengthens the normalized vector it multiplies (1 for a gain of ones), float32 [len(heads)].

    x: the norm's output before RoPE (RoPE keeps lengths), [H, B, T, D]; gain: its effective gain, [D] (one per
    head dimension, shared by the heads) or [H * D] (one gain over the whole projection, OLMo 2)."""
    D = x_HBTD.shape[-1]
    x = x_HBTD[heads, at[0], at[1]].float()                                   # [n, D]
    g = gain.detach().float().to(x.device).reshape(-1, D)
    g = g[heads] if g.shape[0] > 1 else g                                    # [n or 1, D]
    plain = torch.where(g != 0, x / g, 0.0).norm(dim=-1)
    return torch.where(plain > 0, x.norm(dim=-1) / plain, math.nan)


@torch.no_grad()
def attention_metrics(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None, *,
                      scale: float | None = None, window: int | None = None, softcap: float | None = None,
                      block_size: int = 64) -> dict[str, torch.Tensor]:
    """Causal attention statistics of each query head, computed the way the model's attention computes them.

    q: [Hq, B, T, D], k: [Hkv, B, T, D] (post-RoPE; Hq a multiple of Hkv; query head h reads
    KV head h // (Hq // Hkv), as SDPA's enable_gqa), v: [Hkv, B, T, Dv] or None.
    Logits s_tj = scale * q_t . k_j (scale 1/sqrt(D) unless given), soft-capped to
    softcap * tanh(s / softcap) when softcap is given, over keys j <= t (and t - j < window
    when window is given); p_t = softmax_j(s_t), in float32. Returns:
    - entropy [Hq]: mean over batch and ALL query positions t (t = 0 included, where it is 0) of
      -sum_j p_tj ln p_tj, in nats.
    - sink_mass [Hq]: mean over batch and all t (t = 0 included, where it is 1) of p_t0.
    - sink_by_position [Hq, T]: p_t0 at each query position, mean over the batch.
    - qk_ratio [Hq]: mean over tokens of |q| / mean over tokens of |k| of the head's KV head.
    - logit_max, logit_mean, logit_std [Hq]: max, mean and population std of the logits s_tj over
      all allowed (query, key) pairs of the batch: what enters softmax, the quantity whose growth
      makes training unstable without QK-norm (Wortsman et al. 2023) and that QK-clip bounds.
    - logit_q_norm, logit_k_norm, logit_cos, logit_scale [Hq]: logit_max taken apart at the (query, key)
      pair where it occurs: |q_t|, |k_j|, their cosine and the scale, so that logit_max = logit_scale *
      logit_q_norm * logit_k_norm * logit_cos before any soft-cap (each term's share of a logit's growth is
      the change of its log); logit_query_pos [Hq]: t of that pair, logit_key_dist [Hq]: t - j; logit_at
      [3, Hq] (int64): its batch row, t and j, for gain_factor (not a metric: the probes drop it).
      With a soft-cap, logit_max, logit_mean, logit_std, entropy and sinks are those of the capped logits (what
      softmax sees), and the largest logit before the cap is recorded beside them: logit_max_uncapped [Hq], and
      the LOGIT_SPLIT names with the suffix _uncapped, its split at its own (query, key) pair (the same pair as
      the capped maximum's unless tanh's saturation ties several capped logits).
    - output [Hq, B, T, Dv] (only when v is given): sum_j p_tj v_j, the attention output.
    All float32.

    Entropy via log-softmax written out: with s'_j = s_j - max_j s_j <= 0 and Z = sum_j exp(s'_j),
    ln p_j = s'_j - ln Z, so H = ln Z - sum_j p_j s'_j, two non-negative terms (no cancellation),
    and ln Z = -ln max_j p_j (the max has s' = 0): one exp pass (inside softmax) per score.

    Queries are processed block_size positions at a time against keys up to the end of the
    block only (and from the start of the window, when there is one), so masked work is skipped
    outside the diagonal block. Peak extra memory: three [Hq, B, block_size, T] tensors (float32
    logits and probabilities, float64 masked logits for the sums), 16 * Hq * B * block_size * T
    bytes, plus float32 copies of q (one) and k (up to two): 4 * (Hq + 2 * Hkv) * B * T * D bytes.
    At T=2048, Hq=16, B=8, D=64, block_size=64: 268 MB + 67 MB + 8.4 MB per KV head.
    """
    _check_attention_shapes(q, k, v, block_size)
    Hq, B, T, D = q.shape
    Hkv = k.shape[0]
    G = Hq // Hkv
    qg, kg, vg, qk_ratio = _grouped(q, k, v, scale)
    out = torch.empty(Hkv * B, T * G, vg.shape[-1], device=q.device) if vg is not None else None
    sums = _Sums(Hkv * B, G, T, q.device)
    for start in range(0, T, block_size):
        _attend_block(qg, kg, vg, out, sums, start, min(start + block_size, T), G, window=window, softcap=softcap)
    result = _per_head_results(sums, qg, kg, qk_ratio, (Hkv, B, T, G), D ** -0.5 if scale is None else scale,
                               softcap)
    if out is not None:
        result["output"] = out.view(Hkv, B, T, G, -1).permute(0, 3, 1, 2, 4).reshape(Hq, B, T, -1)
    return result


def _check_attention_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, block_size: int) -> None:
    """ValueError unless q [Hq, B, T, D], k [Hkv, B, T, D] with Hq % Hkv == 0, v [Hkv, B, T, Dv] or None, and
    block_size >= 1."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[1:] != k.shape[1:] or q.shape[0] % k.shape[0]:
        raise ValueError(f"need q [Hq, B, T, D], k [Hkv, B, T, D], Hq % Hkv == 0; "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}")
    if v is not None and (v.dim() != 4 or v.shape[:3] != k.shape[:3]):
        raise ValueError(f"need v [Hkv, B, T, Dv] matching k {tuple(k.shape)}; got {tuple(v.shape)}")
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")


def _per_head_results(sums: _Sums, qg, kg, qk_ratio: torch.Tensor, shape: tuple[int, int, int, int], scale: float,
                      softcap: float | None) -> dict[str, torch.Tensor]:
    """The sums over all query blocks as attention_metrics' per-head values [Hq] (sink_by_position [Hq, T]), with
    the largest logit's split and qk_ratio, and with a soft-cap the largest logit before the cap and its split;
    shape: (Hkv, B, T, G)."""
    Hkv, B, T, G = shape
    Hq = Hkv * G

    def per_head(total: torch.Tensor, count: int) -> torch.Tensor:  # [HB, G] sums -> [Hq] means
        return total.view(Hkv, B, G).sum(1).reshape(Hq) / (B * count)

    logit_mean = per_head(sums.logit, sums.pairs)
    logit_var = (per_head(sums.logit_sq, sums.pairs) - logit_mean.square()).clamp_min(0)
    result = {**_logit_split(qg, kg, sums.logit_max, sums.max_at, Hkv, B, G, scale),
              "entropy": per_head(sums.entropy, T).float(), "sink_mass": per_head(sums.sink, T).float(),
              "qk_ratio": qk_ratio, "logit_max": sums.logit_max.view(Hkv, B, G).amax(1).reshape(Hq),
              "logit_mean": logit_mean.float(), "logit_std": logit_var.sqrt().float(),
              "sink_by_position": sums.sink_pos.view(Hkv, B, T, G).mean(1).permute(0, 2, 1).reshape(Hq, T)}
    if softcap:  # the largest logit before the cap, and its split at its own (query, key) pair
        raw = _logit_split(qg, kg, sums.raw_max, sums.raw_at, Hkv, B, G, scale)
        result.update({f"{name}{UNCAPPED}": raw[name] for name in LOGIT_SPLIT})
        result[f"logit_max{UNCAPPED}"] = sums.raw_max.view(Hkv, B, G).amax(1).reshape(Hq)
    return result


@torch.no_grad()
def gamma_stats(weight: torch.Tensor | None) -> dict | None:
    """Statistics of a 1-D RMSNorm gain vector [D]; None (qk_norm='none') gives None.

    Returns Python floats mean, std (unbiased, ddof=1, as the write-ups computed it),
    cv = std / |mean| (NaN if mean == 0), min, max, and values (list of D floats).
    """
    if weight is None:
        return None
    w = weight.detach().to(torch.float64).reshape(-1)
    mean, std = w.mean().item(), w.std(correction=1).item()
    return {"mean": mean, "std": std, "cv": std / abs(mean) if mean != 0 else math.nan,
            "min": w.min().item(), "max": w.max().item(), "values": w.tolist()}


def layer_means(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """Mean over heads of each per-head metric: {name: [H] tensor} -> {name: float}."""
    return {name: torch.as_tensor(v, dtype=torch.float64).mean().item() for name, v in metrics.items()}
