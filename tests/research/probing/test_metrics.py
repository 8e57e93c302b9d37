"""Key and attention metrics against hand-computed values and slow references."""
from __future__ import annotations

import math

import pytest
import torch

from research.probing.metrics import (ATTENTION_METRICS, KEY_METRICS, attention_metrics, gain_factor, gamma_stats,
                                      key_metrics, layer_means)
from tests.tolerances import EPS, pr_rel_tol, sum_rel_tol, ulps, unit_roundoff


def close(actual, expected, rel, abs=0.0):
    return actual == pytest.approx(expected, rel=rel, abs=abs)


# ---------------------------------------------------------------- tolerances (tests/tolerances.py)

def cos_tol(T: int) -> float:
    """Absolute bound on cos_mean's fp32 error: sum_t u_t over T unit keys in fp32 (sum_rel_tol of terms <= 1), then
    squared (twice that, on |sum_t u_t|^2 <= T^2) and divided by the T(T - 1) pairs."""
    return 2 * T / (T - 1) * sum_rel_tol("fp32", T)


def key_tol(keys: torch.Tensor, paths: int = 1) -> dict[str, tuple[float, float]]:
    """(rel, abs) per key metric for key_metrics against exact values (paths=2: two fp32 runs against each other).
    Its fp32 passes are the per-key sums over D (|k|^2, sum k^4; metrics docstring) and sum_t u_t; the rest is
    float64 from the input values, whose errors (< 1e-13 in these tests) the fp32 bounds cover."""
    T, D = keys.shape[2:]
    r = sum_rel_tol("fp32", D)  # one fp32 sum of D squares against float64
    rms_norm = keys.double().square().sum(-1).mean((1, 2)).sqrt().max().item()  # sqrt(norm_mean^2 + norm_std^2)
    tol = {name: (r, 0.0) for name in KEY_METRICS} | {
        "pr_vec": (3 * r, 0.0),           # (sum k^2)^2 / sum k^4: three fp32 sums
        "norm_std": (0.0, r * rms_norm),  # centring cancels: |d std| <= rms of the norms' errors <= r * rms norm
        "cos_mean": (0.0, cos_tol(T))}
    return {name: (paths * rel, paths * abs_) for name, (rel, abs_) in tol.items()}


def attention_tol(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None, scale: float | None = None,
                  softcap: float | None = None, paths: int = 1) -> dict[str, tuple[float, float]]:
    """(rel, abs) per attention metric for fp32 attention ([H, B, T, D] inputs) against exact values (paths=2: two
    fp32 implementations against each other). Logits are fp32 dot products of length D: each within
    ds = sum_rel_tol(fp32, D) * scale * max|q| max|k| (Cauchy-Schwarz); the softmax rounds each p by at most
    sm = sum_rel_tol(fp32, T) (exp within 2 ulps, sums over <= T keys, one division)."""
    _, B, T, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    ds = sum_rel_tol("fp32", D) * scale * (q.float().norm(dim=-1).max() * k.float().norm(dim=-1).max()).item()
    if softcap:
        ds += ulps("fp32", 2) * softcap  # tanh contracts errors; s / c, tanh and * c round once each
    sm = sum_rel_tol("fp32", T)
    tol = {"logit_max": (0.0, ds), "logit_mean": (0.0, ds), "logit_std": (0.0, ds),  # a std of errors <= ds is <= ds
           "sink_mass": (2 * ds + sm, 0.0), "sink_by_position": (2 * ds + sm, 0.0),   # d ln p_0 = ds_0 - E_p[ds]
           "entropy": (0.0, sm + 2 * math.log(T) * (ds + sm)),  # |dH| <= 2 H max|ds|, H <= ln T; ln Z rounds by sm
           "qk_ratio": (2 * (sum_rel_tol("fp32", D) + sum_rel_tol("fp32", B * T)), 0.0),  # fp32 norms, fp32 means
           # the split of logit_max at its pair: fp32 norms of length D; the cosine a dot product over both norms;
           # the scale and the pair's place are exact (random inputs have no near-tie of the largest logit)
           "logit_q_norm": (sum_rel_tol("fp32", D), 0.0), "logit_k_norm": (2 * sum_rel_tol("fp32", D), 0.0),
           "logit_cos": (0.0, 4 * sum_rel_tol("fp32", D)), "logit_scale": (0.0, 0.0), "logit_query_pos": (0.0, 0.0),
           "logit_key_dist": (0.0, 0.0), "logit_at": (0.0, 0.0)}
    if v is not None:
        tol["output"] = (0.0, 2 * (ds + sm) * v.abs().max().item())  # p's errors, then the fp32 sum over <= T keys
    return {name: (paths * rel, paths * abs_) for name, (rel, abs_) in tol.items()}


