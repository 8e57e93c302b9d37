"""results.json: one file per condition, a superset of the write-ups' schema.

The write-ups' fields keep their names and meanings, one entry per probe:

    tag          condition name ("QK", "QK_frozen", "NoQK", ...)
    tokens       [training tokens seen at each probe]
    loss         [mean training loss over the last probe_every steps, i.e. since the previous
                  probe; a short final window reaches back to the same length] (None at step 0)
    val_loss     [validation loss at the probe] (None at step 0)
    mean_pr      [mean over layers of pr_sv of the k_norm keys]
    layer_pr     {layer: [pr_sv of the layer (mean over KV heads) per probe]}
    gamma_cv     {layer: [coefficient of variation of the k_norm gain per probe]}  (QK-norm conditions)
    gamma_final  {layer: [D gain values at the last probe]}                        (learned gain only)

Beside them: schema/schema_version, config, preset, seed, provenance (git commit,
versions, device), data hashes, steps, wall times, probe times, and `probes`: the
full per-layer, per-head records of research/probing/probe.py; after the last step the gain ablation
(gain_ablation) and what a key cache costs (kv_cache, research/probing/kv_cache.py). The file is rewritten
whole, atomically, at step 0, before each checkpoint and at the end (research.probing.callback). No torch here.

`python -m research.results.schema --json_schema DIR` writes the declared formats of results.json, study.json and
the QK-norm study's combined.json as JSON Schema files (docs/schema/ holds them, kept current by a test), for tools
in other languages.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from utils.cli import ArgumentParser, command  # first: this module is a command too (--json_schema)

from research.results.checks import RESULTS, ShapeError, check_types, is_integer
from research.results.study_formats import QK_COMBINED_FORMAT, STUDY
from research.results.values import json_safe, parse_json
from research.results.vocabulary import (KV_CACHE, LEGACY_ABLATION_MODES, PER_PROBE, PR, SCHEMA, SCHEMA_VERSION,
                                         WRITEUP_FIELDS)
from utils.errors import UserError, os_fix, os_problem, shown
from utils.formats import json_schema
from utils.io import atomic_write_text


class ResultsError(UserError, ValueError):
    """A results file that cannot be used; the message names the file, the problem and the fix."""


def new_results(tag: str, *, config: dict | None = None, preset: str | None = None, seed: int | None = None,
                provenance: dict | None = None, data: dict | None = None) -> dict:
    return {"tag": tag, "tokens": [], "loss": [], "val_loss": [], "mean_pr": [], "layer_pr": {}, "gamma_cv": {},
            "gamma_final": {}, "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "config": config,
            "preset": preset, "seed": seed, "provenance": provenance or {}, "data": data or {},
            "steps": [], "wall_time_s": [], "probe_time_s": [], "probes": []}


def add_probe(res: dict, record: dict, *, step: int, tokens: int, loss: float | None, val_loss: float | None,
              wall_time_s: float, qk_norm: str) -> None:
    """Append one probe record (research.probing.probe.KeyProbe output) to `res` in place."""
    res["steps"].append(step)
    res["tokens"].append(tokens)
    res["loss"].append(loss)
    res["val_loss"].append(val_loss)
    res["mean_pr"].append(record["mean_pr"])
    res["wall_time_s"].append(wall_time_s)
    res["probe_time_s"].append(record["probe_time_s"])
    for layer in record["layers"]:
        key = str(layer["layer"])
        res["layer_pr"].setdefault(key, []).append(layer["means"][PR])
        if qk_norm != "none" and layer["gamma_k"] is not None:
            res["gamma_cv"].setdefault(key, []).append(layer["gamma_k"]["cv"])
        if qk_norm == "learned" and layer["gamma_k"] is not None:
            res["gamma_final"][key] = layer["gamma_k"]["values"]
    res["probes"].append({"step": step, "tokens": tokens, **record})


def _keep_probes(res: dict, keep: list[int], last_step: float, undated: float) -> dict:
    """`res` with only the probes at indices `keep`. A gain ablation or key cache section measured after `last_step`
    (one without a step counts as measured at `undated`) is dropped; gamma_final is read again from the last probe
    kept (dropped when there are no probe records to read it from)."""
    out = dict(res)
    for k in (*PER_PROBE, "steps", "wall_time_s", "probe_time_s", "probes"):
        if k in res:
            out[k] = [res[k][i] for i in keep if i < len(res[k])]
    for k in ("layer_pr", "gamma_cv"):
        out[k] = {layer: [v[i] for i in keep if i < len(v)] for layer, v in (res.get(k) or {}).items()}
    for section in ("gain_ablation", KV_CACHE):
        if (res.get(section) or {}).get("step", undated) > last_step:  # measured after the last probe kept
            out.pop(section, None)
    if "alarms" in res:  # the spike alarm's, up to the last step kept
        out["alarms"] = [a for a in res["alarms"] if a["step"] <= last_step]
    if out.get("probes") and out.get("gamma_final"):
        out["gamma_final"] = {str(r["layer"]): r["gamma_k"]["values"] for r in out["probes"][-1]["layers"]
                              if r.get("gamma_k") is not None}
    elif out.get("gamma_final") and len(keep) < len(res["tokens"]):
        out["gamma_final"] = {}  # the gains at the run's end, which no longer is the last probe kept
    return out


def truncate(res: dict, step: int) -> dict:
    """Keep only probes taken at or before `step` (a resumed run redoes the rest)."""
    return _keep_probes(res, [i for i, s in enumerate(res.get("steps", [])) if s <= step], step, undated=0)


def cut_at_tokens(res: dict, tokens: float) -> dict:
    """Keep only probes taken at or before `tokens` training tokens: a run compared with others at a budget they
    all reached (research.analysis.identity). The run itself is returned when nothing is cut."""
    keep = [i for i, t in enumerate(res["tokens"]) if t is not None and t <= tokens]
    if len(keep) == len(res["tokens"]):
        return res
    steps = res.get("steps") or []
    last_step = steps[keep[-1]] if keep and keep[-1] < len(steps) else -math.inf
    return _keep_probes(res, keep, last_step, undated=math.inf)


def save_results(path: str | Path, res: dict) -> None:
    """Write any JSON-ready dict atomically, NaN and infinities as null."""
    atomic_write_text(path, json.dumps(json_safe(res), indent=1) + "\n")


def mark_diverged(path: str | Path, step: int) -> None:
    """Record in a run's results.json that training stopped at `step` on a non-finite loss (a result of
    the learning-rate study, not an error)."""
    res = load_results(path)
    res["diverged"] = {"step": step}
    save_results(path, res)


def diverged_at(path: str | Path) -> int | None:
    """The step a run diverged at, from its results.json (None: it did not, or there is no file yet)."""
    if not Path(path).is_file():
        return None
    return (load_results(path).get("diverged") or {}).get("step")


DAMAGED = "The file was damaged or edited: restore it from a copy, or train that condition again"


def check_version(res: dict, path: str | Path, version: int = SCHEMA_VERSION, key: str = "schema_version") -> None:
    """Refuse a file written by a newer version of this project (older versions and none at all are read): the one
    answer for every versioned file (results.json's `schema_version`, the studies' `version`), never "run again",
    which would overwrite it. `key`: the field holding the file's version."""
    found = res.get(key)
    if is_integer(found) and found > version:
        raise ResultsError(f"{path}: {key}: written by a newer version of this project ({key} {found} > {version}, "
                           f"the newest this code reads): update the code (git pull) to read it")


