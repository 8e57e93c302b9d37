"""Split a MinimalLLM's parameters between Muon and AdamW.

Muon: every trainable 2-D parameter but the token embedding `embed.weight` (tied to the LM head) and the norm gains.
AdamW: the embedding and every norm gain (1-D, or a q/k gain per head; weight decay only with cfg.wd_on_gains), in
separate param groups.
W_q and W_k go to cfg.qk_optimizer, in a group of their own ("muon_qk" or "qk", peak lr cfg.qk_lr_multiplier times
their optimizer's) unless they stay in Muon at multiplier 1; in AdamW they take the embedding's settings.
Parameters with requires_grad=False (frozen q/k norm gains) are in no optimizer. The recipe and its variants:
docs/training.md, "The write-ups' recipe, and where the defaults differ" and "Optimizer variants".
"""
from __future__ import annotations

import re

import torch
import torch.nn as nn

from configs.config import TrainConfig
from optimizers.muon import Muon

EMBED_NAME = "embed.weight"
QK_NAME = re.compile(r"blocks\.\d+\.attn\.w[qk]\.weight")  # W_q and W_k of every layer


def is_gain(name: str) -> bool:
    """A norm's gain, whatever its shape (a q/k norm's gain per head is [heads, D] or [heads, 1]: never Muon's)."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2].endswith("norm")


def is_qk(name: str) -> bool:
    """Whether the parameter called `name` (as model.named_parameters() spells it) is a W_q or a W_k."""
    return QK_NAME.fullmatch(name) is not None


def _summarize(named: list[tuple[str, torch.Tensor]]) -> dict:
    return {"tensors": len(named), "params": sum(p.numel() for _, p in named)}


def check_coverage(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
    """Assert every trainable parameter is in exactly one optimizer group and no frozen one is in any."""
    seen: dict[int, int] = {}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                seen[id(p)] = seen.get(id(p), 0) + 1
    names = {}
    for name, p in model.named_parameters():
        names[id(p)] = name
        n = seen.get(id(p), 0)
        if p.requires_grad:
            assert n == 1, (f"parameter {name!r} is in {n} optimizer param groups; "
                            f"every trainable parameter must be in exactly one")
        else:
            assert n == 0, f"frozen parameter {name!r} (requires_grad=False) is in an optimizer"
    unknown = set(seen) - set(names)
    assert not unknown, f"{len(unknown)} optimized tensor(s) are not parameters of the model"


# Muon's orthogonalization dtype per resolved training precision (utils.runtime.resolve_precision): bf16 runs
# orthogonalize in bf16 as the write-ups do; fp32 runs in fp32 on every host, so a test or a study that pins
# --precision fp32 computes the same thing on a CPU with native bf16 as on one without.
MUON_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_optimizers(model: nn.Module, cfg: TrainConfig, device_type: str = "cpu",
                     precision: str = "fp32") -> tuple[list[torch.optim.Optimizer], dict]:
    """[Muon, AdamW] over model's parameters, and a summary of the split (see format_split).
    precision: the run's resolved precision, "fp32" or "bf16" (never "auto"); it sets Muon's compute dtype.

    Param groups carry a "name" ("muon", "embed", "gains"; "muon_qk" or "qk" for W_q and W_k when
    cfg.qk_optimizer or cfg.qk_lr_multiplier moves them out of "muon") and "base_lr" (the peak LR that the
    trainer's schedule scales).
    """
    muon_p, embed_p, gain_p, qk_p, frozen = [], [], [], [], []
    own_qk = cfg.qk_optimizer != "muon" or cfg.qk_lr_multiplier != 1  # else W_q and W_k stay in the "muon" group
    for name, p in model.named_parameters():  # tied parameters are listed once
        if not p.requires_grad:
            frozen.append((name, p))
        elif name == EMBED_NAME:
            embed_p.append((name, p))
        elif own_qk and is_qk(name):
            qk_p.append((name, p))
        elif p.ndim <= 1 or is_gain(name):
            gain_p.append((name, p))
        elif p.ndim == 2:
            muon_p.append((name, p))
        else:
            raise ValueError(f"parameter {name!r} of shape {tuple(p.shape)}: no optimizer rule for "
                             f"{p.ndim}-D parameters (Muon takes 2-D, AdamW the embedding and 1-D)")

    qk_lr = cfg.qk_lr_multiplier * (cfg.muon_lr if cfg.qk_optimizer == "muon" else cfg.adamw_lr)
    qk_decay = cfg.muon_weight_decay if cfg.qk_optimizer == "muon" else cfg.adamw_weight_decay  # DESIGN.md: the
    qk_group = {"params": [p for _, p in qk_p], "lr": qk_lr, "weight_decay": qk_decay}  # embedding's AdamW settings
    optimizers: list[torch.optim.Optimizer] = []
    muon_groups = [{"params": [p for _, p in muon_p], "name": "muon"}] if muon_p else []
    if qk_p and cfg.qk_optimizer == "muon":
        muon_groups.append({**qk_group, "name": "muon_qk"})
    if muon_groups:
        optimizers.append(Muon(muon_groups, lr=cfg.muon_lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                               weight_decay=cfg.muon_weight_decay, orthogonalizer=cfg.orthogonalizer,
                               ortho_steps=cfg.ortho_steps, ortho_dtype=MUON_DTYPE[precision],
                               update_scale=cfg.muon_update_scale))
    adam_groups = []
    if embed_p:
        adam_groups.append({"params": [p for _, p in embed_p], "weight_decay": cfg.adamw_weight_decay,
                            "name": "embed"})
    if gain_p:
        adam_groups.append({"params": [p for _, p in gain_p], "name": "gains",
                            "weight_decay": cfg.adamw_weight_decay if cfg.wd_on_gains else 0.0})
    if qk_p and cfg.qk_optimizer == "adamw":
        adam_groups.append({**qk_group, "name": "qk"})
    if adam_groups:
        extra = {"fused": True} if device_type == "cuda" else {}
        optimizers.append(torch.optim.AdamW(adam_groups, lr=cfg.adamw_lr,
                                            betas=(cfg.adam_beta1, cfg.adam_beta2), eps=1e-8, **extra))
    for opt in optimizers:
        for group in opt.param_groups:
            group.setdefault("base_lr", group["lr"])

    check_coverage(model, optimizers)
    in_muon = cfg.qk_optimizer == "muon"
    summary = {"muon": _summarize(muon_p + (qk_p if in_muon else [])),
               "adamw": _summarize(embed_p + gain_p + ([] if in_muon else qk_p)), "frozen": _summarize(frozen)}
    return optimizers, summary


def format_split(summary: dict) -> str:
    """One line: tensors and parameters per optimizer, e.g. for the trainer's start-up log."""
    parts = [f"{key} {v['tensors']} tensors / {v['params']:,} params" for key, v in summary.items()]
    return "optimizer split: " + " | ".join(parts)
