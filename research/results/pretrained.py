"""pretrained_keys.json (research/pretrained_keys_study.py): writing and the one check every read goes through."""
from __future__ import annotations

import json
from pathlib import Path

from research.results.checks import KV_SECTION, PAIRS, PROVENANCE
from research.results.vocabulary import PAIR_SHARES, QUERY_ROTARY
from research.results.file_errors import ResultsError, check_version
from research.results.values import parse_json
from utils.errors import shown
from utils.formats import FormatError, Integer, ListOf, MapOf, Number, Obj, Opt, Req, Rule, Text, check, found
from utils.owners import PRETRAINED_KEYS


SCHEMA = "qk-keys/pretrained-keys"
VERSION = 1
FILE = PRETRAINED_KEYS  # its name in the owner table (utils.owners)
_DIMS = ("n_layers", "n_heads", "n_kv_heads", "head_dim")
_RANK = ("pr_sv", "pr_var", "erank")


def _grid(cols: str, what: str) -> ListOf:
    """[layer][head] numbers: n_layers rows of `cols` (a dimension of the model record, ctx "model") each."""
    row = ListOf(Number(), f"a list of {what}", n=lambda c: c["model"][cols],
                 size="should be {n} numbers (one per " + what + "), found {len}")
    return ListOf(row, "a list of lists (one per layer)", n=lambda c: c["model"]["n_layers"],
                  size="should be {n} lists (one per layer), found {len}")


def _heads_divide(rec: dict, where: str, ctx) -> None:
    if rec["n_heads"] % rec["n_kv_heads"]:
        raise FormatError(where, problem=f": n_heads {rec['n_heads']} should be a multiple of n_kv_heads "
                                         f"{rec['n_kv_heads']} (query heads share each KV head in equal groups)")


_GGUF = Obj({"gguf_file": Text(nullable=False), "gguf_sha256": Text(nullable=False),
             "check_loss": Number(nullable=False),
             "tensor_types": MapOf(Number(ok=lambda v: v >= 0, nullable=False),
                                   "an object of parameter counts by tensor type", path="dot", nonempty=True,
                                   show=found)})


def _gguf(rec: dict, where: str, ctx) -> None:
    """The report states all four facts of a model converted from GGUF: each must be there."""
    if rec.get("gguf"):
        check(_GGUF, rec["gguf"], f"{where}.gguf", ctx)


_GAINS = MapOf(ListOf(ListOf(Number(nullable=False), "a non-empty list of numbers", nonempty=True, uniform=True,
                             size="should hold {n} gains, as layer 0 does, found {len}"),
                      "a list of lists (one per layer)", n=lambda c: c["model"]["n_layers"], nullable=True,
                      size="should be {n} lists (one per layer) or null, found {len}"),
               "an object or null", path="dot", nullable=True, show=found)
_KEY_SITE = Obj({"norm_mean": Req(_grid("n_kv_heads", "head"))}, "should map metric names to [layer][head] lists",
                rest=_grid("n_kv_heads", "head"), show=found)
_KEYS = MapOf(_KEY_SITE, "should map sites to metrics", path="dot", nonempty=True, show=found)


def _key_sites(batch: dict, where: str, ctx) -> None:
    """The site the analysis reads (research.analysis.pretrained.site_of), the rank metrics where the untrained keys
    are compared, and one set of sites and of measurements (init_keys or not) in every batch."""
    first = ctx["model"]["batches"][0]
    has_init = "init_keys" in first
    if ("init_keys" in batch) != has_init:
        raise FormatError(where, problem=f" should {'' if has_init else 'not '}hold init_keys, as batch 0 does"
                                         f"{'' if has_init else ' not'}: the untrained keys are measured on every "
                                         f"batch or none")
    site = "k_norm" if "k_norm" in batch["keys"] else "k_proj"
    if site not in batch["keys"]:
        raise FormatError(f"{where}.keys", problem=f" should hold the site k_norm or k_proj, found "
                                                   f"{sorted(batch['keys'])}")
    for key in ("keys", "init_keys") if has_init else ():
        if not all(m in batch[key].get(site, {}) for m in _RANK):
            raise FormatError(f"{where}.{key}.{site}", problem=f" should hold {', '.join(_RANK)} (the rank claims "
                                                               f"compare the trained and untrained keys in them)")
    if set(batch["keys"]) != set(first["keys"]):
        raise FormatError(f"{where}.keys", problem=f" has sites {sorted(batch['keys'])}, batch 0 has "
                                                   f"{sorted(first['keys'])}")


