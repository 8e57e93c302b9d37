"""pretrained_keys.json (research/pretrained_keys_study.py): writing and the one check every read goes through."""
from __future__ import annotations

import json
from pathlib import Path

from research.results.checks import (ShapeError, check_provenance, check_scalar, found, is_integer, is_number,
                                     is_text)
from research.results.schema import ResultsError
from research.results.values import parse_json

SCHEMA = "qk-keys/pretrained-keys"
VERSION = 1
FILE = "pretrained_keys.json"
_DIMS = ("n_layers", "n_heads", "n_kv_heads", "head_dim")
_RANK = ("pr_sv", "pr_var", "erank")


def _grid(value, where: str, rows: int, cols: int) -> None:
    if not isinstance(value, list) or len(value) != rows:
        raise ShapeError(f"{where} should be {rows} lists (one per layer)")
    for i, row in enumerate(value):
        if not isinstance(row, list) or len(row) != cols or not all(is_number(v) or v is None for v in row):
            raise ShapeError(f"{where}[{i}] should be {cols} numbers (one per head)")


def check_description(name: str, rec: dict) -> None:
    """What the report says about a model and its text, each field absent or of the type the report formats."""
    where = f"models.{name}"
    for k in ("source", "family", "model_type"):
        check_scalar(rec.get(k), f"{where}.{k}", is_text, "text")
    check_scalar(rec.get("params"), f"{where}.params", lambda v: is_integer(v) and v > 0, "a positive integer")
    check_scalar(rec.get("wall_s"), f"{where}.wall_s", is_number, "a number of seconds")
    text = rec.get("text")
    check_scalar(text, f"{where}.text", lambda v: isinstance(v, dict), "an object")
    for k, ok, kind in (("source", is_text, "text"), ("sha256", is_text, "text"), ("seed", is_integer, "an integer"),
                        ("batch", is_integer, "an integer"), ("seq_len", is_integer, "an integer")):
        check_scalar((text or {}).get(k), f"{where}.text.{k}", ok, kind)
    gguf = rec.get("gguf")
    check_scalar(gguf, f"{where}.gguf", lambda v: isinstance(v, dict), "an object")
    if gguf:  # the report states all four: each must be there
        for k, ok, kind in (("gguf_file", is_text, "text"), ("gguf_sha256", is_text, "text"),
                            ("check_loss", is_number, "a number"),
                            ("tensor_types", lambda v: isinstance(v, dict) and all(is_number(x) and x >= 0 for x in
                                                                                  v.values()) and sum(v.values()) > 0,
                             "an object of parameter counts by tensor type")):
            if not ok(gguf.get(k)):
                raise ShapeError(f"{where}.gguf.{k} should be {kind}, found {found(gguf.get(k))}")
    gains = rec.get("gains")
    check_scalar(gains, f"{where}.gains", lambda v: isinstance(v, dict), "an object")
    for site, rows in (gains or {}).items():
        if rows is None:
            continue
        if not isinstance(rows, list) or len(rows) != rec["n_layers"]:
            raise ShapeError(f"{where}.gains.{site} should be {rec['n_layers']} lists (one per layer) or null")
        for i, row in enumerate(rows):
            if not isinstance(row, list) or not row or not all(is_number(v) for v in row):
                raise ShapeError(f"{where}.gains.{site}[{i}] should be a non-empty list of numbers")
            if len(row) != len(rows[0]):
                raise ShapeError(f"{where}.gains.{site}[{i}] should hold {len(rows[0])} gains, as layer 0 does, "
                                 f"found {len(row)}")


