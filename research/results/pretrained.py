"""pretrained_keys.json (research/pretrained_keys_study.py): writing and the one check every read goes through."""
from __future__ import annotations

import json
from pathlib import Path

from research.results.checks import ShapeError, is_number
from research.results.schema import ResultsError

SCHEMA = "qk-keys/pretrained-keys"
VERSION = 1
FILE = "pretrained_keys.json"
_DIMS = ("n_layers", "n_heads", "n_kv_heads", "head_dim")


def _grid(value, where: str, rows: int, cols: int) -> None:
    if not isinstance(value, list) or len(value) != rows:
        raise ShapeError(f"{where} should be {rows} lists (one per layer)")
    for i, row in enumerate(value):
        if not isinstance(row, list) or len(row) != cols or not all(is_number(v) or v is None for v in row):
            raise ShapeError(f"{where}[{i}] should be {cols} numbers (one per head)")


def check_model(name: str, rec) -> None:
    """Shapes the analysis indexes: per batch, keys[site][metric] [L][Hkv], attn[metric] [L][Hq], a loss."""
    if not isinstance(rec, dict) or not all(isinstance(rec.get(k), int) and rec[k] > 0 for k in _DIMS):
        raise ShapeError(f"models.{name} should record {', '.join(_DIMS)} as positive integers")
    L, Hq, Hkv = rec["n_layers"], rec["n_heads"], rec["n_kv_heads"]
    batches = rec.get("batches")
    if not isinstance(batches, list) or not batches:
        raise ShapeError(f"models.{name}.batches should be a non-empty list")
    sites = None
    for b, batch in enumerate(batches):
        where = f"models.{name}.batches[{b}]"
        if not isinstance(batch, dict) or not is_number(batch.get("loss")):
            raise ShapeError(f"{where} should hold a numeric loss")
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
        if sites is None:
            sites = set(batch["keys"])
        elif set(batch["keys"]) != sites:
            raise ShapeError(f"{where}.keys has sites {sorted(batch['keys'])}, batch 0 has {sorted(sites)}")
        attn = batch.get("attn")
        if not isinstance(attn, dict):
            raise ShapeError(f"{where}.attn should map metric names to [layer][query head] lists")
        for m in ("entropy", "sink_mass", "sink_mass_excl_q0"):
            _grid(attn.get(m), f"{where}.attn.{m}", L, Hq)


def load_pretrained_keys(path: str | Path) -> dict:
    """The study file, checked; ResultsError names the problem and the fix."""
    path = Path(path)
    fix = "run research/pretrained_keys_study.py again into this folder (the models are cached: about 3 minutes)"
    if not path.is_file():
        raise ResultsError(f"{path}: no such file; {fix}")
    try:
        res = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not readable JSON ({e}); the file is corrupted or was cut off: {fix}") from e
    if not isinstance(res, dict) or res.get("schema") != SCHEMA:
        raise ResultsError(f"{path}: not a {FILE} of this project (schema {SCHEMA!r} expected)")
    if res.get("version") != VERSION:
        raise ResultsError(f"{path}: version {res.get('version')!r}, this code reads version {VERSION}: {fix}")
    models = res.get("models")
    try:
        if not isinstance(models, dict) or not models:
            raise ShapeError("models should map model names to their records")
        for name, rec in models.items():
            check_model(name, rec)
    except ShapeError as e:
        raise ResultsError(f"{path}: {e}. The file was damaged or edited: {fix}") from e
    return res
