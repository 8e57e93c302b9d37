"""Type and shape checks of a results dict, strict enough that analysis and plotting cannot crash on it.

`check_types(res, n)` raises ShapeError naming the field, what it should hold and what it
holds: numbers (or null where a value may be missing) in every per-probe list, lists of one
value per probe in layer_pr and gamma_cv (keyed by layer index), lists of numbers in gamma_final,
probe records whose layers, per-head lists and gain statistics have the shapes the analysis
indexes, and every other top-level field a reader looks into (seed, preset, config and its
sections, provenance, data, diverged, init_val_loss, timings, a combined file's n_seeds / seeds).
No torch.
"""
from __future__ import annotations

from configs.config import ConfigError
from research.results.vocabulary import ABLATION_MODES, LEGACY_ABLATION_MODES, PER_PROBE


class ShapeError(ValueError):
    """One field of a results dict with the wrong type or length (schema.validate adds the file name)."""


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_text(v) -> bool:
    return isinstance(v, str)


def check_margin(name: str, value) -> float:
    """An equivalence margin as a float: a share of the compared values' mean, 0 < margin < 1. The one check of
    --margin / --loss_margin and of the margins a study.json records; ConfigError (a ValueError) otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError(f"{name} {value!r:.40} must be a share of the mean between 0 and 1 (e.g. 0.03)")
    return float(value)


def found(v) -> str:
    """A value as a message shows it: containers by their JSON type, scalars by their repr (cut at 40)."""
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    return f"{v!r:.40}"


def check_scalar(value, where: str, ok, kind: str, nullable: bool = True) -> None:
    """A scalar field: of its type (`ok`), or absent (None) where `nullable`; ShapeError otherwise."""
    if not ((nullable and value is None) or ok(value)):
        raise ShapeError(f"{where} should be {kind}{' or null' if nullable else ''}, found {found(value)}")


def _numbers(values, where: str, n: int | None = None, nulls: bool = True) -> None:
    kind = "numbers or null" if nulls else "numbers"
    if not isinstance(values, list):
        raise ShapeError(f"{where} should be a list of {kind}, found {type(values).__name__}")
    if n is not None and len(values) != n:
        raise ShapeError(f"{where} should have {n} values (one per probe, like 'tokens'), found {len(values)}")
    for i, v in enumerate(values):
        if not (is_number(v) or (nulls and v is None)):
            raise ShapeError(f"{where}[{i}] should be a number{' or null' if nulls else ''}, found {v!r:.40}")


def _dict(value, where: str, nullable: bool = False) -> dict:
    if value is None and nullable:
        return {}
    if not isinstance(value, dict):
        raise ShapeError(f"{where} should be an object, found {type(value).__name__}")
    return value


def is_layer_key(k) -> bool:
    """'0', '1', ...: a layer index as JSON object keys hold it (no sign, no leading zero)."""
    return isinstance(k, str) and k.isdigit() and str(int(k)) == k


def _per_layer(res: dict, key: str, n: int | None, nulls: bool = True) -> None:
    for layer, values in _dict(res.get(key), key, nullable=key != "layer_pr").items():
        if not is_layer_key(layer):
            raise ShapeError(f"{key} should be keyed by layer index ('0', '1', ...), found the key {layer!r:.40}")
        _numbers(values, f"{key}[{layer!r}]", n, nulls)


def _check_record(rec, where: str, n_layers: int, widths: dict) -> None:
    """One layer of a probe record; `widths` remembers each per-head list's length across the run."""
    rec = _dict(rec, where)
    layer = rec.get("layer")
    if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < n_layers:
        raise ShapeError(f"{where}.layer should be a layer index in [0, {n_layers}), found {layer!r:.40}")
    for metric, v in _dict(rec.get("means"), f"{where}.means", nullable=True).items():
        if not (v is None or is_number(v)):
            raise ShapeError(f"{where}.means[{metric!r}] should be a number or null, found {v!r:.40}")
    for site, metrics in rec.items():
        if site in ("layer", "means", "gamma_k", "gamma_q"):
            continue
        for metric, values in _dict(metrics, f"{where}.{site}").items():
            _numbers(values, f"{where}.{site}.{metric}", widths.setdefault((site, metric), len(values))
                     if isinstance(values, list) else None)
    for g in ("gamma_k", "gamma_q"):
        stats = _dict(rec.get(g), f"{where}.{g}", nullable=True)
        if "values" in stats:
            _numbers(stats["values"], f"{where}.{g}.values")
        for k, v in stats.items():
            if k != "values" and not (v is None or is_number(v)):
                raise ShapeError(f"{where}.{g}.{k} should be a number or null, found {v!r:.40}")


def _check_probes(probes, n: int) -> None:
    if probes is None:
        return
    if not isinstance(probes, list) or len(probes) not in (0, n):
        raise ShapeError(f"probes should be a list of {n} probe records (or empty), found "
                         f"{len(probes) if isinstance(probes, list) else type(probes).__name__}")
    widths: dict = {}
    n_layers = None
    for p, probe in enumerate(probes):
        probe = _dict(probe, f"probes[{p}]")
        layers = probe.get("layers")
        if not isinstance(layers, list) or not layers or (n_layers is not None and len(layers) != n_layers):
            raise ShapeError(f"probes[{p}].layers should be a list of {n_layers or 'one or more'} layer records")
        n_layers = len(layers)
        for i, rec in enumerate(layers):
            _check_record(rec, f"probes[{p}].layers[{i}]", n_layers, widths)
        if "tokens" in probe and not is_number(probe["tokens"]):
            raise ShapeError(f"probes[{p}].tokens should be a number, found {probe['tokens']!r:.40}")
        if probe.get("batch") is not None:
            _numbers(probe["batch"], f"probes[{p}].batch", nulls=False)


