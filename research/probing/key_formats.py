"""The key-cache formats inference engines ship, as fake quantizers (quantize, then dequantize, in float32) of keys
[..., T, D]: FP8 (E4M3, E5M2) with a per-tensor scale or one per (token, head), NVFP4, MXFP4, llama.cpp's q8_0 and
q4_0, and any of them with the first S tokens kept unquantized. Each is defined with its source in docs/probing.md,
"Key-cache formats"; rounding is round-to-nearest-even on the format's grid where the format defines it so, and
saturating at its largest value, except where llama.cpp's reference rounds otherwise (q8_0: roundf, half away
from zero; q4_0: truncation of x/d + 8.5). Pure tensor functions.

    y = fake_format(keys, "nvfp4")            # keys [..., T, D], D a multiple of the format's block
    y = fake_format(keys, "q8_0", keep=32)    # the first 32 tokens unquantized (attention sinks)
"""
from __future__ import annotations

import torch

E4M3_MAX, E5M2_MAX, E2M1_MAX = 448.0, 57344.0, 6.0
# E2M1's non-negative values and whether each is an even one (mantissa bit 0): ties round to the even neighbour
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_EVEN = (True, False, True, False, True, False, True, False)
NVFP4_BLOCK, MX_BLOCK, GGML_BLOCK = 16, 32, 32
NVFP4_GLOBAL = E4M3_MAX * E2M1_MAX  # 2688: NVFP4's per-tensor FP32 scale is amax / 2688

# name -> (bytes per key value, what it is); the formats qk's key-cache measurements take
FORMATS: dict[str, tuple[float, str]] = {
    "fp8_e4m3": (1.0, "FP8 E4M3, one FP32 scale per tensor (amax / 448): vLLM --kv-cache-dtype fp8"),
    "fp8_e5m2": (1.0, "FP8 E5M2, one FP32 scale per tensor (amax / 57344)"),
    "fp8_e4m3_token": (1.0 + 4 / 128, "FP8 E4M3, one FP32 scale per (token, head): FlashInfer PR #5272"),
    "fp8_e5m2_token": (1.0 + 4 / 128, "FP8 E5M2, one FP32 scale per (token, head)"),
    "nvfp4": (0.5 + 1 / 16, "NVFP4: E2M1 values, an E4M3 scale per 16 values, an FP32 global scale amax / 2688: "
                            "vLLM PR #37192, SGLang PR #21954"),
    "mxfp4": (0.5 + 1 / 32, "MXFP4 (OCP MX): E2M1 values, a power-of-two E8M0 scale per 32 values"),
    "q8_0": (34 / 32, "llama.cpp q8_0: blocks of 32 int8 values, symmetric, one fp16 scale amax / 127"),
    "q4_0": (18 / 32, "llama.cpp q4_0: blocks of 32 4-bit values, symmetric, one fp16 scale max / -8"),
}
KEEP = (4, 32)  # the first S tokens kept unquantized that the measurements try (tract PR #2458; KVCrush keeps 32)


def cases(D: int) -> tuple[str, ...]:
    """The key-cache loss's cases for head size D: every format whose blocks split D, alone and with the first S
    tokens kept (S in KEEP), "name+keepS"."""
    fits = [f for f in FORMATS if D % {"nvfp4": NVFP4_BLOCK, "mxfp4": MX_BLOCK, "q8_0": GGML_BLOCK,
                                        "q4_0": GGML_BLOCK}.get(f, 1) == 0]
    return (*fits, *(f"{f}+keep{k}" for k in KEEP for f in fits))


def split_case(case: str) -> tuple[str, int]:
    """'nvfp4+keep32' -> ('nvfp4', 32); 'q8_0' -> ('q8_0', 0)."""
    name, _, keep = case.partition("+keep")
    return name, int(keep) if keep else 0