_ATTN = ("entropy", "sink_mass", "sink_mass_excl_q0")
_BATCH = Obj({"loss": Number("a numeric loss", nullable=False), "keys": _KEYS, "init_keys": Opt(_KEYS),
              "attn": Obj({**{m: _grid("n_heads", "query head") for m in _ATTN},
                           **{m: Opt(_grid("n_heads", "query head")) for m in QUERY_ROTARY}},
                          "should map metric names to [layer][query head] lists", show=found),
              # since 2026-11-28: each rotary pair's share per layer, and what a key cache costs
              "pair_share": Opt(ListOf(Obj({name: Opt(PAIRS) for name in PAIR_SHARES}), "a list of layer objects",
                                       n=lambda c: c["model"]["n_layers"],
                                       size="should be {n} objects (one per layer), found {len}")),
              "kv": Opt(KV_SECTION)},
             rules=(_key_sites,), show=found)
# One model's measurement: per text batch, keys[site][metric] [L][Hkv], attn[metric] [L][Hq], a loss; and what the
# report says about the model and its text, each field absent or of the type the report formats.
MODEL = Obj({
    **{k: Integer("a positive integer", nullable=False, lo=1) for k in _DIMS},
    "(heads)": Rule(_heads_divide),
    **{k: Text() for k in ("source", "family", "model_type")},
    "params": Integer("a positive integer", lo=1),
    "wall_s": Number("a number of seconds"),
    "text": Obj({"source": Text(), "sha256": Text(), "seed": Integer(), "batch": Integer(), "seq_len": Integer()},
                "an object or null", nullable=True, show=found),
    "gguf": Obj({}, "an object or null", nullable=True, show=found),
    "(gguf)": Rule(_gguf),
    "gains": _GAINS,
    "batches": ListOf(_BATCH, "a non-empty list", nonempty=True, show=found),
}, name="model", show=found)


def check_model(rec, where: str) -> None:
    """One measured model (a model of pretrained_keys.json, a checkpoint of checkpoint_keys.json) at `where`."""
    check(MODEL, rec, where)


def load_versioned(path: str | Path, *, schema: str, version: int, name: str, fix: str, spec: Obj) -> dict:
    """A study's JSON file of `schema` at `version`, checked against its declaration `spec`: the one read of
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
    check_version(res, path, version, key="version")
    if res.get("version") != version:
        raise ResultsError(f"{path}: version {shown(res.get('version'))}, this code reads version {version}: {fix}")
    try:
        check(spec, res)
    except FormatError as e:
        raise ResultsError(f"{path}: {e}. The file was damaged or edited: {fix}") from e
    return res


PRETRAINED_KEYS = Obj({"models": MapOf(MODEL, "should map model names to their records", path="dot", nonempty=True,
                                      show=found),
                       "command": Text(), "wall_s": Number("a number of seconds"), "provenance": PROVENANCE,
                       "margin": Number("a share between 0 and 1", ok=lambda v: 0 < v < 1)})


def load_pretrained_keys(path: str | Path) -> dict:
    """The study file, checked; ResultsError names the problem and the fix."""
    return load_versioned(path, schema=SCHEMA, version=VERSION, name=FILE, spec=PRETRAINED_KEYS,
                          fix="run research/pretrained_keys_study.py again into this folder (the models are cached: "
                              "about 3 minutes)")