def _check_ablation(ablation) -> None:
    """'learned' and every mode present (legacy names included) must hold numbers or nulls."""
    ablation = _dict(ablation, "gain_ablation")
    present = [m for m in (*ABLATION_MODES, *LEGACY_ABLATION_MODES) if m in ablation]
    if "learned" not in present or len(present) < 2:
        raise ShapeError("gain_ablation should hold 'learned' and at least one of " + ", ".join(ABLATION_MODES[1:]))
    if "step" in ablation:
        check_scalar(ablation["step"], "gain_ablation.step", is_integer, "a step (an integer)", nullable=False)
    for mode in present:
        entry = _dict(ablation[mode], f"gain_ablation.{mode}")
        for q in ("val_loss", "mean_pr"):
            if q not in entry:
                raise ShapeError(f"gain_ablation.{mode} should hold {q} (a number or null), found no {q}")
            check_scalar(entry[q], f"gain_ablation.{mode}.{q}", is_number, "a number")


_MODEL_SIZES = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_head", "head_dim")
_TRAIN_NUMBERS = ("adamw_lr", "adamw_weight_decay", "weight_decay", "muon_lr")


def _check_config(config) -> None:
    """The run's config (configs.RunConfig.to_dict()): the sections and values readers look into."""
    config = _dict(config, "config", nullable=True)
    sections = {s: _dict(config.get(s), f"config.{s}", nullable=True) for s in ("model", "train", "data", "probe")}
    check_scalar(config.get("preset"), "config.preset", is_text, "a preset name (text)")
    model, train = sections["model"], sections["train"]
    for k in _MODEL_SIZES:
        check_scalar(model.get(k), f"config.model.{k}", lambda v: is_integer(v) and v > 0, "a positive integer")
    check_scalar(model.get("qk_norm"), "config.model.qk_norm", is_text, "text")
    check_scalar(train.get("seed"), "config.train.seed", is_integer, "an integer")
    for k in _TRAIN_NUMBERS:
        check_scalar(train.get(k), f"config.train.{k}", is_number, "a number")
    if train.get("wd_on_gains") and not is_number(train.get("adamw_lr")):
        raise ShapeError(f"config.train.adamw_lr should be a number (config.train.wd_on_gains is set), found "
                         f"{found(train.get('adamw_lr'))}")


def check_provenance(value) -> None:
    """provenance: an object (or null) whose git_commit and qk_keys (the package version, recorded since files
    could lack a commit; older files have no such field) are text or null."""
    prov = _dict(value, "provenance", nullable=True)
    for k in ("git_commit", "qk_keys"):
        check_scalar(prov.get(k), f"provenance.{k}", is_text, "text")


def _check_header(res: dict, n: int) -> None:
    """The top-level fields beside the write-ups' ones: what every reader may look into."""
    check_scalar(res.get("seed"), "seed", is_integer, "an integer")
    check_scalar(res.get("preset"), "preset", is_text, "a preset name (text)")
    check_scalar(res.get("schema_version"), "schema_version", lambda v: is_integer(v) and v >= 0,
                 "a version (an integer)")
    _check_config(res.get("config"))
    check_provenance(res.get("provenance"))
    _dict(res.get("data"), "data", nullable=True)
    diverged = _dict(res.get("diverged"), "diverged", nullable=True)
    check_scalar(diverged.get("step"), "diverged.step", is_integer, "a step (an integer)")
    check_scalar(res.get("init_val_loss"), "init_val_loss", is_number, "a number")
    for k in ("wall_time_s", "probe_time_s"):
        if k in res:
            _numbers(res[k], k, n)
    # a pilot's combined file: how many seeds each curve is the mean of, and which
    if "n_seeds" in res:
        check_scalar(res["n_seeds"], "n_seeds", lambda v: is_integer(v) and v > 0, "a positive integer", nullable=False)
    seeds = res.get("seeds")
    if "seeds" in res:
        if not isinstance(seeds, list) or not seeds or not all(s is None or is_integer(s) for s in seeds):
            raise ShapeError(f"seeds should be a list of integers (null: not recorded), found {found(seeds)}")
        known = [s for s in seeds if s is not None]
        if len(set(known)) < len(known):
            raise ShapeError(f"seeds {seeds} names a seed more than once")
        if res.get("n_seeds") is not None and len(known) == len(seeds) and len(seeds) != res["n_seeds"]:
            raise ShapeError(f"seeds lists {len(seeds)} seeds, n_seeds says {res['n_seeds']}")


def check_types(res: dict, n: int) -> None:
    """Raise ShapeError on the first field whose type or length the analysis could not use."""
    if not isinstance(res["tag"], str) or not res["tag"]:
        raise ShapeError(f"tag should be a condition name (text), found {found(res['tag'])}")
    for k in PER_PROBE:
        _numbers(res[k], k, n, nulls=k != "tokens")
    if res.get("steps") is not None:
        _numbers(res["steps"], "steps", n, nulls=False)
    _check_header(res, n)
    _per_layer(res, "layer_pr", n)
    _per_layer(res, "gamma_cv", n)
    _per_layer(res, "gamma_final", None)
    _check_probes(res.get("probes"), n)
    if res.get("gain_ablation") is not None:
        _check_ablation(res["gain_ablation"])
