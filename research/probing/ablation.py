"""Gain ablations: the trained learned-gain model evaluated with its q_norm / k_norm gains replaced.

    out = gain_ablation(model, probe, val_batches, learned=learned_entry(final_record, loss))

For each of MODES (learned; k_ones, q_ones, qk_ones: gains replaced by 1; k_mean, q_mean, qk_mean: by each layer's
own mean) the validation loss and the keys' PR, read by a light probe (KeyProbe.measure_pr); the trained gains are
put back exactly afterwards. It says how much the TRAINED model relies on its gains, not whether learning a gain
matters for training (the learned- vs frozen-gain comparison). docs/probing.md, "Gains, layer means and gain
ablations", says more.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from research.probing.probe import KeyProbe, learned_gain, unwrap
from research.results.vocabulary import ABLATION_MODES, PR

MODES = ABLATION_MODES


@torch.no_grad()
def validation_loss(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], precision: str) -> float:
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        return sum(model(x.to(device), y.to(device)).item() for x, y in batches) / len(batches)


@torch.no_grad()
def gain_ablation(model: nn.Module, probe: KeyProbe, batches: list[tuple[torch.Tensor, torch.Tensor]],
                  learned: dict | None = None) -> dict:
    """{mode: {"val_loss", "mean_pr", "layer_pr"}} for MODES; {} when no layer has learned q/k gains. `learned`:
    the learned mode's entry where the caller measured the trained model already (the final probe's mean_pr and
    layer PRs, and its loss of the probe.covers(batches) rows, or None where they are not covered): one probe fewer."""
    model = unwrap(model)
    gains = {"q": [learned_gain(b.attn.q_norm) for b in model.blocks],
             "k": [learned_gain(b.attn.k_norm) for b in model.blocks]}
    gains = {side: [g for g in gs if g is not None] for side, gs in gains.items()}
    if not gains["q"] or not gains["k"]:
        return {}
    trained = {side: [g.detach().clone() for g in gs] for side, gs in gains.items()}

    def restore():
        for side in gains:
            for g, t in zip(gains[side], trained[side]):
                g.copy_(t)
    shared = probe.covers(batches)  # the validation batches are the probe's first sequences: one forward for both
    was_training = model.training
    model.eval()
    out = {}
    try:
        for mode in MODES:
            restore()
            if mode == "learned" and learned is not None:
                loss = learned["val_loss"] if shared else validation_loss(model, batches, probe.precision)
                out[mode] = {"val_loss": loss, "mean_pr": learned["mean_pr"], "layer_pr": list(learned["layer_pr"])}
                continue
            if mode != "learned":
                sides, how = mode.split("_")
                for side in sides:
                    for g, t in zip(gains[side], trained[side]):
                        g.copy_(torch.ones_like(t) if how == "ones" else t.mean().expand_as(t))
            layer_pr, mean_pr, loss = probe.measure_pr(model, shared)
            out[mode] = {"val_loss": loss if shared else validation_loss(model, batches, probe.precision),
                         "mean_pr": mean_pr, "layer_pr": layer_pr}
    finally:
        restore()
        model.train(was_training)
    return out


def learned_entry(record: dict, loss: float | None) -> dict:
    """gain_ablation's `learned`: the final probe's record (KeyProbe.measure) of the trained model and its loss."""
    return {"val_loss": loss, "mean_pr": record["mean_pr"],
            "layer_pr": [layer["means"][PR] for layer in record["layers"]]}
