"""results.json: one file per condition, a superset of the write-ups' schema.

The write-ups' fields keep their names and meanings, one entry per probe: tag, tokens, loss, val_loss, mean_pr,
layer_pr, gamma_cv and gamma_final. Beside them: schema/schema_version, config, preset, seed, provenance, data
hashes, steps, wall and probe times, `probes` (the per-layer, per-head records of research/probing/probe.py), and
after the last step gain_ablation and kv_cache. The file is rewritten whole, atomically, at step 0, before each
checkpoint and at the end (research.probing.callback). No torch here. Each field: docs/probing.md, "results.json".

`python -m research.results.schema --json_schema DIR` writes every declared format as JSON Schema (docs/schema/ holds
them) and `--schema_of FILE` names the one that validates FILE: docs/layout.md, "As JSON Schema".
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from utils.cli import ArgumentParser, command  # first: this module is a command too (--json_schema)

from research.results.checks import ShapeError, check_types
from research.results.file_errors import ResultsError, check_version  # here too: every reader's import of them
from research.results.values import json_safe, parse_json
from research.results.vocabulary import (KV_CACHE, LEGACY_ABLATION_MODES, PER_PROBE, PR, SCHEMA, SCHEMA_VERSION,
                                         WRITEUP_FIELDS)
from utils.errors import UserError, os_fix, os_problem, shown
from utils.io import atomic_write_text
from utils.owners import refuse_foreign


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

SCHEMA_FIX = "pass --json_schema a folder of its own, e.g. --json_schema docs/schema"


class SchemaFolderError(UserError):
    """--json_schema names no folder the JSON Schema files may be written into."""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description="Write the declared formats of this project's JSON and JSON-lines files as JSON "
                                   "Schema (draft 2020-12), for tools in other languages; or name the schema of one "
                                   "file.")
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--json_schema", metavar="DIR",
                     help="Folder of its own to write every schema file into (research.results.published: "
                          "results.schema.json, study.schema.json, one combined.<kind>.schema.json per kind of "
                          "combined.json, ...; made if missing, its schema files replaced); never a run's or a "
                          "study's folder")
    way.add_argument("--schema_of", metavar="FILE",
                     help="Print the name of the schema file that validates FILE (a study's combined.json: by "
                          "its folder's kind)")
    return p


def write_schemas(folder: str | Path) -> list[Path]:
    """Every schema file into `folder`, each atomically: refused (nothing written) when `folder` is empty text or
    another owner's (utils.owners); an error of the system names the schema file, never its temporary file."""
    from research.results.published import json_schemas  # declarations that import this module
    if not str(folder).strip():
        raise SchemaFolderError(f"--json_schema {str(folder)!r}: an empty folder name would write into the current "
                                f"folder; {SCHEMA_FIX} (nothing was written)")
    folder = Path(folder)
    refuse_foreign(folder, "schema", "python -m research.results.schema --json_schema", fix=SCHEMA_FIX)
    written = []
    for name, text in json_schemas().items():
        try:
            atomic_write_text(folder / name, text)
        except OSError as e:
            if e.filename is not None and Path(e.filename).name.startswith(f".{name}."):  # its temporary file's
                e.filename, e.filename2 = str(folder / name), None
            raise SchemaFolderError(f"cannot write {folder / name}: {os_problem(e)}; fix: {os_fix(e)}, or "
                                    f"{SCHEMA_FIX}") from None
        written.append(folder / name)
    return written


def schema_of(path: Path) -> str:
    """The schema file of the file at `path` (research.results.published.schema_for), or SchemaFolderError naming
    why there is none."""
    from research.results.published import schema_for
    name = schema_for(path.parent, path.name)
    if name is None:
        raise SchemaFolderError(f"{path}: no published schema for a file of this name in this folder (a "
                                f"combined.json is told by its folder's study.json); name a file this project writes")
    return name


@command
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.schema_of is not None:
        print(schema_of(Path(args.schema_of)))
        return
    for path in write_schemas(args.json_schema):
        print(path)


if __name__ == "__main__":
    main()