# ---------------------------------------------------------------- slow references

def ref_key_metrics(keys: torch.Tensor) -> dict[str, list[float]]:
    """One head at a time, full T x T cosine matrices, svdvals and the covariance matrix."""
    out = {name: [] for name in KEY_METRICS}
    H, B, T, D = keys.shape
    for h in range(H):
        K = keys[h].reshape(B * T, D).double()
        norms = K.norm(dim=1)
        out["norm_mean"].append(norms.mean().item())
        out["norm_std"].append(math.sqrt(((norms - norms.mean()) ** 2).mean().item()))
        out["max_abs"].append(K.abs().max().item())
        out["mean_max_abs"].append(K.abs().max(dim=1).values.mean().item())
        out["peak_frac"].append((K.abs().max(dim=1).values ** 2 / (K ** 2).sum(1)).mean().item())
        out["std"].append(math.sqrt(((K - K.mean()) ** 2).mean().item()))
        cos_total = 0.0
        for b in range(B):
            Kb = keys[h, b].double()
            U = Kb / Kb.norm(dim=1, keepdim=True)
            C = U @ U.T
            cos_total += (C.sum() - C.diagonal().sum()).item() / (T * (T - 1))
        out["cos_mean"].append(cos_total / B)
        s = torch.linalg.svdvals(K)
        out["pr_sv"].append((s.sum() ** 2 / (s ** 2).sum()).item())
        p = s / s.sum()
        out["erank"].append(math.exp(-sum(pi * math.log(pi) for pi in p.tolist() if pi > 0)))
        lam = torch.linalg.eigvalsh(torch.cov(K.T, correction=0))
        out["pr_var"].append((lam.sum() ** 2 / (lam ** 2).sum()).item())
        out["pr_vec"].append((((K ** 2).sum(1) ** 2) / (K ** 4).sum(1)).mean().item())
    return out


def ref_attention(q, k, v=None, scale=None, window=None, softcap=None):
    """Explicit loops over query heads and batch; the full masked T x T softmax in float64.
    Returns the three per-head metrics, sink_by_position [Hq][T] and, with v, the output [Hq, B, T, Dv]."""
    Hq, B, T, D = q.shape
    G = Hq // k.shape[0]
    scale = D ** -0.5 if scale is None else scale
    t, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    masked = (j > t) | ((t - j >= window) if window else torch.zeros(T, T, dtype=torch.bool))
    out = {name: [] for name in ATTENTION_METRICS} | {"sink_by_position": []}
    outputs = torch.zeros(Hq, B, T, v.shape[-1], dtype=torch.float64) if v is not None else None
    for h in range(Hq):
        kv = h // G
        ent, sink, seen = 0.0, torch.zeros(T, dtype=torch.float64), []
        for b in range(B):
            S = q[h, b].double() @ k[kv, b].double().T * scale
            if softcap:
                S = softcap * torch.tanh(S / softcap)
            seen.append(S[~masked])
            P = torch.softmax(S.masked_fill(masked, -math.inf), dim=1)
            ent += -torch.special.xlogy(P, P).sum().item()
            sink += P[:, 0]
            if v is not None:
                outputs[h, b] = P @ v[kv, b].double()
        out["entropy"].append(ent / (B * T))
        out["sink_mass"].append(sink.sum().item() / (B * T))
        out["sink_by_position"].append((sink / B).tolist())
        out["qk_ratio"].append((q[h].double().norm(dim=-1).mean() / k[kv].double().norm(dim=-1).mean()).item())
        seen = torch.cat(seen)
        out["logit_max"].append(seen.max().item())
        out["logit_mean"].append(seen.mean().item())
        out["logit_std"].append(seen.std(correction=0).item())
    return out, outputs


