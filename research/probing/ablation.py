"""The causal test of the learned k_norm gain: the trained model with its gains replaced.

For each mode the gain of every layer's k_norm is set, the validation loss is measured on fixed
batches and the keys are probed; the trained gains are put back exactly afterwards.

    learned   the gains as trained
    ones      every gain replaced by 1 (normalization only, as the frozen-gain condition has)
    mean      every layer's gain replaced by its own mean (a scalar: the gain's scale without its shape)

If "mean" loses little against "learned" the gain's shape does not matter for the loss, whatever it
does to the keys' PR.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from research.probing.probe import KeyProbe, unwrap
from research.results.vocabulary import PR

MODES = ("learned", "ones", "mean")


@torch.no_grad()
def validation_loss(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], precision: str) -> float:
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        return sum(model(x.to(device), y.to(device)).item() for x, y in batches) / len(batches)


@torch.no_grad()
def gain_ablation(model: nn.Module, probe: KeyProbe, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """{mode: {"val_loss", "mean_pr", "layer_pr"}} for MODES; {} when no layer has a learned k_norm gain."""
    model = unwrap(model)
    gains = [b.attn.k_norm.weight for b in model.blocks if getattr(b.attn.k_norm, "weight", None) is not None
             and b.attn.k_norm.weight.requires_grad]
    if not gains:
        return {}
    trained = [g.detach().clone() for g in gains]
    was_training = model.training
    model.eval()
    out = {}
    try:
        for mode in MODES:
            for g, t in zip(gains, trained):
                g.copy_(t if mode == "learned" else torch.ones_like(t) if mode == "ones" else t.mean().expand_as(t))
            rec = probe(model)
            out[mode] = {"val_loss": validation_loss(model, batches, probe.precision), "mean_pr": rec["mean_pr"],
                         "layer_pr": [layer["means"][PR] for layer in rec["layers"]]}
    finally:
        for g, t in zip(gains, trained):
            g.copy_(t)
        model.train(was_training)
    return out
