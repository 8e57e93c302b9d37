"""Checkpoints in numbered step folders, written atomically, never unpickled.

    checkpoints/step-000120/
        model.safetensors   weights (safetensors: no code runs when loading)
        optim.pt            optimizer state dicts + torch RNG state (tensors and numbers only, weights_only=True)
        state.json          step, tokens, loader position, config, callbacks' states, data identity (STATE)

A folder is written under a temporary name and renamed when complete (utils.io.atomic_dir), an old one renamed
before it is removed (`remove_orphans` clears what a killed process left of both), and `load_newest` falls back to
the one before a checkpoint that cannot be read: docs/training.md, "Interrupted runs and resumes".
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from utils.errors import UserError, is_disk_full
from utils.file_specs import CHECKPOINT_STATE, STATE_FILE
from utils.formats import check
from utils.io import atomic_dir, remove_matching, temp_dir_pattern
from utils.testhook import hook

_STEP_DIR = re.compile(r"^step-(\d+)$")
FILES = ("model.safetensors", "optim.pt", STATE_FILE)
_ORPHANS = (temp_dir_pattern(r"step-\d+"), re.compile(r"^\.pruning-step-\d+-[A-Za-z0-9_]+$"))


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or read; the message names it and the fix."""

    def __init__(self, message: str, disk_full: bool = False):
        super().__init__(message)
        self.disk_full = disk_full


@dataclass
class Checkpoint:
    path: Path
    step: int
    state: dict  # contents of state.json

    def __post_init__(self) -> None:
        self.path = Path(self.path)  # given as a str too


def _model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # The LM head is tied to the embedding, so each tensor appears once in the state dict.
    return {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}


def _tensor_bytes(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_tensor_bytes(v) for v in tree)
    return 0


def _write_failure(final: Path, e: Exception, weights: dict, optim: list[dict]) -> CheckpointError:
    """Name why a checkpoint could not be written; a full disk is told as such even where the library's
    error does not say so (torch.save reports it as an 'unexpected pos')."""
    need = _tensor_bytes(weights) + _tensor_bytes([sd["state"] for sd in optim])
    try:
        free = shutil.disk_usage(final.parent).free
    except OSError:
        free = None
    if is_disk_full(e) or (free is not None and free < need):
        free_text = f"{free / 1e6:.1f} MB free" if free is not None else "no room"
        return CheckpointError(f"could not write checkpoint {final}: the disk is full ({free_text}; a checkpoint "
                               f"needs about {need / 1e6:.1f} MB)", disk_full=True)
    return CheckpointError(f"could not write checkpoint {final} ({type(e).__name__}: {e})")


def _set_for_removal(path: Path) -> Path:
    """Rename a checkpoint folder out of the step-N namespace (atomic), so it is never half-seen."""
    target = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".pruning-{path.name}-"))
    os.rename(path, target)  # replaces the empty folder mkdtemp made
    return target


