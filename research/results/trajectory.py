"""checkpoint_keys.json (research/checkpoint_keys_study.py): the one check every read goes through. No torch.

    {"schema": "qk-keys/checkpoint-keys", "version": 1, "command", "provenance", "wall_s", "margin",
     "model": {"model_type", "family", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_model", "vocab"},
     "text": {"source", "sha256", "description", "documents", "batches", "batch", "seq_len", "seed", "bos"},
     "checkpoints": [{"label", "source", "step", "step_from", "sha256", "duplicate_of", ...}, ...]}  # by step

A measured checkpoint holds what research.results.pretrained.check_model reads of a model; a duplicate (weights equal
to an earlier one's) holds duplicate_of instead. A study across seeds adds "sink_threshold", and "seed" and "tokens"
to every checkpoint. The fields in words: docs/inspection.md, "Keys across saved checkpoints".
"""
from __future__ import annotations

import re
from pathlib import Path

from research.results.checks import PROVENANCE
from research.results.pretrained import check_model, load_versioned
from utils.errors import shown
from utils.formats import FormatError, Integer, ListOf, Number, Obj, Opt, Rule, Text, found
from utils.owners import CHECKPOINT_KEYS

SCHEMA = "qk-keys/checkpoint-keys"
VERSION = 1
FILE = CHECKPOINT_KEYS  # its name in the owner table (utils.owners)
_DIMS = ("n_layers", "n_heads", "n_kv_heads", "head_dim")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_POSITIVE = Integer("a positive integer", nullable=False, lo=1)


def _label_once(c: dict, where: str, ctx) -> None:
    labels = ctx.setdefault("labels", {})  # label -> (index, the label it duplicates or None)
    if c["label"] in labels:
        raise FormatError(f"{where}.label", problem=f" {shown(c['label'])} names checkpoints"
                                                    f"[{labels[c['label']][0]}] too: labels are unique")


def _measured_or_duplicate(c: dict, where: str, ctx) -> None:
    """A duplicate names an earlier measured checkpoint and holds no measurement; a measured one is a model record
    (research.results.pretrained.MODEL) of the file's architecture on the file's batches."""
    labels, dup = ctx["labels"], c.get("duplicate_of")
    i = len(labels)  # every earlier checkpoint left its label
    if dup is not None:
        first = labels.get(dup)
        if first is None or first[1] is not None:
            raise FormatError(f"{where}.duplicate_of", problem=f" {found(dup)} should name an earlier measured "
                                                               f"checkpoint")
        if "batches" in c:
            raise FormatError(where, problem=f" is a duplicate of {shown(dup)} and should hold no measurement "
                                             f"(batches)")
        labels[c["label"]] = (i, dup)
        return
    labels[c["label"]] = (i, None)
    check_model(c, where)
    model, n_batches = ctx["file"]["model"], ctx["file"]["text"]["batches"]
    for k in _DIMS:
        if c[k] != model[k]:
            raise FormatError(f"{where}.{k}", problem=f" is {c[k]}, model.{k} is {model[k]}: one model's checkpoints "
                                                      f"share one architecture")
    if len(c["batches"]) != n_batches:
        raise FormatError(f"{where}.batches", problem=f" holds {len(c['batches'])} batches, text.batches says "
                                                      f"{n_batches}: every checkpoint reads the same batches")


def across_seeds(res: dict) -> bool:
    """A study across seeds (its checkpoints carry seeds), not one model's."""
    return "sink_threshold" in res


def _seeds(res: dict) -> None:
    """Across seeds every checkpoint has a seed and a seed one checkpoint per step; one model's none has a seed."""
    ckpts, seeded = res["checkpoints"], across_seeds(res)
    for i, c in enumerate(ckpts):
        if ("seed" in c) != seeded:
            raise FormatError(f"checkpoints[{i}]", problem=(
                " should hold a seed (the file has a sink_threshold: a study across seeds)" if seeded else
                " holds a seed, and the file no sink_threshold: one model's checkpoints have no seed"))
    at = [(c["seed"], c["step"]) for c in ckpts] if seeded else []
    for i, key in enumerate(at):
        if key in at[:i]:
            raise FormatError(f"checkpoints[{i}]", problem=f" is a second checkpoint of seed {key[0]} at step "
                                                           f"{key[1]}: a seed has one checkpoint per step")


def _one_trajectory(res: dict, where: str, ctx) -> None:
    _seeds(res)
    ckpts = res["checkpoints"]
    steps = [c["step"] for c in ckpts]
    if steps != sorted(steps):
        raise FormatError("checkpoints", "sorted by step", f"steps {steps}")
    measured = [c for c in ckpts if c.get("duplicate_of") is None]
    if not measured:
        raise FormatError("checkpoints", problem=" should hold at least one measured checkpoint")
    sites = {tuple(sorted(c["batches"][0]["keys"])) for c in measured}
    if len(sites) > 1:
        raise FormatError("the measured checkpoints", problem=f" hold different key sites ({sorted(sites)}): one "
                                                              f"architecture has one set of sites")


_ENTRY = Obj({"label": Text("a non-empty text", nullable=False, nonempty=True), "(once)": Rule(_label_once),
              "source": Text(nullable=False), "step": Integer("a step (an integer >= 0)", nullable=False, lo=0),
              "step_from": Text(), "seed": Opt(Integer("a seed (an integer >= 0)", nullable=False, lo=0)),
              "tokens": Opt(Integer("a token count (an integer >= 0) or null", lo=0)),
              "sha256": Text("64 hex digits (the weights' sha256)", nullable=False, ok=_SHA256.match),
              "(measurement)": Rule(_measured_or_duplicate)}, show=found)
TRAJECTORY = Obj({
    "command": Text(), "wall_s": Number("a number of seconds"),
    "margin": Number("a share between 0 and 1", ok=lambda v: 0 < v < 1),
    "sink_threshold": Opt(Number("a share of attention between 0 and 1", nullable=False, ok=lambda v: 0 < v < 1)),
    "provenance": PROVENANCE,
    "model": Obj({**{k: _POSITIVE for k in _DIMS}, "model_type": Text()}, show=found),
    "text": Obj({"source": Text(nullable=False), "sha256": Text(nullable=False), "batches": _POSITIVE,
                 "batch": _POSITIVE, "seq_len": _POSITIVE, "seed": Integer(nullable=False)},
                "an object (where the windows came from)", show=found),
    "checkpoints": ListOf(_ENTRY, "a non-empty list", nonempty=True, show=found),
}, name="file", rules=(_one_trajectory,))


def load_trajectory(path: str | Path) -> dict:
    """The study file, checked; ResultsError names the file, the field and the fix."""
    return load_versioned(path, schema=SCHEMA, version=VERSION, name=FILE, spec=TRAJECTORY,
                          fix="run research/checkpoint_keys_study.py again into this folder with the same "
                              "--checkpoints (converted GGUF files are cached)")
