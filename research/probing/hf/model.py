"""The Hugging Face model as the key probe reads it: the model behind its wrappers, its family's adapter, and the
model section of results.json's config; ProbeError, the error of every part of the probe of Hugging Face models."""
from __future__ import annotations

import torch.nn as nn

from research.access.adapters import ADAPTERS
from research.probing.probe import unwrap
from utils.errors import UserError


class ProbeError(UserError, ValueError):
    """A model, a file or a training setup the probe cannot work with; the message says why and what to do."""



def base_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model behind DDP, torch.compile and PEFT wrappers."""
    model = unwrap(model)
    get_base = getattr(model, "get_base_model", None)  # PEFT
    return unwrap(get_base()) if callable(get_base) else model


def adapter_for(model: nn.Module):
    """The inspection adapter of `model`'s family, keeping the model's attention implementation; ProbeError for a
    family no adapter reads."""
    model = base_model(model)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    cls = ADAPTERS.get(model_type)
    if cls is None:
        raise ProbeError(f"the key probe cannot read a model of type {model_type!r} ({type(model).__name__}): it "
                         f"reads {', '.join(sorted(ADAPTERS))}. Another family needs an adapter class in "
                         f"research/access/adapters/ (a module of its own) that says where it keeps its keys")
    return cls(model, attn_implementation=None)


def qk_norm_kind(adapter) -> str:
    """'learned' (a k_norm whose gain trains), 'frozen' (a k_norm whose gain does not) or 'none' (no k_norm): the
    project's names of the three conditions, which results.json records per run."""
    k_norm = adapter.qk_norms(0)[1]
    weight = getattr(k_norm, "weight", None)
    if k_norm is None or weight is None:
        return "none"
    return "learned" if weight.requires_grad else "frozen"


def model_config(adapter) -> dict:
    """The model section of results.json's config for a Hugging Face model."""
    return {"model_type": adapter.model_type, "family": adapter.family, "n_layers": adapter.n_layers,
            "n_heads": adapter.n_heads, "n_kv_heads": adapter.n_kv_heads, "d_model": adapter.d_model,
            "d_head": adapter.head_dim, "qk_norm": qk_norm_kind(adapter)}
