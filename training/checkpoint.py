"""Checkpoints in numbered step folders, written atomically, never unpickled.

    checkpoints/step-000120/
        model.safetensors   weights (safetensors: no code runs when loading)
        optim.pt            optimizer state dicts + torch RNG state (tensors and numbers only,
                            read back with torch.load(weights_only=True))
        state.json          step, tokens, data-loader position, config

A folder is first written under a hidden temporary name and renamed when complete
(utils.io.atomic_dir), so a crash mid-write never leaves a folder that looks like a
checkpoint.
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from utils.io import atomic_dir

_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass
class Checkpoint:
    path: Path
    step: int
    state: dict  # contents of state.json


def _model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # The LM head is tied to the embedding, so each tensor appears once in the state dict.
    return {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}


def save_checkpoint(root: Path, step: int, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer],
                    state: dict, keep_last: int) -> Path:
    final = root / f"step-{step:06d}"
    if final.exists():  # the same step saved again (a finished run resumed): replace it
        shutil.rmtree(final)
    with atomic_dir(final) as tmp:
        save_file(_model_state(model), str(tmp / "model.safetensors"))
        torch.save({"optimizers": [o.state_dict() for o in optimizers], "torch_rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
                   tmp / "optim.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Checkpoint]:
    """Complete checkpoints under root, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / "state.json").is_file() and (p / "model.safetensors").is_file() and (p / "optim.pt").is_file():
            found.append(Checkpoint(p, int(m.group(1)), {}))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(root: Path) -> Checkpoint | None:
    ckpts = list_checkpoints(root)
    if not ckpts:
        return None
    c = ckpts[-1]
    try:
        c.state = json.loads((c.path / "state.json").read_text())
    except json.JSONDecodeError as e:
        raise RuntimeError(f"checkpoint {c.path} has a corrupted state.json ({e}); delete that folder "
                           f"to resume from the one before it") from e
    return c


def load_checkpoint(ckpt: Checkpoint, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
    """Restore weights, optimizer states and the torch RNG in place."""
    weights = load_file(str(ckpt.path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {ckpt.path} does not match the model: missing {missing}, "
                           f"unexpected {unexpected}; was it written with another config?")
    blob = torch.load(ckpt.path / "optim.pt", weights_only=True, map_location="cpu")
    if len(blob["optimizers"]) != len(optimizers):
        raise RuntimeError(f"checkpoint {ckpt.path} holds {len(blob['optimizers'])} optimizers, "
                           f"the run has {len(optimizers)}")
    for opt, sd in zip(optimizers, blob["optimizers"]):
        opt.load_state_dict(sd)
    torch.set_rng_state(blob["torch_rng"])
    if blob["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(blob["cuda_rng"])


def load_model_weights(path: Path, model: torch.nn.Module) -> None:
    """Load only the weights of a checkpoint folder (for inspection and probing)."""
    model.load_state_dict(load_file(str(Path(path) / "model.safetensors")))