def validate(res, path: str | Path = "<results>", fix: str = DAMAGED) -> dict:
    """Check a loaded results dict; fill optional fields; raise ResultsError naming the problem. `path` starts
    every message (the file, and where in it when the dict is one entry of a larger file), `fix` ends a
    message about a damaged field."""
    if not isinstance(res, dict):
        raise ResultsError(f"{path}: expected a JSON object, found {type(res).__name__}; this is not a results.json")
    check_version(res, path)
    missing = [k for k in ("tag", *PER_PROBE, "layer_pr") if k not in res]
    if missing:
        raise ResultsError(f"{path}: missing field(s) {', '.join(missing)}; not a results.json of this project "
                           f"or of the write-ups (expected at least {', '.join(WRITEUP_FIELDS[:6])})")
    if res.get("schema", SCHEMA) != SCHEMA:
        raise ResultsError(f"{path}: schema {shown(res['schema'], 40)} is not {SCHEMA!r}: not a results file of this "
                           f"project; point the reader at a results.json")
    if not isinstance(res["tokens"], list):
        raise ResultsError(f"{path}: field 'tokens' should be a list (one value per probe), found "
                           f"{type(res['tokens']).__name__}. {fix}")
    try:
        check_types(res, len(res["tokens"]))
    except ShapeError as e:
        raise ResultsError(f"{path}: {e}. {fix}") from e
    res.setdefault("gamma_cv", {})
    res.setdefault("gamma_final", {})
    res["gamma_cv"] = res["gamma_cv"] or {}
    res["gamma_final"] = res["gamma_final"] or {}
    res.setdefault("probes", [])
    ablation = res.get("gain_ablation")
    for old, new in LEGACY_ABLATION_MODES.items():  # older files ablated the k gain only, as "ones" / "mean"
        if ablation and old in ablation and new not in ablation:
            ablation[new] = ablation.pop(old)
    return res


