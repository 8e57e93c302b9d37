"""Type and shape checks of a results dict, strict enough that analysis and plotting cannot crash on it.

`check_types(res, n)` raises ResultsError naming the field, what it should hold and what it
holds: numbers (or null where a value may be missing) in every per-probe list, lists of one
value per probe in layer_pr and gamma_cv, lists of numbers in gamma_final, and probe records
whose layers, per-head lists and gain statistics have the shapes the analysis indexes. No torch.
"""
from __future__ import annotations

from research.results.vocabulary import ABLATION_MODES, LEGACY_ABLATION_MODES, PER_PROBE


class ShapeError(ValueError):
    """One field of a results dict with the wrong type or length (schema.validate adds the file name)."""


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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


def _per_layer(res: dict, key: str, n: int | None, nulls: bool = True) -> None:
    for layer, values in _dict(res.get(key), key, nullable=key != "layer_pr").items():
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
    for mode in present:
        entry = _dict(ablation[mode], f"gain_ablation.{mode}")
        for q in ("val_loss", "mean_pr"):
            if not (entry.get(q) is None or is_number(entry.get(q))):
                raise ShapeError(f"gain_ablation.{mode}.{q} should be a number or null, found {entry.get(q)!r:.40}")


def check_types(res: dict, n: int) -> None:
    """Raise ShapeError on the first field whose type or length the analysis could not use."""
    if not isinstance(res["tag"], str):
        raise ShapeError(f"tag should be a condition name (text), found {res['tag']!r:.40}")
    for k in PER_PROBE:
        _numbers(res[k], k, n, nulls=k != "tokens")
    if res.get("steps") is not None:
        _numbers(res["steps"], "steps", n, nulls=False)
    _per_layer(res, "layer_pr", n)
    _per_layer(res, "gamma_cv", n)
    _per_layer(res, "gamma_final", None)
    _check_probes(res.get("probes"), n)
    if res.get("gain_ablation") is not None:
        _check_ablation(res["gain_ablation"])
