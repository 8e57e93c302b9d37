"""What a key cache would cost a Hugging Face causal LM: kv_cache.py's section (each layer's attention errors with its
keys fake-quantized or projected on their top directions, and the loss with every layer's keys quantized) measured
through the model's adapter, so that the pretrained-key study and the Hugging Face probe report what the training
probe reports for this project's models.

    section = hf_kv_cache_record(adapter, ids_BT)          # results.json's "kv_cache" form (KV_CACHE)

The errors are read from the model's own attention call; the losses from forwards whose attention is computed here
(causal_attention, float32) from keys quantized per token before rotary. How, and what was checked: docs/probing.md,
"Any Hugging Face model while it trains".
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from research.probing.hf.rotary import RopeError, layer_ropes
from research.probing.key_bits import cache_quantize, fake_quantize
from research.probing.kv_cache import LOSS_BITS, LOSS_SCHEME, ErrorSink, KVError, key_cache

LOSS_CHUNK = 64  # positions whose vocabulary logits are formed at once for a batch's loss


class _NoRope:
    """The identity in AdapterRope's place for a model without RoPE (GPT-2): keys before and after rotary are one."""

    def __call__(self, x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        return x.float()

    inverse = on_heads_last = __call__


def ropes_of(adapter) -> list:
    """Each layer's RoPE (hf.rotary.AdapterRope, built once), the identity where the model has none."""
    ropes = layer_ropes(adapter) or [None] * adapter.n_layers
    return [_NoRope() if r is None else r for r in ropes]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None = None,
                     softcap: float | None = None) -> torch.Tensor:
    """Causal attention in float32: q [Hq, B, T, D], k [Hkv, B, T, D], v [Hkv, B, T, Dv] (query head h reads KV head
    h // G) -> [Hq, B, T, Dv]. Logits scale q . k, soft-capped as softcap tanh(s / softcap) where given; key j is
    seen by query t when j <= t and, with a sliding window, t - j < window (transformers' convention)."""
    G = q.shape[0] // k.shape[0]
    s = (q.float() @ k.float().repeat_interleave(G, 0).mT) * scale                 # [Hq, B, T, T]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    t = torch.arange(q.shape[2], device=q.device)
    allowed = t[None, :] <= t[:, None]
    if window:
        allowed &= t[:, None] - t[None, :] < window
    return s.masked_fill(~allowed, float("-inf")).softmax(-1) @ v.float().repeat_interleave(G, 0)


def next_token_loss(adapter, h_BTd: torch.Tensor, ids: torch.Tensor) -> float:
    """Mean next-token loss (nats) from the last hidden states, LOSS_CHUNK positions of logits at a time."""
    h, target = h_BTd[:, :-1].flatten(0, 1), ids[:, 1:].flatten()
    total = 0.0
    for s in range(0, h.shape[0], LOSS_CHUNK):
        z = adapter.logits(h[s:s + LOSS_CHUNK].unsqueeze(0)).squeeze(0)
        total += F.cross_entropy(z, target[s:s + LOSS_CHUNK], reduction="sum").item()
    return total / target.numel()


def _heads_first(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.transpose(0, 1).float() for x in xs]                              # [B, H, T, D] -> [H, B, T, D]


class _Quantized:
    """Every layer's attention computed here, from its keys quantized per token before rotary at `bits` (16:
    unchanged) in `layers` (None: all), unchanged in the others."""

    def __init__(self, adapter, bits: int, ropes: list, layers=None):
        self.adapter, self.bits, self.final, self.ropes = adapter, bits, None, ropes
        self.layers = set(range(adapter.n_layers) if layers is None else layers)

    def on_state(self, l, h):
        if l == self.adapter.n_layers:
            self.final = h

    def on_keys(self, *args) -> None:  # the losses read the attention call alone
        pass

    def on_attention(self, i, q, k, v, scaling, window, softcap):
        rope = self.ropes[i]
        q, k, v = _heads_first(q, k, v)
        with torch.autocast(q.device.type, enabled=False):
            if i in self.layers and isinstance(self.bits, str):  # a format engines ship: the cache after RoPE
                k = cache_quantize(k, self.bits)
            elif i in self.layers:
                k = rope(fake_quantize(rope.inverse(k), self.bits, LOSS_SCHEME))
            return causal_attention(q, k, v, scaling, window, softcap).permute(1, 2, 0, 3)


def quantized_losses(adapter, ids: torch.Tensor, bits=LOSS_BITS, layers=None) -> dict[int, float]:
    """{b: the mean next-token loss of ids [B, T] with the keys of `layers` (None: every layer's) quantized to b
    bits} (one forward each)."""
    losses, ropes = {}, ropes_of(adapter)
    for b in bits:
        sink = _Quantized(adapter, b, ropes, layers)
        with adapter.capture(sink):
            adapter.model(input_ids=ids, use_cache=False, logits_to_keep=1)
        losses[b] = next_token_loss(adapter, sink.final, ids)
    return losses


def hf_kv_cache_record(adapter, ids_BT: torch.Tensor, precision: str = "fp32", errors: bool = True,
                       per_layer: bool = False) -> dict:
    """kv_cache.key_cache of the model behind `adapter` on token ids [B, T] (every sequence): its layer errors
    (errors=False: none) and its losses (quantized_losses). The errors cost most: 30 approximate attentions per layer
    (on random tensors of SmolLM2-135M's sizes, 4 x 256 tokens: 5.8 s a layer on 2 cores at load 6-7)."""
    ids = ids_BT.to(next(adapter.model.parameters()).device)

    def layer_errors_of_a_forward() -> list[dict]:
        sink = ErrorSink(ropes_of(adapter), inverse=True)
        if errors:
            with adapter.capture(sink):
                adapter.model(input_ids=ids, use_cache=False, logits_to_keep=1)
        return sink.layers
    try:
        return key_cache(adapter.model, precision, ids.shape, adapter.head_dim, adapter.n_layers,
                         layer_errors_of_a_forward, lambda b, layers: quantized_losses(adapter, ids, (b,), layers)[b],
                         per_layer)
    except RopeError as e:
        raise KVError(f"{e}: its keys before rotary cannot be recovered for the key-cache measurements") from e
