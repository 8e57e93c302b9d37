"""Several checkpoints of one model: the training step each was saved at, and a hash of its weights.

    step, where = read_step("runs/hf-step-200")                       # (200, "export.json")
    step, where = read_step("EleutherAI/pythia-70m", "step1000")      # (1000, "revision name step1000")
    digest = weights_sha256(model)                                     # equal digests: identical weights

The data of research/checkpoint_keys_study.py. A step is read, in this order, from export.json's step
(research/export_hf.py), from trainer_state.json's global_step (transformers' Trainer), from a folder named
checkpoint-N, or from a hub revision's name (the number after its last "step", else its last number); where
none of these says, the caller asks for --steps.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch

from research.access.adapters import InspectError
from utils.errors import shown
from utils.owners import EXPORT_INFO  # written into an export by research/export (run, checkpoint step, mapping)

TRAINER_STATE = "trainer_state.json"
RECORDED = (EXPORT_INFO, TRAINER_STATE)  # where a checkpoint records its own step (not guessed from a name)
_TRAINER_DIR = re.compile(r"^checkpoint-(\d+)$")


def _json_int(path: Path, field: str) -> int | None:
    """An integer field of a JSON file, None where the file is absent; InspectError where it is damaged."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text()).get(field)
    except (OSError, ValueError, AttributeError) as e:
        raise InspectError(f"{path} cannot be read as JSON with a {field} ({type(e).__name__}: {e}): restore it, "
                           f"or pass the steps with --steps") from e
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InspectError(f"{path}: {field} should be a step (a whole number >= 0), found {shown(value, 40)}: restore "
                           f"the file, or pass the steps with --steps")
    return value


def step_from_revision(revision: str) -> int | None:
    """The number after the last "step" in a revision's name, else its last number: step1000 -> 1000,
    stage1-step2000 -> 2000, OLMo's stage1-step11931-tokens50B -> 11931, global_500 -> 500, main -> None."""
    after_step = re.findall(r"step[-_]?(\d+)", revision, flags=re.IGNORECASE)
    numbers = after_step or re.findall(r"\d+", revision)
    return int(numbers[-1]) if numbers else None


def read_step(spec: str, revision: str | None = None) -> tuple[int, str] | None:
    """(step, where it was read) of a checkpoint given as a local path or a hub id at `revision`; None when
    nothing says (see the module doc for the order)."""
    if revision is not None:
        step = step_from_revision(revision)
        return None if step is None else (step, f"revision name {revision}")
    path = Path(spec).expanduser()
    if path.is_dir():
        for name, field in ((EXPORT_INFO, "step"), (TRAINER_STATE, "global_step")):
            step = _json_int(path / name, field)
            if step is not None:
                return step, name
        m = _TRAINER_DIR.match(path.resolve().name)
        if m:
            return int(m.group(1)), f"folder name {m.group(0)}"
    return None


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 over the state dict: each tensor's name (in sorted order), dtype, shape and raw bytes. Tied tensors
    count under each of their names; equal digests mean equal weights as loaded."""
    h = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