def save_checkpoint(root: str | Path, step: int, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer],
                    state: dict, keep_last: int, tensors: tuple[dict, list[dict]] | None = None) -> Path:
    """Write step-N under root and prune to keep_last. `tensors`: the model's and the optimizers' state dicts
    when already gathered (FSDP: training/sharding.py), else taken from model and optimizers."""
    root = Path(root)
    weights, optim = tensors or (_model_state(model), [o.state_dict() for o in optimizers])
    final = root / f"step-{step:06d}"
    old = _set_for_removal(final) if final.exists() else None  # the same step saved again: replaced
    try:
        with atomic_dir(final) as tmp:
            save_file(weights, str(tmp / "model.safetensors"))
            hook("checkpoint_write")
            with open(tmp / "optim.pt", "wb") as f:  # closed even when the write fails (its space is freed)
                torch.save({"optimizers": optim, "torch_rng": torch.get_rng_state(),
                            "cuda_rng": torch.cuda.get_rng_state() if torch.cuda.is_available() else []}, f)
            (tmp / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=2))
    except Exception as e:  # noqa: BLE001 - safetensors reports a full disk as SafetensorError, torch as RuntimeError
        if old is not None:
            os.rename(old, final)  # put the earlier copy back
        raise _write_failure(final, e, weights, optim) from e
    for ckpt in list_checkpoints(root)[:-keep_last]:
        gone = _set_for_removal(ckpt.path)
        hook("prune")
        shutil.rmtree(gone, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def step_dirs(root: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of the step-N folders under root, complete or not, by step. Every function here that takes
    a root takes a str or a Path."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def _complete(path: Path) -> bool:
    return all((path / f).is_file() for f in FILES)


def list_checkpoints(root: str | Path) -> list[Checkpoint]:
    """Complete checkpoints under root (all three files present), oldest first."""
    return [Checkpoint(p, step, {}) for step, p in step_dirs(root) if _complete(p)]


def latest_checkpoint(root: str | Path) -> Checkpoint | None:
    """The newest complete checkpoint, its state.json read where readable ({} otherwise)."""
    ckpts = list_checkpoints(root)
    if not ckpts:
        return None
    c = ckpts[-1]
    c.state = read_state(c)
    return c


def read_state(c: Checkpoint) -> dict:
    """A checkpoint's state.json, or {} where it does not read."""
    try:
        return json.loads((c.path / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def remove_orphans(root: str | Path) -> list[Path]:
    """Remove what killed processes left under root: temporary checkpoint folders (.tmp-step-N-*),
    folders set for removal (.pruning-step-N-*) and incomplete step-N folders older than the
    newest complete checkpoint (removals cut short by a kill before pruning was atomic)."""
    root = Path(root)
    removed = [p for pattern in _ORPHANS for p in remove_matching(root, pattern)]
    complete = list_checkpoints(root)
    newest = complete[-1].step if complete else -1
    for step, path in step_dirs(root):
        if step < newest and not _complete(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def set_aside(ckpt: Checkpoint) -> Path:
    """Rename an unreadable checkpoint to step-N.unreadable (kept for inspection, never loaded again)."""
    target = ckpt.path.with_name(f"{ckpt.path.name}.unreadable")
    n = 1
    while target.exists():
        target, n = ckpt.path.with_name(f"{ckpt.path.name}.unreadable-{n}"), n + 1
    os.rename(ckpt.path, target)
    return target


def _read(path: Path, what: str, reader: Callable):
    try:
        return reader(path / what)
    except Exception as e:  # noqa: BLE001 - every way a damaged file fails to parse means "unreadable"
        raise CheckpointError(f"{what} cannot be read ({type(e).__name__}: {str(e)[:200]})") from e


STATE = CHECKPOINT_STATE  # state.json declared (utils.file_specs, published as docs/schema/state.schema.json)


def check_state(state) -> dict:
    """A state.json's contents checked against STATE (FormatError, a ValueError, names the field that does not fit);
    ValueError "not a checkpoint state" for a file without step and loader."""
    if not isinstance(state, dict) or "step" not in state or "loader" not in state:
        raise ValueError("not a checkpoint state (expected step and loader)")
    check(STATE, state)
    return state


def _read_state(path: Path) -> dict:
    return check_state(json.loads(path.read_text()))


def read_checkpoint(ckpt: Checkpoint, with_optimizer: bool = True) -> tuple[dict, dict, dict | None]:
    """(state, weights, optimizer blob) read into memory; CheckpointError names the file that fails."""
    state = _read(ckpt.path, STATE_FILE, _read_state)
    weights = _read(ckpt.path, "model.safetensors", lambda p: load_file(str(p)))
    blob = None
    if with_optimizer:
        blob = _read(ckpt.path, "optim.pt", lambda p: torch.load(p, weights_only=True, map_location="cpu"))
        if not isinstance(blob, dict) or not {"optimizers", "torch_rng", "cuda_rng"} <= set(blob):
            raise CheckpointError("optim.pt cannot be read (not an optimizer state of this project)")
    return state, weights, blob


def load_weights(weights: dict, model: torch.nn.Module, where: Path) -> None:
    own = model.state_dict()
    bad = sorted(set(own) ^ set(weights)) + [k for k in own if k in weights and own[k].shape != weights[k].shape]
    if bad:
        raise CheckpointError(f"{where} does not match the model ({', '.join(bad[:5])}); was it written with "
                              f"another config?")
    model.load_state_dict(weights)


def apply_checkpoint(ckpt: Checkpoint, weights: dict, blob: dict, model: torch.nn.Module,
                     optimizers: list[torch.optim.Optimizer]) -> None:
    """Restore weights, optimizer states and the torch RNG in place."""
    load_weights(weights, model, ckpt.path)
    if len(blob["optimizers"]) != len(optimizers):
        raise CheckpointError(f"{ckpt.path} holds {len(blob['optimizers'])} optimizers, the run has {len(optimizers)}")
    try:
        for opt, sd in zip(optimizers, blob["optimizers"]):
            opt.load_state_dict(sd)
        torch.set_rng_state(blob["torch_rng"])
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"optim.pt does not fit this run's optimizers ({type(e).__name__}: {e})") from e
    cuda_rng = blob["cuda_rng"]  # this process's device (a list of every device's in older checkpoints)
    if isinstance(cuda_rng, list):
        cuda_rng = cuda_rng[0] if cuda_rng else None
    if cuda_rng is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda_rng)


def load_newest(root: str | Path, load: Callable[[Checkpoint], None]) -> tuple[Checkpoint | None, list[tuple]]:
    """Try `load` on the complete checkpoints, newest first, until one works.

    Returns (the checkpoint loaded or None, [(checkpoint, reason)] of those that failed, newest first).
    `load` raises CheckpointError for a checkpoint it cannot use."""
    failed = []
    for ckpt in reversed(list_checkpoints(root)):
        try:
            load(ckpt)
            return ckpt, failed
        except CheckpointError as e:
            failed.append((ckpt, str(e)))
    return None, failed


def load_model_weights(path: str | Path, model: torch.nn.Module) -> None:
    """Load only the weights of a checkpoint folder (for inspection and probing)."""
    path = Path(path)
    load_weights(_read(path, "model.safetensors", lambda p: load_file(str(p))), model, path)


def load_newest_weights(root: str | Path, model: torch.nn.Module) -> tuple[Checkpoint | None, list[tuple]]:
    """Load into `model` the weights of the newest checkpoint under `root` that reads back (export, inspection);
    returns it (None where none does) and [(checkpoint, reason)] of the newer ones that failed."""
    return load_newest(root, lambda c: load_model_weights(c.path, model))


def restore_callback(callback, state: dict) -> None:
    """Hand a callback (training.callbacks) its state saved in `state` (a checkpoint's state.json); CheckpointError
    if it cannot use it."""
    saved = state.get("callbacks", {}).get(callback.name)
    if saved is None:
        return
    try:
        callback.load_state_dict(saved)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"state.json holds a state of callback {callback.name!r} it cannot use "
                              f"({type(e).__name__}: {str(e)[:200]})") from e


def after_resume(callback) -> None:
    """A callback's own check of its files once its checkpoint is the one (the probe's results.json): its errors
    stop the resume as they are."""
    check = getattr(callback, "after_resume", None)
    if check is not None:
        check()