def ref_attention_metrics(q: torch.Tensor, k: torch.Tensor) -> dict[str, list[float]]:
    return {n: v for n, v in ref_attention(q, k)[0].items() if n in ATTENTION_METRICS}


def assert_matches(got: dict[str, torch.Tensor], ref: dict[str, list[float]], tol: dict[str, tuple[float, float]]):
    """Each metric of ref within its (rel, abs) of tol: pytest.approx allows the larger of the two."""
    for name, values in ref.items():
        rel, abs_ = tol[name]
        assert got[name].tolist() == pytest.approx(values, rel=rel, abs=abs_), name


# ---------------------------------------------------------------- key metrics, hand values

def test_identical_keys():
    D = 8
    v = torch.zeros(D)
    v[:2] = torch.tensor([3.0, 4.0])
    keys = torch.stack([v, -v]).view(2, 1, 1, D).expand(2, 3, 5, D).contiguous()  # [H=2, B=3, T=5, D]
    m = key_metrics(keys)
    assert set(m) == set(KEY_METRICS)
    for name, t in m.items():
        assert t.shape == (2,) and t.dtype == torch.float64, name
    expected = {"norm_mean": 5, "norm_std": 0, "cos_mean": 1, "pr_sv": 1, "erank": 1, "pr_var": 0,
                "pr_vec": 25 ** 2 / (81 + 256), "peak_frac": 16 / 25, "max_abs": 4, "mean_max_abs": 4,
                # components: one 3, one 4 and six zeros per key: mean 7/8, E[x^2] 25/8
                "std": math.sqrt(25 / 8 - (7 / 8) ** 2)}
    # Integer components: the fp32 sums are exact and the float64 steps round a few times, far inside key_metrics' fp32
    # bound; u = k/5 is inexact (cos_mean: cos_tol over T = 5). The zeros (equal norms, C = 0) are exact: abs 0.
    for name, value in expected.items():
        abs_ = cos_tol(5) if name == "cos_mean" else 0.0
        assert close(m[name].tolist(), [value] * 2, rel=sum_rel_tol("fp32", D), abs=abs_), name


def test_orthogonal_keys():
    D, B = 64, 2
    keys = (8 * torch.eye(D)).expand(1, B, D, D).contiguous()  # [H=1, B, T=D, D]: one-hot * 8
    m = key_metrics(keys)
    expected = {"cos_mean": 0, "pr_sv": D, "erank": D, "norm_mean": 8, "norm_std": 0, "max_abs": 8,
                "mean_max_abs": 8, "peak_frac": 1, "pr_vec": 1,
                "std": math.sqrt(63) / 8,  # mean 1/8, E[x^2] = 64/64 = 1, var = 1 - 1/64
                "pr_var": 63}              # covariance I - 11^T/64: eigenvalues 1 (x63) and 0
    for name, value in expected.items():  # u = k/8 is exact, so the zeros are exact (abs 0); the rest is float64
        assert close(m[name].item(), value, rel=sum_rel_tol("fp32", D)), name


@pytest.mark.parametrize("seed", [0, 1])
def test_known_singular_values(seed):
    g = torch.Generator().manual_seed(seed)
    N, D = 200, 16
    spectra = [torch.linspace(0.1, 5.0, D, dtype=torch.float64),
               torch.tensor([10.0, 3.0, 1.0] + [1e-3] * (D - 3), dtype=torch.float64)]
    heads = []
    for s in spectra:
        U, _ = torch.linalg.qr(torch.randn(N, D, generator=g, dtype=torch.float64))  # [N, D] orthonormal columns
        V, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
        heads.append((U * s) @ V.T)
    keys = torch.stack(heads).view(2, 4, 50, D)  # [H=2, B=4, T=50, D]
    m = key_metrics(keys)
    for h, s in enumerate(spectra):
        p = s / s.sum()
        # float64 throughout: eigenvalues of K^T K / N within D eps lambda_max (the route's noise floor, metrics
        # docstring), so s_i within D eps (s_max / s_i)^2 / 2; pr_sv moves by <= 4x, erank by <= 2 ln D x that
        rel = math.log(D) * D * EPS["fp64"] * (s.max() / s.min()).item() ** 2
        assert close(m["pr_sv"][h].item(), (s.sum() ** 2 / (s ** 2).sum()).item(), rel=rel)
        assert close(m["erank"][h].item(), math.exp(-(p * p.log()).sum().item()), rel=rel)