def load_results(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ResultsError(f"{path}: no such results file")
    try:
        res = parse_json(path.read_text())
    except OSError as e:
        raise ResultsError(f"{path}: cannot read it: {os_problem(e)}. Fix: {os_fix(e, reading=True)}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not valid JSON ({e}); the file is corrupted or was cut off. Restore it from "
                           f"a copy, or train that condition again into an empty folder") from e
    return validate(res, path)


# ----------------------------------------------------------------------------- the formats as JSON Schema

_GENERATED = ("Generated from {source} by `python -m research.results.schema --json_schema DIR`: do not edit. "
              "{what} What JSON Schema cannot say (lengths given by other fields, checks across fields) is named in "
              "'$comment's and checked by the project's reader only.")
JSON_SCHEMAS = {  # file -> (declaration, title, where it is declared, what the file is)
    "results.schema.json": (RESULTS, "results.json", "research/results/checks.py:RESULTS",
                            "One run's key probe: one value per probe in every per-probe list."),
    "study.schema.json": (STUDY, "study.json", "research/results/study_formats.py:STUDY",
                          "A study folder's index: its kind, seeds, margins and each condition's results files."),
    "combined.schema.json": (QK_COMBINED_FORMAT, "combined.json", "research/results/study_formats.py:"
                             "QK_COMBINED_FORMAT", "The numbers of the QK-norm study's report."),
}


def json_schemas() -> dict[str, str]:
    """Each JSON Schema file's text, by file name, generated from the declarations."""
    return {name: json.dumps(json_schema(spec, title, _GENERATED.format(source=source, what=what)), indent=1) + "\n"
            for name, (spec, title, source, what) in JSON_SCHEMAS.items()}


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description="Write the declared formats of this project's results files as JSON Schema "
                                   "(draft 2020-12), for tools in other languages.")
    p.add_argument("--json_schema", metavar="DIR", required=True,
                   help=f"Folder to write {', '.join(JSON_SCHEMAS)} into (made if missing; files replaced). Required")
    return p


@command
def main(argv: list[str] | None = None) -> None:
    folder = Path(build_parser().parse_args(argv).json_schema)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in json_schemas().items():
        atomic_write_text(folder / name, text)
        print(folder / name)


if __name__ == "__main__":
    main()
