"""What a model's config declares about its attention, layer by layer, read from the config alone (never from the
modules that run): the q/k norms, RoPE (θ, rotated dims, pairing, each pair's frequency as the config computes
it), the logit scale and soft-cap. The audit compares what runs against this (docs/audit.md, "What is declared").

    d = declared(adapter, i)      # Declared(norms, eps, rope, scale, softcap)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rope:
    """A layer's declared RoPE: pair j turns dims (first[j], second[j]) by position x frequency[j] (0: not at all);
    theta and denominator where the frequencies are one ladder theta^(-2j / denominator) (None: another rope type,
    compared by its frequencies alone); pairing: its name among research.audit.rope.pairings'."""

    pairing: str
    frequency: torch.Tensor
    theta: float | None
    denominator: int | None
    rotated_dims: int
    kind: str = "default"


@dataclass(frozen=True)
class Declared:
    norms: tuple[bool, bool]          # a q norm, a k norm
    rope: Rope | None                 # None: no RoPE (GPT-2's learned positions)
    scale: float
    softcap: float | None
    v_norm: bool = False              # the values pass an RMS norm without gain (Gemma 4)
    k_eq_v: bool = False              # the values are the key projection (Gemma 4's attention_k_eq_v)
    kv_from: int | None = None        # the layer whose keys and values this one attends with (KV sharing)


def ladder(theta: float, pairs: int, denominator: int, turning: int | None = None) -> torch.Tensor:
    """theta^(-2j / denominator) for j < `turning` (default: every pair), 0 for the pairs after it, float64."""
    j = torch.arange(pairs, dtype=torch.float64)
    f = theta ** (-2 * j / denominator)
    if turning is not None:
        f[turning:] = 0
    return f


def _own(adapter, i: int) -> Declared:
    from models.layers import rotated_pairs  # this project's model: its config fields, as ModelConfig states them
    c = adapter.model.cfg
    D = c.d_head
    n = rotated_pairs(D, c.rope_fraction)
    rope = Rope("half", ladder(c.rope_theta, D // 2, D, n), c.rope_theta, D, 2 * n)
    norm = c.qk_norm != "none"
    return Declared((norm, norm), rope, c.logit_scale, c.attn_softcap or None)  # attn_scale x qk_mult


def _rope_parameters(config, i: int) -> dict:
    """The layer's rope parameters: transformers 5's rope_parameters (per layer type where keyed by them), else the
    older top-level rope_theta / rope_scaling / partial_rotary_factor."""
    params = getattr(config, "rope_parameters", None) or {}
    kinds = getattr(config, "layer_types", None)
    if kinds and kinds[i] in params:
        params = params[kinds[i]]
    out = dict(params)
    if "rope_theta" not in out and getattr(config, "rope_theta", None) is not None:
        out["rope_theta"] = config.rope_theta
    scaling = getattr(config, "rope_scaling", None)
    if "rope_type" not in out and isinstance(scaling, dict):
        out.update(scaling, rope_type=scaling.get("rope_type", scaling.get("type", "default")))
    if "partial_rotary_factor" not in out:
        out["partial_rotary_factor"] = getattr(config, "partial_rotary_factor", None) or getattr(
            config, "rotary_pct", None) or 1.0
    return out


def _hf_rope(adapter, i: int) -> Rope | None:
    config = adapter.model.config
    if not adapter.rope_pairing or not bool((getattr(config, "no_rope_layers", None) or [1] * (i + 1))[i]):
        return None  # GPT-2's learned positions; SmolLM3's NoPE layers (no_rope_layers[i] = 0)
    config, D = adapter.model.config, adapter.head_dim_of(i)
    p = _rope_parameters(config, i)
    kind = p.get("rope_type", "default")
    if kind == "proportional" and float(p.get("factor", 1.0)) == 1.0:
        # Gemma 4's full layers: rotate_half over the whole head, theta^(-2j / head_dim) for the first
        # partial_rotary_factor of the pairs, the rest at frequency 0 (transformers' _compute_proportional_...)
        theta, n = float(p["rope_theta"]), int(float(p["partial_rotary_factor"]) * D // 2)
        return Rope("half", ladder(theta, D // 2, D, n), theta, D, 2 * n, kind)
    R = int(D * float(p["partial_rotary_factor"])) if kind != "proportional" else D
    pairing = "half" if R == D else f"half_{R}"
    if kind == "default":
        theta = float(p["rope_theta"])
        return Rope(pairing, ladder(theta, R // 2, R), theta, R, R)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    kinds = getattr(config, "layer_types", None)
    views = getattr(config, "per_layer_config", None)  # Gemma 4: the layer type's own head size
    inv_freq, _ = ROPE_INIT_FUNCTIONS[kind](config if views is None else views[i], torch.device("cpu"),
                                            layer_type=kinds[i] if kinds else None)
    return Rope(pairing, inv_freq.double(), None, None, int(2 * (inv_freq > 0).sum()), kind)


def _hf_scale(adapter, i: int) -> float:
    config, D = adapter.model.config, adapter.head_dim_of(i)
    if adapter.family == "gemma4":
        return 1.0  # Gemma 4: its q and k norms take the place of 1/sqrt(d) (the modeling file's scaling = 1.0)
    if getattr(config, "query_pre_attn_scalar", None):
        return float(config.query_pre_attn_scalar) ** -0.5
    if adapter.family == "gpt2":
        scale = D ** -0.5 if getattr(config, "scale_attn_weights", True) else 1.0
        return scale / (i + 1) if getattr(config, "scale_attn_by_inverse_layer_idx", False) else scale
    return D ** -0.5


def declared(adapter, i: int) -> Declared:
    """Layer i's declaration: this project's ModelConfig for its own model, the Hugging Face config (and the
    family's layout: which families have q/k norms) for the others."""
    if adapter.family == "minimal_llm":
        return _own(adapter, i)
    a, config = adapter.attn(i), adapter.model.config
    norms = tuple(hasattr(a, n) and not isinstance(getattr(a, n), torch.nn.Identity) for n in ("q_norm", "k_norm"))
    cap = getattr(config, "attn_logit_softcapping", None)
    source = adapter.kv_source(i) if hasattr(adapter, "kv_source") else i  # from config.kv_sharing_modes
    kinds = getattr(config, "layer_types", None) or []
    k_eq_v = bool(getattr(config, "attention_k_eq_v", False)) and kinds[i] != "sliding_attention"
    return Declared(norms, _hf_rope(adapter, i), _hf_scale(adapter, i), float(cap) if cap else None,
                    v_norm=adapter.family == "gemma4", k_eq_v=k_eq_v, kv_from=None if source == i else source)