def test_pr_var_known_covariance():
    g = torch.Generator().manual_seed(0)
    D, r = 16, 8
    Q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
    c = torch.arange(1, r + 1, dtype=torch.float64)
    offset = 10 * torch.ones(D, dtype=torch.float64)  # must be removed by centering
    rows = [offset + sign * c[i] * Q[:, i] for i in range(r) for sign in (1, -1)]
    keys = torch.stack(rows).view(1, 2, r, D)  # N = 2r: covariance eigenvalues 2 c_i^2 / N and zeros
    expected = (c ** 2).sum() ** 2 / (c ** 4).sum()
    # C = M - mu mu^T in float64: eigenvalues within D eps lambda_max(M) <= D eps tr(M) (the route's noise floor),
    # which PR = (sum l)^2 / sum l^2 amplifies by <= 4 D / tr(C); tr(M) = |offset|^2 + tr(C)
    tr_c = ((c ** 2).sum() / r).item()
    rel = 4 * D ** 2 * EPS["fp64"] * (offset.square().sum().item() + tr_c) / tr_c
    assert close(key_metrics(keys)["pr_var"].item(), expected.item(), rel=rel)


def test_zero_keys_conventions():
    keys = torch.zeros(1, 2, 4, 8)
    m = key_metrics(keys)
    for name in ("pr_sv", "erank", "pr_var", "pr_vec", "peak_frac", "cos_mean", "norm_mean", "std"):
        assert m[name].item() == 0, name
    # One zero key among unit keys: its cosines count as 0, its pairs stay in the denominator.
    keys = torch.zeros(1, 1, 3, 2)
    keys[0, 0, 0] = torch.tensor([1.0, 0.0])
    keys[0, 0, 1] = torch.tensor([2.0, 0.0])
    assert key_metrics(keys)["cos_mean"].item() == 2 / 6  # pairs (0,1), (1,0): cosine 1; exact (u = k/1, k/2)
    assert math.isnan(key_metrics(torch.randn(1, 2, 1, 4))["cos_mean"].item())  # T = 1: no pairs


# ---------------------------------------------------------------- key metrics, slow references

def test_key_metrics_match_reference():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(3, 4, 20, 16, generator=g) * torch.linspace(0.2, 3, 16) + 0.5  # anisotropic, off-centre
    keys[1] = keys[1] @ torch.randn(16, 16, generator=g)  # correlated dimensions in head 1
    assert_matches(key_metrics(keys), ref_key_metrics(keys), key_tol(keys))  # fp32 key passes against float64


