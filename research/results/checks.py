"""results.json declared (utils.formats specs): every field a reader looks into, its type and its length.

`RESULTS` says what analysis and plotting may rely on: numbers (or null where a value may be missing) in every
per-probe list, one value per probe in layer_pr and gamma_cv (keyed by layer index), numbers in gamma_final, probe
records whose layers, per-head lists and gain statistics have the shapes the analysis indexes, and every other
top-level field a reader looks into (seed, preset, config and its sections, provenance, data, diverged,
init_val_loss, timings, a combined file's n_seeds / seeds). `check_types(res, n)` walks a dict along it and raises
ShapeError (utils.formats.FormatError) naming the field, what it should hold and what it holds; schema.validate
adds the file name and the fix. No torch.
"""
from __future__ import annotations

import math
import re

from configs.config import ConfigError
from research.results.vocabulary import (ABLATION_MODES, KV_CACHE, KV_ERRORS, KV_SCHEMES, KV_SITES,
                                         LEGACY_ABLATION_MODES, PAIR_SHARES, ROTARY_PAIRINGS, SCHEMA)
from utils.errors import shown
from utils.formats import (Bool, FormatError, Integer, ListOf, MapOf, Number, Obj, OneOf, Opt, Req, Spec, Text,
                           check, found, is_integer, is_number)
from utils.hosts import BF16_PATHS

ShapeError = FormatError  # the name readers and tests know; one field that does not fit its declaration

__all__ = ["RESULTS", "PROVENANCE", "ShapeError", "check_absolute_margin", "check_margin", "check_provenance",
           "check_types", "found", "is_integer", "is_layer_key", "is_number"]


def check_margin(name: str, value) -> float:
    """An equivalence margin as a float: a share of the compared values' mean, 0 < margin < 1. The one check of
    --margin / --loss_margin and of the margins a study.json records; ConfigError (a ValueError) otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError(f"{name} {shown(value, 40)} must be a share of the mean between 0 and 1 (e.g. 0.03)")
    return float(value)


def check_absolute_margin(name: str, value, unit: str) -> float:
    """An equivalence margin in a quantity's own units (e.g. the largest attention logit's, in logits) as a float:
    a positive finite number. ConfigError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{name} {shown(value, 40)} must be a positive number of {unit} (e.g. 0.25)")
    return float(value)


LAYER_KEY = "0|[1-9][0-9]*"  # a layer index as JSON object keys hold it: '0', '1', ... (no sign, no leading zero)


def is_layer_key(k) -> bool:
    return isinstance(k, str) and re.fullmatch(LAYER_KEY, k) is not None


PER_PROBE_SIZE = "should have {n} values (one per probe, like 'tokens'), found {len}"
NUMBERS = "a list of numbers"
NUMBERS_OR_NULL = "a list of numbers or null"


def _per_probe(nulls: bool = True, nullable: bool = False) -> ListOf:
    """One value per probe (ctx "probes": how many, the length of 'tokens')."""
    return ListOf(Number(nullable=nulls), NUMBERS_OR_NULL if nulls else NUMBERS, n="probes", size=PER_PROBE_SIZE,
                  nullable=nullable)


def _per_layer(values: ListOf, nullable: bool) -> MapOf:
    return MapOf(values, key_pattern=LAYER_KEY, key_kind="layer index ('0', '1', ...)", nullable=nullable)


class _LayerIndex(Spec):
    """A probe record's layer: an index into its probe's list of layers."""
    expected = "a layer index"

    def check(self, v, where, ctx):
        n = len(ctx["probe"]["layers"])
        if not (is_integer(v) and 0 <= v < n):
            raise FormatError(where, f"a layer index in [0, {n})", found(v))

    def json_schema(self) -> dict:
        return {"type": "integer", "minimum": 0, "$comment": "also checked by the project's reader, not by this "
                "schema: below the number of layers of its probe record"}


_GAIN = Obj({"values": Opt(ListOf(Number(), NUMBERS_OR_NULL))}, nullable=True, rest=Number())
# Each rotary pair's share, per head (research.probing.probe.ModelRope.use): [heads][pairs]
PAIRS = _PAIRS = ListOf(ListOf(Number(), NUMBERS_OR_NULL), "a list of one list of numbers per head")
_RECORD = Obj({"layer": _LayerIndex(), "means": MapOf(Number(), nullable=True), "gamma_k": _GAIN, "gamma_q": _GAIN,
               "pair_share": Opt(Obj({name: Opt(_PAIRS) for name in PAIR_SHARES}))},
              # every other key is a site: {metric: one value per head}, as long in every record
              rest=MapOf(ListOf(Number(), NUMBERS_OR_NULL, uniform=True,
                                size="should have {n} values, as in every other probe record, found {len}"),
                         path="dot"))
