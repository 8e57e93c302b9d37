"""Gain ablations: the trained learned-gain model evaluated with its q_norm / k_norm gains replaced.

For each mode the named gains of every layer are set, the validation loss is measured on fixed
batches and the keys' PR is read by a light probe (KeyProbe.measure_pr: the full probe's mean_pr and layer PRs, bit
for bit, from a forward that reads k_norm alone; the loss from the same forward where the batches are the probe's
first sequences, KeyProbe.covers); the trained gains are put back exactly afterwards. The learned mode is the
trained model itself: its entry can be taken from the final probe (`learned`), which measured that model already.

    learned    the gains as trained
    k_ones     every k_norm gain replaced by 1
    q_ones     every q_norm gain replaced by 1
    qk_ones    both replaced by 1: the frozen-gain condition's forward pass, on the trained weights
    k_mean     every k_norm gain replaced by its own mean (a scalar per layer: its scale without its shape)
    q_mean     the same for q_norm
    qk_mean    the same for both

What this measures: how much the TRAINED model relies on the gains it learned. It does not say
whether learning a gain matters for training; that is the comparison of the learned-gain and the
frozen-gain conditions (A vs B), whose other weights adapted to their gains. If "k_mean" loses little
against "learned", the k gain's shape does not matter to the trained model's loss.
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
