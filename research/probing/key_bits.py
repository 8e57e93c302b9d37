"""How few bits each key can be stored in: keys fake-quantized (quantized and dequantized in floating point) in
three schemes, the attention errors they cause, and the loss of a model whose every key is quantized. Pure tensor
functions, and one context manager that quantizes a MinimalLLM's keys at its hook points.

    fake_quantize(keys, bits, scheme), quantization_errors(q, k, v), quantized_keys(model, bits, scheme, site)

Schemes (SCHEMES, asymmetric min/max): per_channel over groups of GROUP tokens (KIVI), per_token, per_token_hadamard
(QuaRot); bits None or >= 16 leave the keys unchanged. Shape legend: H heads (Hq query heads, Hkv key/value heads),
B batch, T sequence, D head size. The schemes and what they cost: docs/probing.md, "Usable key bits".
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from functools import lru_cache

import torch

from research.probing.attention_error import attention_errors
from research.probing.key_formats import fake_format, split_case
from research.results.vocabulary import KV_SCHEMES

SCHEMES = KV_SCHEMES
GROUP = 32  # tokens per per_channel group, KIVI's
KEY_SITES = {"pre_rope": "hook_k_norm", "post_rope": "hook_k_rope"}  # where quantized_keys quantizes a MinimalLLM


@lru_cache(maxsize=8)
def hadamard(D: int, device: str = "cpu") -> torch.Tensor:
    """The orthonormal Walsh-Hadamard matrix [D, D] float32 (Sylvester's construction, divided by sqrt(D)):
    symmetric, and its own inverse. ValueError unless D is a power of two."""
    if D < 1 or D & (D - 1):
        raise ValueError(f"the Hadamard rotation needs a head size that is a power of two, got D={D}; use the "
                         f"per_token or per_channel scheme")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < D:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return (h / math.sqrt(D)).float().to(device)


def _min_max(x: torch.Tensor, dims: tuple[int, ...], bits: int) -> torch.Tensor:
    """x quantized asymmetrically to 2^bits levels over `dims` (one min and one step per slice), dequantized."""
    lo, hi = x.amin(dims, keepdim=True), x.amax(dims, keepdim=True)
    step = (hi - lo) / (2 ** bits - 1)
    safe = torch.where(step > 0, step, 1)                                       # a constant slice stays exact
    return ((x - lo) / safe).round_().clamp_(0, 2 ** bits - 1).mul_(step).add_(lo)


@torch.no_grad()
def fake_quantize(keys: torch.Tensor, bits: int | None, scheme: str, group: int = GROUP) -> torch.Tensor:
    """keys [..., T, D] (one layer's: [H, B, T, D] or [B, H, T, D]) quantized to `bits` bits in `scheme` and
    dequantized, in float32, returned in the keys' dtype; bits None or >= 16: the keys themselves."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    if bits is None or bits >= 16:
        return keys
    if isinstance(bits, bool) or not isinstance(bits, int) or bits < 1:
        raise ValueError(f"bits must be a whole number from 1 (or None, or 16: unquantized), got {bits!r}")
    x = keys.float()
    if scheme == "per_channel":
        T = x.shape[-2]
        whole = T - T % group
        parts = [_min_max(x[..., :whole, :].unflatten(-2, (-1, group)), (-2,), bits).flatten(-3, -2)]
        if whole < T:  # the short last group, over the tokens it has
            parts.append(_min_max(x[..., whole:, :], (-2,), bits))
        return torch.cat(parts, -2).to(keys.dtype)
    if scheme == "per_token":
        return _min_max(x, (-1,), bits).to(keys.dtype)
    h = hadamard(x.shape[-1], str(x.device))
    with torch.autocast(x.device.type, enabled=False):                          # the rotation in float32, always
        return (_min_max(x @ h, (-1,), bits) @ h).to(keys.dtype)


@torch.no_grad()
def quantization_errors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None, bits=(8, 4, 3, 2),
                        schemes=SCHEMES, *, group: int = GROUP, scale: float | None = None,
                        softcap: float | None = None, block_size: int = 32,
                        dtype: torch.dtype = torch.float32) -> dict[tuple[str, int], dict[str, torch.Tensor]]:
    """The causal attention of one layer with its keys fake-quantized, against the exact one, per query head.

    q: [Hq, B, T, D], k: [Hkv, B, T, D] (before or after rotary: the model's attention needs them after),
    v: [Hkv, B, T, Dv] or None. Returns {(scheme, bits): attention_errors' {logit_error (relative Frobenius
    error of the causal logits), attention_kl (mean KL(p_exact || p_quantized) of the attention rows, nats),
    output_error (relative error of the attention output; NaN without v)}, float64 [Hq]}: one exact attention and
    one per (scheme, bits)."""
    cases = [(s, b) for s in schemes for b in bits]
    approx = [(q, fake_quantize(k, b, s, group)) for s, b in cases]
    return dict(zip(cases, attention_errors(q, k, v, approx, scale=scale, softcap=softcap, block_size=block_size,
                                            dtype=dtype)))


def cache_quantize(keys: torch.Tensor, case, scheme: str = "per_token", group: int = GROUP) -> torch.Tensor:
    """keys [..., T, D] as a key cache stores them: `case` bits of an integer scheme (fake_quantize), or a format
    engines ship, "name" or "name+keepS" (research.probing.key_formats: the first S tokens unquantized)."""
    if isinstance(case, str):
        name, keep = split_case(case)
        return fake_format(keys, name, keep)
    return fake_quantize(keys, case, scheme, group)


@contextmanager
def quantized_keys(model, bits, scheme: str, site: str = "pre_rope", layers=None,
                   group: int = GROUP):
    """While open, every forward of `model` (a models.llm.MinimalLLM) runs with the keys of `layers` (all when None)
    fake-quantized at `site`: pre_rope (hook_k_norm's output, the keys before rotary) or post_rope (hook_k_rope's,
    what the attention reads); `bits` a number of bits of `scheme`, or a key-cache format (cache_quantize). A forward
    hook that returns a tensor replaces the hook point's output; the hooks are removed on leaving, even after an
    error."""
    if site not in KEY_SITES:
        raise ValueError(f"unknown site {site!r}: choose one of {', '.join(KEY_SITES)}")
    cache_quantize(torch.zeros(1, 1, 1, model.cfg.d_head), bits, scheme)         # refuse a bad scheme or D now

    def hook(module, inputs, out_BTKD):                                        # [B, T, K, D] -> tokens on dim -2
        return cache_quantize(out_BTKD.transpose(1, 2), bits, scheme, group).transpose(1, 2)

    chosen = range(len(model.blocks)) if layers is None else layers
    handles = [getattr(model.blocks[i].attn, KEY_SITES[site]).register_forward_hook(hook) for i in chosen]
    try:
        yield model
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def quantized_loss(model, idx_BT: torch.Tensor, targets_BT: torch.Tensor, bits, scheme: str,
                   site: str = "pre_rope", layers=None) -> float:
    """The mean cross-entropy of `model` on (idx, targets) in eval mode with its keys fake-quantized
    (quantized_keys), as a float; the model's train/eval mode is restored. One forward pass."""
    was_training = model.training
    model.eval()
    try:
        with quantized_keys(model, bits, scheme, site, layers):
            return model(idx_BT, targets_BT).item()
    finally:
        model.train(was_training)
