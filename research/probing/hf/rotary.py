"""A Hugging Face model's RoPE as its adapter describes it (rope_pairing, rotary_dims, rotary_frequencies and the
rotary module's attention_scaling), so that a key cache's measurements can quantize or project keys before rotary
and rotate them after, and read each rotary pair's share where RoPE rotates only some of a head's dims (GPT-NeoX's
partial rotary). Pure tensor functions and one small class; nothing here assumes a convention of its own.

    rope = AdapterRope(adapter, i)            # layer i's RoPE (Gemma 3: the layer type's frequencies)
    k_pre = rope.inverse(k_post)              # [H, B, T, D], positions 0..T-1
    use = head_rotary_use(energy_HD, rope, context)      # rotary_use's fields over all D/2 pairs

How a head's dims are paired, unrotated ones included: docs/probing.md, "Any Hugging Face model while it trains".
"""
from __future__ import annotations

import torch

from research.probing.rotary_use import logit_pair_shares, pair_dims, rotary_use
from research.results.vocabulary import QUERY_ROTARY, ROTARY_METRICS
from utils.errors import UserError


class RopeError(UserError, ValueError):
    """A model whose RoPE this module cannot reproduce (no frequencies known, an odd number of unrotated dims)."""


class AdapterRope:
    """Layer i's RoPE: `rotary_dims` of D dims turn, pair j by angle position x f_j (times attention_scaling on
    the cos and sin, transformers' convention). Call it on [H, B, T, D] vectors at positions 0..T-1."""

    def __init__(self, adapter, i: int):
        D, R = adapter.head_dim_of(i), adapter.rotary_dims_of(i)
        f = adapter.rotary_frequencies(i) if adapter.rope_pairing else None
        if f is None or R == 0:
            raise RopeError(f"the {adapter.family} adapter knows no RoPE frequencies for layer {i}: the model has no "
                            f"RoPE, or one this tool does not read")
        if f.numel() != R // 2 or (D - R) % 2:
            raise RopeError(f"layer {i}: {f.numel()} rotary frequencies for {R} rotated of {D} dims do not pair up")
        self.D, self.R, self.pairing = D, R, adapter.rope_pairing
        self.frequencies = f.detach().float().cpu()                                 # [R/2] rad per position
        emb = getattr(getattr(adapter, "base", None), "rotary_emb", None)
        self.scaling = float(getattr(emb, "attention_scaling", 1.0) or 1.0)
        a, b = pair_dims(R, self.pairing)                                           # the rotated pairs' dims
        u = torch.arange(R, D)
        ua, ub = u[:(D - R) // 2], u[(D - R) // 2:]                                 # the unrotated dims, paired
        self.order = torch.cat([a, ua, b, ub])                                      # pair j: order[j], order[j + D/2]
        self.pair_frequencies = torch.cat([self.frequencies, torch.zeros((D - R) // 2)])   # [D/2]
        self._dims = (a, b)

    def __call__(self, x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """x [H, B, T, D] rotated by its position t in 0..T-1 (inverse: rotated back), in float32."""
        x = x.float()
        T = x.shape[2]
        angle = torch.arange(T, dtype=torch.float32).unsqueeze(1) * self.frequencies       # [T, R/2]
        cos, sin = angle.cos() * self.scaling, angle.sin() * self.scaling
        if inverse:  # R^-1 = R^T / s^2: cos/s^2 and -sin/s^2 of the scaled ones
            cos, sin = cos / self.scaling ** 2, -sin / self.scaling ** 2
        cos, sin = cos.to(x.device), sin.to(x.device)
        a, b = (d.to(x.device) for d in self._dims)
        out = x.clone()
        xa, xb = x[..., a], x[..., b]
        out[..., a] = xa * cos - xb * sin
        out[..., b] = xb * cos + xa * sin
        return out

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        return self(x, inverse=True)

    def use(self, t: dict[str, torch.Tensor], key_energy, logit_at: torch.Tensor, context: int) -> tuple[dict, ...]:
        """ModelRope.use's fields from the rotated t["q_rope"], t["k_rope"] [H, B, T, D] the attention reads (a
        rotation keeps each pair's energy: the shares before rotary; key_energy unread), pairs in `order`."""
        q, k = t["q_rope"], t["k_rope"]
        Hkv, order = k.shape[0], self.order.to(q.device)
        energy = torch.cat([x.detach().float().square().sum((1, 2)).double() for x in (k, q)])  # [H, D] float64
        use = head_rotary_use(energy, self, context)
        pairs = {"k_norm": use["pair_share"][:Hkv], "q_norm": use["pair_share"][Hkv:],
                 "logit": logit_pair_shares(q[..., order], k[..., order], logit_at, "half")}
        queries = dict(zip(QUERY_ROTARY, (use[n][Hkv:] for n in ROTARY_METRICS)))
        return {n: use[n][:Hkv] for n in ROTARY_METRICS}, queries, {k: v.tolist() for k, v in pairs.items()}

    def on_heads_last(self, x_BTHD: torch.Tensor) -> torch.Tensor:
        """The same on [B, T, H, D] vectors (this project's Rotary's layout, what kv_cache.layer_errors calls)."""
        return self(x_BTHD.permute(2, 0, 1, 3)).permute(1, 2, 0, 3)


def head_rotary_use(energy_HD: torch.Tensor, rope: AdapterRope, context: int) -> dict[str, torch.Tensor]:
    """rotary_use's pair_share [H, D/2], low_freq_share [H], dominant_pair [H] of heads whose energy per dim is
    energy_HD [H, D] (any positive multiple per head; a rotation keeps each pair's energy, so the keys before or
    after rotary give the same), pairs in `rope.order`'s order, `context` tokens the wavelengths are read against."""
    ordered = energy_HD[:, rope.order.to(energy_HD.device)]
    return rotary_use(None, rope.pair_frequencies, context, "half", energy=ordered)


def rope_context(adapter, fallback: int, window: int | None = None) -> int:
    """The context a layer's low_freq_share reads wavelengths against: the model's own (its config's
    max_position_embeddings or the like, adapter.context), else `fallback`; a sliding window shorter than it."""
    context = adapter.context or fallback
    return min(context, window) if window else context


def layer_ropes(adapter) -> list[AdapterRope | None] | None:
    """Each layer's AdapterRope, built once per model (None for a layer without RoPE: SmolLM3's NoPE layers); None
    for a model without RoPE."""
    if not adapter.rope_pairing or not adapter.rotary_dims:
        return None
    return [AdapterRope(adapter, i) if adapter.layer_has_rope(i) else None for i in range(adapter.n_layers)]
