"""checkpoint_keys.json (research/checkpoint_keys_study.py): the one check every read goes through. No torch.

    {"schema": "qk-keys/checkpoint-keys", "version": 1, "command": ..., "provenance": {...}, "wall_s": ...,
     "margin": 0.03,
     "model": {"model_type", "family", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_model", "vocab"},
     "text": {"source", "sha256", "description", "documents", "batches", "batch", "seq_len", "seed", "bos"},
     "checkpoints": [                                   # sorted by step
        {"label", "source", "step", "step_from", "sha256", "duplicate_of": null,
         ... the measured record: what research.results.pretrained.check_model reads of a model (dimensions,
         family, params, gguf, wall_s, batches [per text batch: loss, keys[site][metric] [L][Hkv],
         attn[metric] [L][Hq]], gains)},
        {"label", "source", "step", "step_from", "sha256", "duplicate_of": "<an earlier measured label>"}]}

A checkpoint whose weights hash equals an earlier one's carries duplicate_of and no measurement.
"""
from __future__ import annotations

import re
from pathlib import Path

from research.results.checks import ShapeError, check_provenance, check_scalar, found, is_integer, is_number, is_text
from research.results.pretrained import check_model, load_versioned

SCHEMA = "qk-keys/checkpoint-keys"
VERSION = 1
FILE = "checkpoint_keys.json"
_DIMS = ("n_layers", "n_heads", "n_kv_heads", "head_dim")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _check_text(text) -> None:
    if not isinstance(text, dict):
        raise ShapeError(f"text should be an object (where the windows came from), found {found(text)}")
    for k, ok, kind in (("source", is_text, "text"), ("sha256", is_text, "text"),
                        ("batches", lambda v: is_integer(v) and v > 0, "a positive integer"),
                        ("batch", lambda v: is_integer(v) and v > 0, "a positive integer"),
                        ("seq_len", lambda v: is_integer(v) and v > 0, "a positive integer"),
                        ("seed", is_integer, "an integer")):
        check_scalar(text.get(k), f"text.{k}", ok, kind, nullable=False)


def _check_entry(i: int, c, labels: dict, model: dict, n_batches: int) -> None:
    where = f"checkpoints[{i}]"
    if not isinstance(c, dict):
        raise ShapeError(f"{where} should be an object, found {found(c)}")
    check_scalar(c.get("label"), f"{where}.label", lambda v: is_text(v) and v, "a non-empty text", nullable=False)
    label = c["label"]
    if label in labels:
        raise ShapeError(f"{where}.label {label!r} names checkpoints[{labels[label][0]}] too: labels are unique")
    check_scalar(c.get("source"), f"{where}.source", is_text, "text", nullable=False)
    check_scalar(c.get("step"), f"{where}.step", lambda v: is_integer(v) and v >= 0, "a step (an integer >= 0)",
                 nullable=False)
    check_scalar(c.get("step_from"), f"{where}.step_from", is_text, "text")
    check_scalar(c.get("sha256"), f"{where}.sha256", lambda v: is_text(v) and _SHA256.match(v),
                 "64 hex digits (the weights' sha256)", nullable=False)
    dup = c.get("duplicate_of")
    if dup is not None:
        first = labels.get(dup)
        if first is None or first[1] is not None:
            raise ShapeError(f"{where}.duplicate_of {found(dup)} should name an earlier measured checkpoint")
        if "batches" in c:
            raise ShapeError(f"{where} is a duplicate of {dup!r} and should hold no measurement (batches)")
        labels[label] = (i, dup)
        return
    labels[label] = (i, None)
    try:
        check_model(label, c)
    except ShapeError as e:  # check_model names fields as models.<name>...; here they live at checkpoints[i]
        raise ShapeError(str(e).replace(f"models.{label}", where)) from e
    for k in _DIMS:
        if c[k] != model[k]:
            raise ShapeError(f"{where}.{k} is {c[k]}, model.{k} is {model[k]}: one model's checkpoints share one "
                             f"architecture")
    if len(c["batches"]) != n_batches:
        raise ShapeError(f"{where}.batches holds {len(c['batches'])} batches, text.batches says {n_batches}: every "
                         f"checkpoint reads the same batches")


def check_trajectory(res: dict) -> None:
    """Raise ShapeError on the first field the analysis or the report could not use."""
    check_scalar(res.get("command"), "command", is_text, "text")
    check_scalar(res.get("wall_s"), "wall_s", is_number, "a number of seconds")
    check_scalar(res.get("margin"), "margin", lambda v: is_number(v) and 0 < v < 1, "a share between 0 and 1")
    check_provenance(res.get("provenance"))
    model = res.get("model")
    if not isinstance(model, dict) or not all(is_integer(model.get(k)) and model[k] > 0 for k in _DIMS):
        raise ShapeError(f"model should record {', '.join(_DIMS)} as positive integers")
    check_scalar(model.get("model_type"), "model.model_type", is_text, "text")
    _check_text(res.get("text"))
    ckpts = res.get("checkpoints")
    if not isinstance(ckpts, list) or not ckpts:
        raise ShapeError("checkpoints should be a non-empty list")
    labels: dict[str, tuple[int, str | None]] = {}
    for i, c in enumerate(ckpts):
        _check_entry(i, c, labels, model, res["text"]["batches"])
    steps = [c["step"] for c in ckpts]
    if steps != sorted(steps):
        raise ShapeError(f"checkpoints should be sorted by step, found steps {steps}")
    if all(c.get("duplicate_of") is not None for c in ckpts):
        raise ShapeError("checkpoints should hold at least one measured checkpoint")
    measured = [c for c in ckpts if c.get("duplicate_of") is None]
    sites = {tuple(sorted(c["batches"][0]["keys"])) for c in measured}
    if len(sites) > 1:
        raise ShapeError(f"the measured checkpoints hold different key sites ({sorted(sites)}): one architecture "
                         f"has one set of sites")


def load_trajectory(path: str | Path) -> dict:
    """The study file, checked; ResultsError names the file, the field and the fix."""
    return load_versioned(path, schema=SCHEMA, version=VERSION, name=FILE, check=check_trajectory,
                          fix="run research/checkpoint_keys_study.py again into this folder with the same "
                              "--checkpoints (converted GGUF files are cached)")