def usable_format(changes: dict[str, float], base: float, margin: float) -> str | None:
    """The case of fewest bytes per key value whose loss change lies within margin x |base| (the first listed among
    equals; keeping S tokens counts the format's bytes: S tokens of a long cache), None where none does."""
    ok = [c for c, v in changes.items() if abs(v) <= margin * abs(base)]
    return min(ok, key=lambda c: bytes_per_value(split_case(c)[0])) if ok else None


class FormatError(ValueError):
    """A head size a block format cannot split, or an unknown format."""


def _fp8(x: torch.Tensor, e4m3: bool) -> torch.Tensor:
    """x rounded to FP8 (torch's cast: round to nearest even), saturating at the format's largest value."""
    top = E4M3_MAX if e4m3 else E5M2_MAX
    dtype = torch.float8_e4m3fn if e4m3 else torch.float8_e5m2
    return x.clamp(-top, top).to(dtype).float()


def e2m1(x: torch.Tensor) -> torch.Tensor:
    """x rounded to E2M1 (FP4), ties to the even neighbour, saturating at +-6."""
    grid = torch.tensor(E2M1_GRID, device=x.device)
    even = torch.tensor(E2M1_EVEN, device=x.device)
    a = x.abs().clamp(max=E2M1_MAX)
    hi = torch.bucketize(a.contiguous(), grid).clamp(1, len(grid) - 1)          # grid[hi - 1] <= a <= grid[hi]
    lo_v, hi_v = grid[hi - 1], grid[hi]
    up = (a - lo_v > hi_v - a) | ((a - lo_v == hi_v - a) & even[hi])
    return torch.where(up, hi_v, lo_v) * x.sign()