# What a key cache costs (research.probing.kv_cache): per layer, per query head, the attention errors of keys
# quantized[site][scheme][bits] and projected[site][rank]; the loss with every key quantized, by bits.
_WHOLE_KEY = "[1-9][0-9]*"  # bits or a rank as JSON object keys hold them: '8', '16'
_ERRORS = Obj({name: Req(ListOf(Number(), NUMBERS_OR_NULL)) for name in KV_ERRORS})
_BY_SITE = dict(key_pattern="|".join(KV_SITES), key_kind=f"a site ({', '.join(KV_SITES)})")
_KV_LAYER = Obj({
    "layer": Integer("a layer index", nullable=False, lo=0),
    "quantized": MapOf(MapOf(MapOf(_ERRORS, key_pattern=_WHOLE_KEY, key_kind="bits ('8', '4', ...)"),
                             key_pattern="|".join(KV_SCHEMES), key_kind=f"a scheme ({', '.join(KV_SCHEMES)})"),
                       **_BY_SITE),
    "projected": MapOf(MapOf(_ERRORS, key_pattern=_WHOLE_KEY, key_kind="a rank ('8', '16', ...)"), **_BY_SITE),
    "formats": Opt(MapOf(_ERRORS))})  # since 2026-11-29: each key-cache format's errors, after RoPE
_BY_BITS = MapOf(Number(), key_pattern=_WHOLE_KEY, key_kind="bits ('16', '8', ...)")
KV_SECTION = _KV = Obj({"step": Opt(Integer("a step (an integer)", nullable=False)),
           "sequences": Req(Integer("a positive integer", nullable=False, lo=1)),
           "seq_len": Integer("a positive integer", lo=1), "precision": Text(),
           "bits": ListOf(Integer(nullable=False), "a list of integers", nullable=True),
           "ranks": ListOf(Integer(nullable=False), "a list of integers", nullable=True),
           "loss": Obj({"scheme": Text(), "site": Text(), "by_bits": Req(_BY_BITS), "change": Req(_BY_BITS)},
                       nullable=True),
           "usable_k_bits": Integer("a number of bits (an integer)", lo=1), "loss_margin": Number(),
           # since 2026-11-29: the formats engines ship (research.probing.key_formats), the loss with every key in
           # each, after RoPE, and the fewest bytes per value within the loss margin
           "formats": Opt(Obj({"site": Text(), "cases": ListOf(Text(nullable=False), "a list of format names"),
                               "bytes": MapOf(Number()), "by_format": MapOf(Number()), "change": MapOf(Number()),
                               "usable_k_format": Text("a format name, or null")})),
           # since 2026-11-28, with kv_layer_bits: each layer's losses with only its keys quantized, its usable bits
           "layer_bits": Opt(Obj({"by_bits": Req(ListOf(_BY_BITS, "a list of one object per layer")),
                                  "usable_k_bits": Req(ListOf(Integer("a number of bits (an integer)", lo=1),
                                                              "a list of one number of bits (or null) per layer")),
                                  "by_format": Opt(ListOf(MapOf(Number()), "a list of one object per layer")),
                                  "usable_k_format": Opt(ListOf(Text("a format name, or null"),
                                                                "a list of one format (or null) per layer"))})),
           "layers": Req(ListOf(_KV_LAYER, "a list of layer records"))})
_PROBE = Obj({"layers": ListOf(_RECORD, "a list of one or more layer records", nonempty=True, uniform=True,
                               size="should be a list of {n} layer records, as in every other probe, found {len}"),
              "tokens": Opt(Number(nullable=False)),
              "batch": ListOf(Number(nullable=False), NUMBERS, nullable=True),
              "rotary": Opt(Obj({"pairing": OneOf(ROTARY_PAIRINGS), "context": Integer("a positive integer", lo=1),
                                 "rotary_dims": Opt(Integer("a number of dims (an integer)", lo=1))})),
              KV_CACHE: Opt(_KV)}, name="probe")
_PROBES = ListOf(_PROBE, "a list of probe records, one per probe (or empty)", n="probes", nullable=True,
                 empty_ok=True, size="should be a list of {n} probe records (or empty), found {len}")


def _ablation_modes(ablation: dict, where: str, ctx) -> None:
    present = [m for m in (*ABLATION_MODES, *LEGACY_ABLATION_MODES) if m in ablation]
    if "learned" not in present or len(present) < 2:
        raise FormatError(where, problem=" should hold 'learned' and at least one of " + ", ".join(ABLATION_MODES[1:]))


_MODE = Obj({"val_loss": Req(Number()), "mean_pr": Req(Number())})
_ABLATION = Obj({"step": Opt(Integer("a step (an integer)", nullable=False)),
                 **{m: Opt(_MODE) for m in (*ABLATION_MODES, *LEGACY_ABLATION_MODES)}},
                nullable=True, rules=(_ablation_modes,))


def _wd_needs_lr(train: dict, where: str, ctx) -> None:
    if train.get("wd_on_gains") and not is_number(train.get("adamw_lr")):
        raise FormatError(f"{where}.adamw_lr", f"a number ({where}.wd_on_gains is set)", found(train.get("adamw_lr")))


