"""What a key cache would cost the trained model: each layer's attention errors with its keys fake-quantized or
projected on their top directions, and the loss with every layer's keys quantized. Measured once at the end of a
run (ProbeCallback, beside the gain ablation; with kv_every_probe at every probe too), on the first KV_ROWS
sequences of the probe batch.

    section = kv_cache_record(model, ids_BT, targets_BT)      # results.json's "kv_cache" (KV_CACHE)

key_cache is the one driver this project's models and Hugging Face ones (hf/kv.py) share. The section's fields, why
keys before rotary are rotated after, the formats engines ship and the cost: docs/probing.md, "In the training
probe" and "Key-cache formats".
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from research.analysis.rules import LOSS_MARGIN
from research.probing.attention_error import attention_errors
from research.analysis.key_cache import usable_k_bits
from research.probing.key_bits import cache_quantize, fake_quantize, quantized_loss
from research.probing.key_formats import bytes_per_value, cases as format_cases, split_case, usable_format
from research.probing.key_rank import key_basis
from research.probing.metrics import key_moments
from research.access.own_adapter import OwnAdapter
from research.probing.probe import measuring, unwrap
from research.results.vocabulary import KV_SCHEMES, KV_SITES
from utils.errors import UserError

KV_ROWS = 8  # the probe batch's first sequences the section is measured on (all of them where it has fewer)
KV_BITS = (8, 4, 3, 2)  # the widths the errors are measured at and usable_k_bits chooses from
LOSS_BITS = (16, *KV_BITS)  # 16: the keys unchanged, the reference loss (its change is 0)
LOSS_SCHEME, LOSS_SITE = "per_token", "pre_rope"  # how the loss's keys are quantized
RANK_DIVISORS = (8, 4, 2)  # r = D/8, D/4, D/2


class KVError(UserError, ValueError):
    """Key-cache measurements this tool cannot make on a model or batch; the message says why and what to do."""


def _rotate(rotary: nn.Module, x_HBTD: torch.Tensor) -> torch.Tensor:
    """RoPE of [H, B, T, D] vectors (the model's Rotary takes [B, T, H, D])."""
    return rotary(x_HBTD.permute(1, 2, 0, 3)).permute(2, 0, 1, 3)


def _projector(basis: torch.Tensor, r: int) -> torch.Tensor:
    """[Hkv, 1, D, D]: U_r U_r^T of each KV head (basis [Hkv, D, D], key_basis')."""
    U = basis[..., :r].float()
    return (U @ U.mT).unsqueeze(1)


def schemes_for(D: int) -> tuple[str, ...]:
    """The schemes a head size allows: the Hadamard rotation needs a power of two."""
    return KV_SCHEMES if D & (D - 1) == 0 else tuple(s for s in KV_SCHEMES if s != "per_token_hadamard")


@torch.no_grad()
def layer_errors(t: dict[str, torch.Tensor], rotary, softcap: float | None = None, scale: float | None = None) -> dict:
    """One layer's {"quantized": {site: {scheme: {bits: errors}}}, "projected": {site: {r: errors}}} (errors:
    {logit_error, attention_kl, output_error} as float lists over the query heads), from ErrorSink's tensors:
    k_norm (before rotary), q_rope, k_rope, v ([heads, B, T, D] each). rotary: RoPE of [B, T, H, D] vectors (the
    model's Rotary, or hf.rotary.AdapterRope.on_heads_last); scale: the logits' (None: 1/sqrt(D))."""
    q, k_pre, k_post, v = (t[n].float() for n in ("q_rope", "k_norm", "k_rope", "v"))
    D = q.shape[-1]
    cases = [(site, s, b) for site in KV_SITES for s in schemes_for(D) for b in KV_BITS]
    approx = [(q, _rotate(rotary, fake_quantize(k_pre, b, s)) if site == "pre_rope" else fake_quantize(k_post, b, s))
              for site, s, b in cases]
    formats = [c for c in format_cases(D) if "+keep" not in c]  # the engines' formats, on the cache (after RoPE)
    approx += [(q, cache_quantize(k_post, c)) for c in formats]
    ranks = [D // n for n in RANK_DIVISORS]
    bases = {"pre_rope": key_basis(key_moments(k_pre)), "post_rope": key_basis(key_moments(k_post))}
    projected = [(site, r) for site in KV_SITES for r in ranks]
    for site, r in projected:
        P = _projector(bases[site], r)
        approx.append((q, _rotate(rotary, k_pre @ P) if site == "pre_rope" else k_post @ P))
    errors = [{name: e.tolist() for name, e in err.items()}
              for err in attention_errors(q, k_post, v, approx, scale=scale, softcap=softcap)]
    out: dict = {"quantized": {}, "projected": {}, "formats": {}}
    for (site, s, b), err in zip(cases, errors):
        out["quantized"].setdefault(site, {}).setdefault(s, {})[str(b)] = err
    for c, err in zip(formats, errors[len(cases):]):
        out["formats"][c] = err
    for (site, r), err in zip(projected, errors[len(cases) + len(formats):]):
        out["projected"].setdefault(site, {})[str(r)] = err
    return out


def layer_bits(per_layer: list[dict], base: float) -> dict:
    """The section's per-layer usable bits and formats: each layer's losses with only its keys quantized, by bits
    and by format ({bits or format: loss} per layer), each layer's usable_k_bits within the loss margin of `base`
    (the unquantized loss), and its usable_k_format (the fewest bytes per value within it)."""
    bits = [{b: v for b, v in losses.items() if not isinstance(b, str)} for losses in per_layer]
    fmts = [{c: v for c, v in losses.items() if isinstance(c, str)} for losses in per_layer]
    return {"by_bits": [{str(b): v for b, v in x.items()} for x in bits],
            "usable_k_bits": [usable_k_bits(x, base, LOSS_MARGIN) for x in bits],
            "by_format": fmts,
            "usable_k_format": [usable_format({c: v - base for c, v in x.items()}, base, LOSS_MARGIN) for x in fmts]}


@torch.no_grad()
def key_cache(model: nn.Module, precision: str, shape_BT, D: int, n_layers: int, errors: Callable[[], list[dict]],
              loss: Callable[[int, list[int] | None], float], per_layer: bool = False) -> dict:
    """The one key-cache driver, of this project's model and of any adapter's (hf/kv.py): kv_section of each layer's
    errors (errors(): layer_errors' records, from one hooked forward) and of the losses with every layer's keys
    quantized (loss(bits, layers): the mean loss with the keys of `layers`, None: all, quantized to `bits`), measured
    on sequences [B, T] in eval mode and `precision`, the module's mode and the RNG states restored. With per_layer,
    each layer's usable bits too (layer_bits: that layer's keys alone quantized, len(KV_BITS) forwards a layer)."""
    plain = [c for c in format_cases(D) if "+keep" not in c]
    with measuring(model, next(model.parameters()).device, precision):
        layers = errors()
        losses = {b: loss(b, None) for b in (*LOSS_BITS, *format_cases(D))}
        each = [{b: loss(b, [i]) for b in (*KV_BITS, *plain)} for i in range(n_layers)] if per_layer else None
    section = kv_section(shape_BT, precision, D, layers, losses)
    return section if each is None else {**section, "layer_bits": layer_bits(each, losses[16])}


def kv_cache_record(model: nn.Module, ids_BT: torch.Tensor, targets_BT: torch.Tensor, precision: str = "fp32",
                    rows: int = KV_ROWS, per_layer: bool = False) -> dict:
    """key_cache of `model` on the first `rows` sequences of (ids, targets): the errors from OwnAdapter.capture, the
    losses from plain forwards whose keys key_bits.quantized_keys quantizes."""
    model = unwrap(model)
    device = next(model.parameters()).device
    ids, targets = ids_BT[:rows].to(device), targets_BT[:rows].to(device)
    adapter = OwnAdapter(model)

    def errors() -> list[dict]:
        sink = ErrorSink([model.rotary] * len(model.blocks), inverse=False)
        with adapter.capture(sink):
            model.hidden(ids)
        return sink.layers
    def loss(case, layers) -> float:  # bits: per_token before RoPE; a format: the cache after RoPE, as engines hold it
        site = "post_rope" if isinstance(case, str) else LOSS_SITE
        return quantized_loss(model, ids, targets, case, LOSS_SCHEME, site, layers)
    return key_cache(model, precision, ids.shape, model.cfg.d_head, len(model.blocks), errors, loss, per_layer)


class ErrorSink:
    """Each layer's layer_errors from an adapter's capture (the model's own attention computes the output), for both
    drivers: the keys before rotary as hooked (k_norm's, else the projection's; ropes: RoPE of [B, T, H, D] vectors,
    this project's Rotary) or, with `inverse`, the attention's keys rotated back (ropes: hf.rotary.AdapterRope, for a
    Hugging Face model whose keys before rotary the hooks need not show as it rotates them)."""

    projections = False  # the keys before rotary: k_norm's where the layer has one

    def __init__(self, ropes: list, inverse: bool):
        self.ropes, self.inverse, self.pre, self.layers = ropes, inverse, {}, []

    def on_state(self, *args) -> None:  # the errors read the keys and the attention call alone
        pass

    def on_keys(self, i: int, site: str, k_HBTD: torch.Tensor) -> None:
        self.pre[i] = k_HBTD  # projections=False: the one site before RoPE (k_norm's, else the projection)

    def on_attention(self, i, q, k, v, scaling, window, softcap):
        if window and window < q.shape[2]:
            raise KVError(f"layer {i} attends over a sliding window of {window} tokens, shorter than the batch's "
                          f"{q.shape[2]}: the key-cache errors are measured on full causal attention. Fix: windows "
                          f"of at most {window} tokens (--seq_len)")
        rope, k_pre = self.ropes[i], self.pre.pop(i, None)
        q, k, v = (x.transpose(0, 1).float() for x in (q, k, v))                  # [B, H, T, D] -> [H, B, T, D]
        t = {"q_rope": q, "k_rope": k, "v": v, "k_norm": rope.inverse(k) if self.inverse else k_pre}
        with torch.autocast(q.device.type, enabled=False):
            self.layers.append({"layer": i, **layer_errors(t, rope.on_heads_last if self.inverse else rope, softcap,
                                                           scaling)})
        return None


def kv_section(shape_BT, precision: str, D: int, layers: list[dict], losses: dict[int, float]) -> dict:
    """results.json's kv_cache section (KV_CACHE) of layer_errors' records and the losses by bits (16: the
    reference) of sequences [B, T] measured in `precision`."""
    base = losses[16]
    fmts = {c: v for c, v in losses.items() if isinstance(c, str)}
    losses = {b: v for b, v in losses.items() if not isinstance(b, str)}
    formats = {"site": "post_rope", "cases": list(fmts), "bytes": {c: bytes_per_value(split_case(c)[0]) for c in fmts},
               "by_format": fmts, "change": {c: v - base for c, v in fmts.items()},
               "usable_k_format": usable_format({c: v - base for c, v in fmts.items()}, base, LOSS_MARGIN)}
    return {"sequences": int(shape_BT[0]), "seq_len": int(shape_BT[1]), "precision": precision,
            "bits": list(KV_BITS), "schemes": list(schemes_for(D)), "ranks": [D // n for n in RANK_DIVISORS],
            "loss": {"scheme": LOSS_SCHEME, "site": LOSS_SITE, "by_bits": {str(b): v for b, v in losses.items()},
                     "change": {str(b): v - base for b, v in losses.items()}},
            "usable_k_bits": usable_k_bits({b: losses[b] for b in KV_BITS}, base, LOSS_MARGIN),
            "loss_margin": LOSS_MARGIN, **({"formats": formats} if fmts else {}),
            "layers": sorted(layers, key=lambda r: r["layer"])}