def test_key_metrics_bf16():
    fp32_keys = torch.randn(2, 2, 16, 8, generator=torch.Generator().manual_seed(0))
    keys = fp32_keys.bfloat16()
    got, ref = key_metrics(keys), key_metrics(keys.float())
    for name in KEY_METRICS:  # bf16 input is widened to fp32 exactly: the same fp32 path, bit for bit
        assert torch.equal(got[name], ref[name]), name
    # Against float64 of the same bf16 values only fp32 rounding is left: the fp32 bound (a bf16 one would hide bugs).
    assert_matches(got, ref_key_metrics(keys), key_tol(keys))
    # Against the fp32 keys before rounding: bf16 moved each component by <= u relative (rounding is monotone).
    u, D, ref32, fp32 = unit_roundoff("bf16"), keys.shape[-1], ref_key_metrics(fp32_keys), key_tol(keys)
    pr, x = torch.tensor(ref32["pr_sv"]), fp32_keys.double()
    bf16 = {"norm_mean": (u, 0.0), "max_abs": (u, 0.0), "mean_max_abs": (u, 0.0),  # |k| and max_j |k_j| within u
            "peak_frac": (4 * u, 0.0), "pr_vec": (8 * u, 0.0),                     # ratios of squares, 4th powers
            # stds: centring cancels, |d std| <= rms of the changes <= u * rms of the values
            "norm_std": (0.0, u * x.square().sum(-1).mean((1, 2)).sqrt().max().item()),
            "std": (0.0, u * x.square().mean((1, 2, 3)).sqrt().max().item()),
            "cos_mean": (0.0, 4 * u),  # k/|k| moves by <= 2u, a cosine by <= 4u
            "pr_sv": (pr_rel_tol(u, D, pr).max().item(), 0.0)}  # each component moves by <= u
    assert_matches(got, {n: ref32[n] for n in bf16},  # erank and pr_var have no bound this simple
                   {n: (rel + fp32[n][0], abs_ + fp32[n][1]) for n, (rel, abs_) in bf16.items()})


# ---------------------------------------------------------------- attention metrics

def test_zero_queries_uniform_attention():
    T = 8
    q = torch.zeros(2, 3, T, 16)
    k = torch.randn(1, 3, T, 16)
    m = attention_metrics(q, k, block_size=3)
    entropy = sum(math.log(t + 1) for t in range(T)) / T
    sink = sum(1 / (t + 1) for t in range(T)) / T
    # q = 0: every logit is exactly 0 and p_tj = 1/(t+1) rounded once (u). H_t = -ln p_t0 adds an ulp of the log:
    # |dH| <= u + EPS H, < 2 EPS relative. The sinks are the rounded 1/(t+1), averaged in float64.
    assert close(m["entropy"].tolist(), [entropy] * 2, rel=ulps("fp32", 2))
    assert close(m["sink_mass"].tolist(), [sink] * 2, rel=ulps("fp32", 1))
    assert m["qk_ratio"].tolist() == [0.0, 0.0]


def test_attention_to_first_token_only():
    B, T, D = 2, 12, 16
    k = torch.randn(1, B, T, D)
    k[..., 0] = 0
    k[:, :, 0] = 0
    k[:, :, 0, 0] = 100.0  # key 0 along e_0, every other key orthogonal to e_0
    q = torch.zeros(1, B, T, D)
    q[..., 0] = 10.0        # score 250 on key 0, 0 elsewhere
    m = attention_metrics(q, k, block_size=5)
    # exact in fp32: e^-250 underflows to 0, so every p_t = (1, 0, ..., 0), p ln p = 0 and ln max p = 0
    assert m["sink_mass"].item() == 1.0
    assert m["entropy"].item() == 0.0


def test_logit_statistics_by_hand_with_gqa_and_the_causal_mask():
    """T = 3, D = 4, scale 1/2. Keys: k_0 = (2, 0, 0, 0), k_1 = (0, 2, 0, 0), k_2 = (4, 0, 0, 0) (both KV heads alike
    but the second doubled). Query head 0 (KV head 0) has q_t = (1, 0, 0, 0) at every t: allowed logits
    t=0: {1}; t=1: {1, 0}; t=2: {1, 0, 2} -> six pairs, max 2 (the future key k_2 = 4e_0 is never seen by
    t < 2), mean 5/6, E[s^2] = (1 + 1 + 0 + 1 + 0 + 4)/6 = 7/6. Query head 1 shares KV head 0 with q = 0:
    all logits 0. Query heads 2 and 3 read KV head 1 (keys doubled): logits of heads 0 and 1 doubled."""
    k0 = torch.tensor([[2.0, 0, 0, 0], [0, 2, 0, 0], [4, 0, 0, 0]])   # [T, D]
    k = torch.stack([k0, 2 * k0])[:, None]                            # [Hkv=2, B=1, T=3, D=4]
    e0 = torch.tensor([1.0, 0, 0, 0]).expand(3, 4)
    q = torch.stack([e0, 0 * e0, e0, 0 * e0])[:, None]                # [Hq=4, B=1, T=3, D=4]
    m = attention_metrics(q, k, block_size=2)
    var = 7 / 6 - (5 / 6) ** 2
    # The logits are exact in fp32 (small integers / 2) and summed in float64; mean and std are then rounded to fp32
    # once (the output dtype): one fp32 rounding, 2u = 1 EPS with float64's few ulps.
    assert m["logit_max"].tolist() == [2, 0, 4, 0]
    assert m["logit_mean"].tolist() == pytest.approx([5 / 6, 0, 10 / 6, 0], rel=ulps("fp32", 1), abs=0)
    assert m["logit_std"].tolist() == pytest.approx([var ** 0.5, 0, 2 * var ** 0.5, 0], rel=ulps("fp32", 1), abs=0)


