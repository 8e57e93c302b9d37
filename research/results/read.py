"""Reading results dicts: the accessors analysis and plots share (no torch).

Every function takes a validated results dict (research.results.schema.validate) and
works on files that carry only the write-ups' fields as well: whatever is missing comes
back empty, NaN or None, never as an exception.
"""
from __future__ import annotations

import math

import numpy as np

from research.results.values import as_float
from research.results.vocabulary import KV_CACHE, MAIN_SITE, TRACKED_LAYER_MEANS


def seed_of(res: dict):
    """The run's seed: the top-level field, else the config's, else None."""
    if res.get("seed") is not None:
        return res["seed"]
    return ((res.get("config") or {}).get("train") or {}).get("seed")


def pair_key(res: dict):
    """What pairs a run with the runs of other conditions: its seed (seed_of; research.results.layout fills in
    the seed_<n> folder's when the file names none); for a curve that is the mean over several seeds (a pilot's
    combined file), the tuple of those seeds when all are recorded; else None: the run is never paired."""
    seed = seed_of(res)
    if seed is not None:
        return seed
    seeds = res.get("seeds")
    return tuple(seeds) if seeds and None not in seeds else None


def seeds_text(runs: list[dict]) -> str:
    """How a figure or report names the runs it averages: 'seed 3', '1 run' (seed unknown) or 'mean over n seeds'."""
    if len(runs) == 1:
        seed = seed_of(runs[0])
        return f"seed {seed}" if seed is not None else "1 run"
    return f"mean over {len(runs)} seeds"


def d_head_of(res: dict) -> tuple[int | None, str]:
    """(key dimension D, where it came from); (None, ...) when the file does not say."""
    model = (res.get("config") or {}).get("model") or {}
    if model.get("d_head") or model.get("head_dim"):
        return int(model.get("d_head") or model["head_dim"]), "config d_head"
    if model.get("d_model") and model.get("n_heads"):
        return int(model["d_model"]) // int(model["n_heads"]), "config d_model / n_heads"
    for probe in res.get("probes") or []:
        for rec in probe["layers"]:
            g = rec.get("gamma_k")
            if g and g.get("values"):
                return len(g["values"]), "length of the k_norm gain vector (no model config in the file)"
    for values in (res.get("gamma_final") or {}).values():
        if values:
            return len(values), "length of gamma_final (no model config in the file)"
    return None, "not recorded in the file"


def last(res: dict, field: str) -> float:
    """The last value of a per-probe field (NaN when there is none)."""
    values = res.get(field) or []
    return as_float(values[-1]) if values else math.nan


def final_site_mean(res: dict, site: str, metric: str) -> float:
    """Mean over layers of <site>.<metric> at the last probe record (NaN without records or values)."""
    probes = res.get("probes") or []
    if not probes:
        return math.nan
    values = [as_float((layer.get("means") or {}).get(f"{site}.{metric}")) for layer in probes[-1]["layers"]]
    return float(np.mean(values)) if values else math.nan


def probe_tokens(res: dict) -> np.ndarray:
    """Training tokens at each probe record (the top-level `tokens` when there are no records)."""
    probes = res.get("probes") or []
    if probes:
        return np.array([as_float(p.get("tokens")) for p in probes], dtype=float)
    return np.array([as_float(t) for t in res.get("tokens", [])], dtype=float)


def layer_series(res: dict, metric: str, site: str = MAIN_SITE) -> np.ndarray:
    """[n_probes, n_layers] layer means of `site.metric` from the probe records (NaN where missing)."""
    probes = res.get("probes") or []
    if not probes:
        return np.zeros((0, 0))
    out = np.full((len(probes), len(probes[0]["layers"])), np.nan)
    for p, probe in enumerate(probes):
        for rec in probe["layers"]:
            if rec["layer"] < out.shape[1]:
                out[p, rec["layer"]] = as_float((rec.get("means") or {}).get(f"{site}.{metric}"))
    return out


def kv_layers(section: dict | None, path: tuple[str, ...]) -> np.ndarray:
    """[n_layers]: the mean over query heads of a key cache section's per-layer errors at `path` (e.g. ("quantized",
    "pre_rope", "per_token", "4", "logit_error") or ("projected", "post_rope", "8", "attention_kl")); empty where the
    section or the path is missing."""
    rows = []
    for layer in (section or {}).get("layers") or []:
        value = layer
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        heads = [as_float(v) for v in value] if isinstance(value, list) else []
        rows.append(float(np.nanmean(heads)) if any(math.isfinite(v) for v in heads) else math.nan)
    return np.array(rows, float)


def kv_value(section: dict | None, path: tuple[str, ...]) -> float:
    """One number of a key cache section (results.json's kv_cache): for ("loss", bits) the change of the loss with
    every key quantized at `bits` as a share of the unquantized loss, (L_bits - L_16) / L_16, and for ("format",
    name) with every key in that key-cache format; for a path of per-layer
    errors (kv_layers) their mean over layers. NaN where the section or the value is missing."""
    if path[0] in ("loss", "format"):  # ("format", name): every key in a key-cache format, after RoPE
        by_bits = ((section or {}).get("loss") or {}).get("by_bits") or {}
        found = by_bits if path[0] == "loss" else ((section or {}).get("formats") or {}).get("by_format") or {}
        base, value = as_float(by_bits.get("16")), as_float(found.get(path[1]))
        return (value - base) / base if base else math.nan
    layers = kv_layers(section, path)
    return float(np.nanmean(layers)) if np.isfinite(layers).any() else math.nan


def kv_series(res: dict, path: tuple[str, ...]) -> np.ndarray:
    """kv_value at each probe: from each probe record's section (kv_every_probe), else NaN, except the last probe
    when the run's end-of-training section was measured at its step."""
    probes = res.get("probes") or []
    out = np.array([kv_value(p.get(KV_CACHE), path) for p in probes], float)
    section, steps = res.get(KV_CACHE), res.get("steps") or []
    if section and out.size and steps and section.get("step") == steps[-1]:
        out[-1] = kv_value(section, path)
    return out


def layer_keys(runs: list[dict], field: str = "layer_pr") -> list[str]:
    """The layer keys of a per-layer field over several runs, in numeric order."""
    keys: set[str] = set()
    for r in runs:
        keys |= set((r.get(field) or {}).keys())
    return sorted(keys, key=lambda k: (int(k) if str(k).lstrip("-").isdigit() else math.inf, str(k)))


def tracked_scalars(record: dict) -> dict[str, float]:
    """The headline numbers of one probe record for an experiment tracker, by tag: "probe/mean_pr" and
    "<metric>/layer_<i>" for each of TRACKED_LAYER_MEANS the record holds (one chart per metric and layer)."""
    out = {"probe/mean_pr": as_float(record["mean_pr"])}
    for rec in record["layers"]:
        means = rec.get("means") or {}
        out.update({f"{name}/layer_{rec['layer']}": as_float(means[name]) for name in TRACKED_LAYER_MEANS
                    if name in means})
    return out