_POSITIVE = Integer("a positive integer", lo=1)
# The run's config (configs.RunConfig.to_dict()): the sections and values readers look into.
_CONFIG = Obj({
    "model": Obj({**{k: _POSITIVE for k in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_head", "head_dim")},
                  "qk_norm": Text()}, nullable=True),
    "train": Obj({"seed": Integer(), **{k: Number() for k in ("adamw_lr", "adamw_weight_decay", "weight_decay",
                                                               "muon_lr")}},
                 nullable=True, rules=(_wd_needs_lr,)),
    "data": Obj({}, nullable=True),
    "probe": Obj({}, nullable=True),
    "preset": Text("a preset name (text)"),
}, nullable=True)
# provenance: git_commit and qk_keys (the package version, recorded since files could lack a commit; older files
# have no such field) are text or null. The fields that decide which runs a study compares (research.analysis.identity,
# research.studies.hosts): the training precision, the host kind (utils.hosts) with the fields an older file's
# is read from, and the CPU threads; each absent in files written before it was recorded.
PROVENANCE = Obj({
    "git_commit": Text(), "qk_keys": Text(),
    "train_precision": Opt(OneOf(("bf16", "fp32"), kind="bf16 or fp32, the precision the run trained in")),
    "host_kind": Opt(Text("the host kind the run trained on, text (utils.hosts: the CPU model and its native bf16 "
                          "path, or the GPU; null where the CPU is not named)", nonempty=True)),
    "cpu_bf16": Opt(OneOf(BF16_PATHS, kind=f"the CPU's native bf16 path, one of {', '.join(BF16_PATHS)}")),
    "cpu_native_bf16": Opt(Bool("whether the CPU has native bf16, true or false (older files' host kind)",
                                nullable=True)),
    "cpu": Opt(Text("the CPU's model name (text)")),
    "gpu": Opt(Text("the GPU's name (text), on CUDA")),
    "device": Opt(Text("the device the run trained on (text)")),
    # the CPU threads the run computed with and why (utils.threads): bf16 values move with the count, so a study
    # says where its runs differ in it (research.analysis.identity, research.studies.hosts)
    "cpu_threads": Opt(Integer("a positive integer, the CPU threads torch computed with", lo=1)),
    "cpu_threads_why": Opt(Text("why that many threads, text (utils.threads: asked, OMP_NUM_THREADS, free cores)")),
}, nullable=True)


def _seeds_once(res: dict, where: str, ctx) -> None:
    """A pilot's combined file: how many seeds each curve is the mean of, and which (null: not recorded)."""
    seeds = res.get("seeds")
    if seeds is None:
        return
    known = [s for s in seeds if s is not None]
    if len(set(known)) < len(known):
        raise FormatError("seeds", problem=f" {seeds} names a seed more than once")
    if res.get("n_seeds") is not None and len(known) == len(seeds) and len(seeds) != res["n_seeds"]:
        raise FormatError("seeds", problem=f" lists {len(seeds)} seeds, n_seeds says {res['n_seeds']}")


# Req: the write-ups' fields every results file holds (schema.validate names the missing ones first, as not a
# results.json of this project or of the write-ups)
RESULTS = Obj({
    "tag": Req(Text("a condition name (text)", nullable=False, nonempty=True)),
    "tokens": Req(_per_probe(nulls=False)),
    "loss": Req(_per_probe()), "val_loss": Req(_per_probe()), "mean_pr": Req(_per_probe()),
    "steps": _per_probe(nulls=False, nullable=True),
    "seed": Integer(),
    "preset": Text("a preset name (text)"),
    "schema": Opt(OneOf((SCHEMA,))),  # absent in the write-ups' files
    "schema_version": Integer("a version (an integer)", lo=0),
    "config": _CONFIG,
    "provenance": PROVENANCE,
    "data": Obj({}, nullable=True),
    "diverged": Obj({"step": Integer("a step (an integer)")}, nullable=True),
    "init_val_loss": Number(),
    "wall_time_s": Opt(_per_probe()), "probe_time_s": Opt(_per_probe()),
    "n_seeds": Opt(Integer("a positive integer", nullable=False, lo=1)),
    "seeds": Opt(ListOf(Integer(), "a list of integers (null: not recorded)", nonempty=True, whole=True, show=found)),
    "layer_pr": Req(_per_layer(_per_probe(), nullable=False)),
    "gamma_cv": _per_layer(_per_probe(), nullable=True),
    "gamma_final": _per_layer(ListOf(Number(), NUMBERS_OR_NULL), nullable=True),
    "probes": _PROBES,
    "gain_ablation": _ABLATION,
    KV_CACHE: Opt(_KV),
    "alarms": Opt(ListOf(Obj({"step": Integer("a step (an integer)"), "tokens": Integer(),
                              "alarm": Obj({"signal": Text("a signal name (text)", nullable=False),
                                            "value": Number(), "threshold": Number()})}),
                         "a list of alarms (--spike_alarm)")),
}, rules=(_seeds_once,))


def check_provenance(value) -> None:
    check(PROVENANCE, value, "provenance")


def check_types(res: dict, n: int) -> None:
    """Raise ShapeError on the first field whose type or length the analysis could not use (n: probes in the file)."""
    check(RESULTS, res, ctx={"probes": n})