def check_model(name: str, rec) -> None:
    """Shapes the analysis indexes: per batch, keys[site][metric] [L][Hkv], attn[metric] [L][Hq], a loss; and the
    fields the report shows (check_description)."""
    if not isinstance(rec, dict) or not all(is_integer(rec.get(k)) and rec[k] > 0 for k in _DIMS):
        raise ShapeError(f"models.{name} should record {', '.join(_DIMS)} as positive integers")
    L, Hq, Hkv = rec["n_layers"], rec["n_heads"], rec["n_kv_heads"]
    if Hq % Hkv:
        raise ShapeError(f"models.{name}: n_heads {Hq} should be a multiple of n_kv_heads {Hkv} (query heads share "
                         f"each KV head in equal groups)")
    check_description(name, rec)
    batches = rec.get("batches")
    if not isinstance(batches, list) or not batches:
        raise ShapeError(f"models.{name}.batches should be a non-empty list")
    sites = None
    has_init = isinstance(batches[0], dict) and "init_keys" in batches[0]
    for b, batch in enumerate(batches):
        where = f"models.{name}.batches[{b}]"
        if not isinstance(batch, dict) or not is_number(batch.get("loss")):
            raise ShapeError(f"{where} should hold a numeric loss")
        if "keys" not in batch:
            raise ShapeError(f"{where}.keys should map sites to metrics, found nothing")
        if ("init_keys" in batch) != has_init:
            raise ShapeError(f"{where} should {'' if has_init else 'not '}hold init_keys, as batch 0 does"
                             f"{'' if has_init else ' not'}: the untrained keys are measured on every batch or none")
        for key in ("keys", "init_keys"):
            if key not in batch:
                continue
            if not isinstance(batch[key], dict) or not batch[key]:
                raise ShapeError(f"{where}.{key} should map sites to metrics")
            for site, metrics in batch[key].items():
                if not isinstance(metrics, dict) or "norm_mean" not in metrics:
                    raise ShapeError(f"{where}.{key}.{site} should map metric names to [layer][head] lists")
                for m, v in metrics.items():
                    _grid(v, f"{where}.{key}.{site}.{m}", L, Hkv)
        site = "k_norm" if "k_norm" in batch["keys"] else "k_proj"  # research.analysis.pretrained.site_of
        if site not in batch["keys"]:
            raise ShapeError(f"{where}.keys should hold the site k_norm or k_proj, found {sorted(batch['keys'])}")
        for key in ("keys", "init_keys") if has_init else ():
            if not isinstance(batch[key].get(site), dict) or not all(m in batch[key][site] for m in _RANK):
                raise ShapeError(f"{where}.{key}.{site} should hold {', '.join(_RANK)} (the rank claims compare "
                                 f"the trained and untrained keys in them)")
        if sites is None:
            sites = set(batch["keys"])
        elif set(batch["keys"]) != sites:
            raise ShapeError(f"{where}.keys has sites {sorted(batch['keys'])}, batch 0 has {sorted(sites)}")
        attn = batch.get("attn")
        if not isinstance(attn, dict):
            raise ShapeError(f"{where}.attn should map metric names to [layer][query head] lists")
        for m in ("entropy", "sink_mass", "sink_mass_excl_q0"):
            _grid(attn.get(m), f"{where}.attn.{m}", L, Hq)


def load_versioned(path: str | Path, *, schema: str, version: int, name: str, fix: str, check) -> dict:
    """A study's JSON file of `schema` at `version`, checked by check(res) (raising ShapeError): the one read of
    pretrained_keys.json and checkpoint_keys.json. ResultsError names the file, the problem and `fix`."""
    path = Path(path)
    if not path.is_file():
        raise ResultsError(f"{path}: no such file; {fix}")
    try:
        res = parse_json(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not readable JSON ({e}); the file is corrupted or was cut off: {fix}") from e
    if not isinstance(res, dict) or res.get("schema") != schema:
        raise ResultsError(f"{path}: not a {name} of this project (schema {schema!r} expected)")
    if res.get("version") != version:
        raise ResultsError(f"{path}: version {res.get('version')!r}, this code reads version {version}: {fix}")
    try:
        check(res)
    except ShapeError as e:
        raise ResultsError(f"{path}: {e}. The file was damaged or edited: {fix}") from e
    return res


def _check_file(res: dict) -> None:
    models = res.get("models")
    if not isinstance(models, dict) or not models:
        raise ShapeError("models should map model names to their records")
    check_scalar(res.get("command"), "command", is_text, "text")
    check_scalar(res.get("wall_s"), "wall_s", is_number, "a number of seconds")
    check_provenance(res.get("provenance"))
    for name, rec in models.items():
        check_model(name, rec)


def load_pretrained_keys(path: str | Path) -> dict:
    """The study file, checked; ResultsError names the problem and the fix."""
    return load_versioned(path, schema=SCHEMA, version=VERSION, name=FILE, check=_check_file,
                          fix="run research/pretrained_keys_study.py again into this folder (the models are cached: "
                              "about 3 minutes)")