def _blocks(x: torch.Tensor, block: int, name: str) -> torch.Tensor:
    D = x.shape[-1]
    if D % block:
        raise FormatError(f"{name} quantizes blocks of {block} values of a key; head size {D} is not a multiple of "
                          f"{block}: use an fp8 format")
    return x.unflatten(-1, (D // block, block))                                  # [..., D / block, block]


def _scaled_fp8(x: torch.Tensor, e4m3: bool, dims) -> torch.Tensor:
    amax = x.abs().amax(dims, keepdim=True) if dims else x.abs().amax()
    s = amax / (E4M3_MAX if e4m3 else E5M2_MAX)
    s = torch.where(s > 0, s, 1.0)
    return _fp8(x / s, e4m3) * s


def nvfp4(x: torch.Tensor) -> torch.Tensor:
    """NVFP4: global = amax / 2688 (FP32); per 16 values an E4M3 scale of the block's amax / 6 in units of the
    global one; values E2M1 of x / (block scale x global)."""
    g = x.abs().amax() / NVFP4_GLOBAL
    g = torch.where(g > 0, g, 1.0)
    b = _blocks(x, NVFP4_BLOCK, "nvfp4")
    s = _fp8(b.abs().amax(-1, keepdim=True) / E2M1_MAX / g, True) * g             # the block's scale, as stored
    safe = torch.where(s > 0, s, 1.0)
    return (e2m1(b / safe) * s).flatten(-2)


def mxfp4(x: torch.Tensor) -> torch.Tensor:
    """MXFP4: per 32 values the power of two 2^(floor(log2 amax) - 2) (E8M0; 2 is E2M1's largest exponent), values
    E2M1 of x / scale, saturating at 6."""
    b = _blocks(x, MX_BLOCK, "mxfp4")
    amax = b.abs().amax(-1, keepdim=True)
    s = torch.where(amax > 0, torch.exp2(torch.floor(torch.log2(amax.clamp_min(1e-38))) - 2), 1.0)
    return (e2m1(b / s) * s).flatten(-2)


def q8_0(x: torch.Tensor) -> torch.Tensor:
    """llama.cpp's quantize_row_q8_0_ref: d = amax / 127, values roundf(x / d) (half away from zero) with the FP32
    d's inverse, stored d as fp16; dequantized with the fp16 d."""
    b = _blocks(x, GGML_BLOCK, "q8_0")
    d = b.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, 0.0)
    q = torch.trunc(b * inv + 0.5 * torch.sign(b))                               # roundf
    return (q * d.half().float()).flatten(-2)


def q4_0(x: torch.Tensor) -> torch.Tensor:
    """llama.cpp's quantize_row_q4_0_ref: max the block's value of largest magnitude (its sign kept), d = max / -8,
    q = min(15, (int8)(x / d + 8.5)), dequantized (q - 8) x fp16(d)."""
    b = _blocks(x, GGML_BLOCK, "q4_0")
    idx = b.abs().argmax(-1, keepdim=True)
    d = b.gather(-1, idx) / -8
    inv = torch.where(d != 0, 1 / d, 0.0)
    q = torch.trunc(b * inv + 8.5).clamp(max=15)
    return ((q - 8) * d.half().float()).flatten(-2)


def fake_format(keys: torch.Tensor, name: str, keep: int = 0) -> torch.Tensor:
    """keys [..., T, D] (one layer's, heads in a leading dim) through format `name` and back, float32 math, in the
    keys' dtype; `keep`: the first `keep` tokens pass unquantized (bit for bit)."""
    if name not in FORMATS:
        raise FormatError(f"unknown key-cache format {name!r}: choose one of {', '.join(FORMATS)}")
    x = keys.float()
    if name in ("fp8_e4m3", "fp8_e5m2"):  # one scale over the layer's whole cache
        y = _scaled_fp8(x, name == "fp8_e4m3", None)
    elif name.endswith("_token"):
        y = _scaled_fp8(x, name.startswith("fp8_e4m3"), (-1,))
    else:
        y = {"nvfp4": nvfp4, "mxfp4": mxfp4, "q8_0": q8_0, "q4_0": q4_0}[name](x)
    if keep:
        y = torch.cat([x[..., :keep, :], y[..., keep:, :]], -2)
    return y.to(keys.dtype)


def bytes_per_value(name: str) -> float:
    """Bytes a key value takes in the format, its scales shared out (FP32 per-tensor scales counted as 0)."""
    return FORMATS[name][0]


def dot_rmse(x_trials: torch.Tensor, quantized: torch.Tensor, q_trials: torch.Tensor) -> float:
    """Relative RMSE of q . k with k quantized, against q . k exact, over trials [N, D] (Camelid PR #709's
    measure: the error of the dot products attention takes)."""
    exact = (q_trials * x_trials).sum(-1).double()
    got = (q_trials * quantized).sum(-1).double()
    return float(((got - exact) ** 2).mean().sqrt() / (exact ** 2).mean().sqrt())


def camelid_regimes(trials: int = 8000, D: int = 128, seed: int = 0) -> dict[str, torch.Tensor]:
    """Camelid PR #709's two regimes, [trials, D] float32: Gaussian values, and Gaussian with one value in each 32
    multiplied by 100."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(trials, D, generator=g)
    out = x.clone()
    pick = torch.randint(0, 32, (trials, D // 32), generator=g) + torch.arange(0, D, 32)
    out.scatter_(1, pick, out.gather(1, pick) * 100)
    return {"gaussian": x, "outlier": out}


def e4m3_block32(x: torch.Tensor) -> torch.Tensor:
    """FP8 E4M3 with an fp16 scale amax / 448 per 32 values (34 bytes per 32, Camelid's layout for its E4M3 row)."""
    b = _blocks(x, GGML_BLOCK, "e4m3_block32")
    s = (b.abs().amax(-1, keepdim=True) / E4M3_MAX).half().float()
    safe = torch.where(s > 0, s, 1.0)
    return (_fp8(b / safe, True) * safe).flatten(-2)


__all__ = ["FORMATS", "KEEP", "FormatError", "bytes_per_value", "camelid_regimes", "cases", "dot_rmse", "e2m1",
           "e4m3_block32", "fake_format", "split_case", "usable_format"]