def test_gqa_grouping():
    g = torch.Generator().manual_seed(0)
    B, T, D = 2, 10, 8
    q = torch.randn(1, B, T, D, generator=g).expand(4, B, T, D).contiguous()  # same query in all 4 heads
    k = torch.stack([torch.randn(B, T, D, generator=g), 3 * torch.randn(B, T, D, generator=g)])  # [Hkv=2]
    m = attention_metrics(q, k, block_size=4)
    one_head = [attention_metrics(q[:1], k[kv:kv + 1]) for kv in (0, 1)]
    tol = attention_tol(q, k, paths=2)  # grouped against one head at a time: two fp32 layouts of the same sums
    for name in ATTENTION_METRICS:
        expected = [one_head[h // 2][name].item() for h in range(4)]  # heads 0, 1 -> kv 0; 2, 3 -> kv 1
        assert m[name].tolist() == pytest.approx(expected, rel=tol[name][0], abs=tol[name][1]), name
        # a separation, not a rounding bound: the two KV heads (keys 3x apart) differ by >= 15%, far beyond tol
        assert m[name][0].item() != pytest.approx(m[name][2].item(), rel=1e-3), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_metrics_match_reference(dtype):
    g = torch.Generator().manual_seed(0)
    Hq, Hkv, B, T, D = 4, 2, 3, 37, 16
    q = (2 * torch.randn(Hq, B, T, D, generator=g)).to(dtype)
    k = (2 * torch.randn(Hkv, B, T, D, generator=g)).to(dtype)
    k[:, :, 0] *= 3  # a more sink-like first key
    m = attention_metrics(q, k, block_size=16)  # T not a multiple of the block
    for name in ATTENTION_METRICS:
        assert m[name].shape == (Hq,) and m[name].dtype == torch.float32, name
    assert m["sink_by_position"].shape == (Hq, T) and "output" not in m
    # fp32 attention against float64; for bf16 input too, as the reference reads the same bf16 values (exact in fp32)
    tol = attention_tol(q, k)
    assert_matches(m, ref_attention_metrics(q, k), tol)
    assert_matches(attention_metrics(q, k, block_size=64), ref_attention_metrics(q, k), tol)


def test_sink_mass_matches_sdpa():
    """SDPA with v_j = [j == 0] outputs p_t0: same causal mask, scale and GQA mapping as the model."""
    g = torch.Generator().manual_seed(0)
    Hq, Hkv, B, T, D = 4, 2, 2, 19, 8
    q = 2 * torch.randn(B, Hq, T, D, generator=g)
    k = 2 * torch.randn(B, Hkv, T, D, generator=g)
    v = torch.zeros(B, Hkv, T, 1)
    v[:, :, 0] = 1
    p0 = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [B, Hq, T, 1]
    m = attention_metrics(q.transpose(0, 1), k.transpose(0, 1), block_size=8)
    rel = attention_tol(q.transpose(0, 1), k.transpose(0, 1), paths=2)["sink_mass"][0]  # ours and SDPA's, both fp32
    assert m["sink_mass"].tolist() == pytest.approx(p0.mean((0, 2, 3)).tolist(), rel=rel, abs=0)


def test_non_contiguous_input():
    """Hooks give [B, T, heads, D]; a permuted view must give the same numbers as a contiguous copy."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 9, 4, 8, generator=g).permute(2, 0, 1, 3)  # [Hq, B, T, D], non-contiguous
    k = torch.randn(2, 9, 2, 8, generator=g).permute(2, 0, 1, 3)
    assert not q.is_contiguous() and not k.is_contiguous()
    # the same fp32 arithmetic on the same values; the layout may change BLAS blocking, so two fp32 paths' bounds
    for got, ref, tol in ((key_metrics(k), key_metrics(k.contiguous()), key_tol(k, paths=2)),
                          (attention_metrics(q, k, block_size=4),
                           attention_metrics(q.contiguous(), k.contiguous(), block_size=4),
                           attention_tol(q, k, paths=2))):
        for name in got:
            rel, abs_ = tol[name]
            assert torch.allclose(got[name], ref[name], rtol=rel, atol=abs_, equal_nan=True), name


@pytest.mark.parametrize("window,softcap,block", [(None, None, 5), (4, None, 3), (6, 2.5, 4), (None, 1.0, 64)])
def test_attention_with_window_softcap_scale_and_values_matches_reference(window, softcap, block):
    """The options pretrained models need (Gemma 3: sliding window, soft-cap, its own scale), and the
    attention output that inspection hands back to the model in place of its own."""
    g = torch.Generator().manual_seed(1)
    Hq, Hkv, B, T, D = 4, 2, 2, 13, 8
    q, k = 2 * torch.randn(Hq, B, T, D, generator=g), 2 * torch.randn(Hkv, B, T, D, generator=g)
    v = torch.randn(Hkv, B, T, 5, generator=g)
    m = attention_metrics(q, k, v, scale=0.3, window=window, softcap=softcap, block_size=block)
    ref, out = ref_attention(q, k, v, scale=0.3, window=window, softcap=softcap)
    tol = attention_tol(q, k, v, scale=0.3, softcap=softcap)  # fp32 attention against float64
    assert_matches(m, {n: ref[n] for n in ATTENTION_METRICS}, tol)
    expected_sink = torch.tensor(ref["sink_by_position"], dtype=torch.float64)
    torch.testing.assert_close(m["sink_by_position"].double(), expected_sink, atol=0, rtol=tol["sink_by_position"][0])
    torch.testing.assert_close(m["output"].double(), out, atol=tol["output"][1], rtol=0)
    if window:  # a query more than `window` positions past token 0 cannot see it
        assert (m["sink_by_position"][:, window:] == 0).all()


def test_attention_output_matches_sdpa():
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(2, 4, 11, 8, generator=g), torch.randn(2, 2, 11, 8, generator=g), \
        torch.randn(2, 2, 11, 8, generator=g)  # [B, H, T, D], as SDPA takes them
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    m = attention_metrics(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), block_size=4)
    atol = attention_tol(q.transpose(0, 1), k.transpose(0, 1), v, paths=2)["output"][1]  # ours and SDPA's, both fp32
    torch.testing.assert_close(m["output"].transpose(0, 1), ref, atol=atol, rtol=0)


def test_attention_metrics_rejects_bad_shapes():
    with pytest.raises(ValueError):
        attention_metrics(torch.randn(3, 1, 4, 8), torch.randn(2, 1, 4, 8))


# ---------------------------------------------------------------- gamma and layer helpers

def test_gamma_stats():
    s = gamma_stats(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert s["mean"] == 2.5  # exact: float64 sum of small integers, / 4
    # float64 sums over 4 values (torch's std may update differently from the closed form), then sqrt and /
    assert s["std"] == pytest.approx(math.sqrt(5 / 3), rel=sum_rel_tol("fp64", 4), abs=0)  # unbiased (ddof=1)
    assert s["cv"] == pytest.approx(math.sqrt(5 / 3) / 2.5, rel=sum_rel_tol("fp64", 4), abs=0)
    assert (s["min"], s["max"], s["values"]) == (1.0, 4.0, [1.0, 2.0, 3.0, 4.0])
    assert all(isinstance(s[name], float) for name in ("mean", "std", "cv", "min", "max"))
    assert gamma_stats(None) is None
    assert gamma_stats(torch.nn.Parameter(-torch.ones(3)))["cv"] == 0.0  # |mean| in the denominator


def test_layer_means():
    m = layer_means({"a": torch.tensor([1.0, 2.0, 6.0]), "b": torch.tensor([0.5], dtype=torch.float64)})
    assert m == {"a": 3.0, "b": 0.5}  # exact: (1 + 2 + 6) / 3 in float64
    assert all(isinstance(v, float) for v in m.values())


@pytest.mark.parametrize("window,softcap", [(None, None), (5, None), (None, 2.0)])
def test_logit_split_at_the_largest_logit(window, softcap):
    """logit_max = scale |q| |k| cos at the pair found by a full search of the masked logits (float64); before the
    soft-cap, which keeps the order of logits and so the pair."""
    g = torch.Generator().manual_seed(3)
    Hq, Hkv, B, T, D = 4, 2, 3, 21, 8
    q, k = torch.randn(Hq, B, T, D, generator=g), torch.randn(Hkv, B, T, D, generator=g)
    m = attention_metrics(q, k, scale=0.3, window=window, softcap=softcap, block_size=4)
    t, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (j <= t) & ((t - j < window) if window else True)
    for h in range(Hq):
        kh = k[h // 2].double()
        s = torch.where(allowed, 0.3 * q[h].double() @ kh.mT, -math.inf)            # [B, T, T]
        b, tq, jk = (int(i) for i in torch.unravel_index(s.argmax(), s.shape))
        qv, kv = q[h, b, tq].double(), kh[b, jk]
        assert (int(m["logit_query_pos"][h]), int(m["logit_key_dist"][h])) == (tq, tq - jk)
        assert m["logit_at"][:, h].tolist() == [b, tq, jk]
        assert close(m["logit_q_norm"][h].item(), qv.norm().item(), rel=sum_rel_tol("fp32", D))
        assert close(m["logit_k_norm"][h].item(), kv.norm().item(), rel=2 * sum_rel_tol("fp32", D))
        assert close(m["logit_cos"][h].item(), (qv @ kv / qv.norm() / kv.norm()).item(), rel=0,
                     abs=4 * sum_rel_tol("fp32", D))
        raw = (m["logit_scale"][h] * m["logit_q_norm"][h] * m["logit_k_norm"][h] * m["logit_cos"][h]).item()
        assert m["logit_scale"][h].item() == pytest.approx(0.3, rel=ulps("fp32", 1))
        assert close(raw, s.max().item(), rel=8 * sum_rel_tol("fp32", D))
        expected_max = softcap * math.tanh(s.max().item() / softcap) if softcap else s.max().item()
        assert close(m["logit_max"][h].item(), expected_max, rel=8 * sum_rel_tol("fp32", D))


def test_gain_factor_by_hand():
    """|x| / |x / gain|: 2 for x = (3, 4) under a gain of 2 everywhere; the gain (1, 2) lengthens (0, 2) by 2 and
    leaves (1, 0) alone; a per-head gain over the whole projection (OLMo 2) is read for each head."""
    x = torch.tensor([[[[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]]]])               # [H=1, B=1, T=3, D=2]
    at = torch.tensor([[0, 0, 0], [0, 1, 2]])                                  # (b, t) of three picks
    heads = torch.zeros(3, dtype=torch.long)
    assert gain_factor(x, torch.tensor([2.0, 2.0]), at, heads).tolist() == [2.0, 2.0, 2.0]
    assert gain_factor(x, torch.tensor([1.0, 2.0]), at, heads).tolist()[1:] == [1.0, 2.0]
    x2 = torch.cat([x, x])                                                     # two heads
    got = gain_factor(x2, torch.tensor([1.0, 1.0, 3.0, 3.0]), torch.tensor([[0, 0], [0, 0]]), torch.tensor([0, 1]))
    assert got.tolist() == pytest.approx([1.0, 3.0], rel=ulps("fp32", 2))
