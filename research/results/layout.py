"""The study folder layout, and loading a whole study from it (no torch).

    <study>/study.json                              index: kind, seeds, preset, margins, results files, looks
    <study>/<condition>/results.json                one seed
    <study>/<condition>/seed_<s>/results.json       several seeds
    <study>/combined_results.json                   the pilot's combined file (the write-ups' format)

`load_study(folder)` recognises a study from its files and loads every run, each file checked on every read
(`read_study_index`, `runs_from_combined`, `check_condition`). What each file holds, how a study is recognised and
what is checked: docs/layout.md, "Formats declared".
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from research.results.checks import found
from research.results.read import seed_of
from research.results.schema import ResultsError, load_results, validate
from research.results.study_formats import STUDY, grid_run
from research.results.values import parse_json
from research.results.vocabulary import (GRID_SEP, PILOT_COMBINED, QK_CONDITIONS, RESULTS_FILE, STUDY_INDEX,
                                         base_condition, split_grid_key)
from utils.errors import os_problem, shown
from utils.formats import FormatError, check
from utils.io import atomic_write_text, remove_matching, temp_file_pattern
from utils.owners import OWNERS

INDEX_FIX = "rerun the study or correct/delete study.json"
COMBINED_FIX = ("The file was damaged or edited: restore it from a copy, or run the pilot again "
                "(python research/qk_norm_500k_study.py)")
_SEED_DIR = re.compile(r"^seed_(-?\d+)$")


def condition_dir(study: Path, condition: str, seed: int, several_seeds: bool) -> Path:
    """<study>/<condition>[/seed_<s>]; a run of the learning-rate grid ('NoQK@4') is <study>/NoQK/lr_4[/seed_<s>]."""
    if GRID_SEP in condition:
        name, multiplier = split_grid_key(condition)
        condition = f"{name}/lr_{multiplier:g}"
    return study / condition / f"seed_{seed}" if several_seeds else study / condition


def condition_results(study: Path, condition: str) -> list[Path]:
    """The results files of one condition: the single-seed file, or every seed_<s> file in seed order."""
    one = study / condition / RESULTS_FILE
    if one.is_file():
        return [one]
    found_ = [(int(m.group(1)), p) for p in (study / condition).glob(f"seed_*/{RESULTS_FILE}")
              if (m := _SEED_DIR.match(p.parent.name))]
    return [p for _, p in sorted(found_)]


# ----------------------------------------------------------------------------- study.json

def _read_json(path: Path, what: str, fix: str):
    try:
        return parse_json(path.read_text())
    except OSError as e:
        raise ResultsError(f"{path}: cannot read the {what}: {os_problem(e)}; fix: {fix}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: corrupted {what}: not valid JSON ({e}), damaged or cut off; fix: {fix}") from e


def _within(folder: Path, path: Path) -> Path | None:
    """`path` with every link resolved when it stays inside `folder`; None when it leads out (or loops)."""
    try:
        try:  # strict: a link loop raises on every Python (3.13's non-strict resolve returns it unresolved)
            target = path.resolve(strict=True)
        except (FileNotFoundError, NotADirectoryError):  # not there: its reader says so
            target = path.resolve()
        return target if target.is_relative_to(folder.resolve()) else None
    except (OSError, RuntimeError):  # a link loop (3.11 raises RuntimeError, 3.13 OSError ELOOP)
        return None


def _check_paths(path: Path, folder: Path, cond: str, entries, seen: dict) -> list[Path]:
    """One condition's results files (a non-empty list of text, as STUDY declares): relative paths inside the
    study folder and inside the condition's own folder (a link leading out of the folder is refused too), none
    listed twice."""
    where = f"conditions.{cond}"
    own = condition_dir(Path(), cond, 0, several_seeds=False).parts
    out = []
    for i, entry in enumerate(entries):
        rel = Path(entry)
        key = None if rel.is_absolute() or ".." in rel.parts else _within(folder, folder / rel)
        if key is None:
            raise ResultsError(f"{path}: {where}[{i}]: {shown(entry)} leads outside the study folder {folder} (an "
                               f"absolute path, '..', or a link out or in a loop): a study reads only its own files; "
                               f"fix: {INDEX_FIX}")
        if rel.parts[:len(own)] != own:
            raise ResultsError(f"{path}: {where}[{i}]: {shown(entry)} is not in the condition's folder "
                               f"{Path(*own)}/: it would be analysed as {cond}; fix: {INDEX_FIX}")
        if key in seen:
            raise ResultsError(f"{path}: {where}[{i}]: {shown(entry)} is listed twice (also under conditions."
                               f"{seen[key]}): its run would count twice; fix: {INDEX_FIX}")
        seen[key] = cond
        out.append(folder / rel)
    return out




def check_study_index(meta, path: Path, folder: Path) -> dict:
    """The fields of a study.json, checked (STUDY) and typed: {path (of study.json), study, kind, seeds, preset,
    baseline, primary, looks, design, margin, loss_margin, logit_margin, kv_loss_margin (None where absent),
    mix_hosts (False where absent), conditions: {name: [results file paths under folder]}}. ResultsError names the
    field and the fix."""
    try:
        check(STUDY, meta)
    except FormatError as e:
        raise ResultsError(f"{path}: {e.text('expected')}; fix: {INDEX_FIX}") from e
    out: dict = {"path": path, **{k: meta.get(k) for k in ("study", "preset", "kind", "seeds", "baseline", "primary",
                                                           "looks", "design")}}
    out["mix_hosts"] = bool(meta.get("mix_hosts"))
    out.update({k: float(meta[k]) if k in meta else None
                for k in ("margin", "loss_margin", "logit_margin", "kv_loss_margin")})
    seen: dict = {}
    out["conditions"] = {cond: _check_paths(path, folder, cond, entries, seen)
                         for cond, entries in meta["conditions"].items()}
    return out


def read_study_index(folder: str | Path) -> dict:
    """study.json of a study folder, checked and typed (check_study_index); {} when the folder has none. Every
    reader of study.json goes through here, but the owner rule (utils.owners), which reads only its kind and name."""
    folder = Path(folder)
    path = folder / STUDY_INDEX
    if not path.is_file():
        return {}
    return check_study_index(_read_json(path, "study index", INDEX_FIX), path, folder)


def write_study_index(study: Path, *, name: str, kind: str, seeds: list[int], preset: str | None,
                      conditions: dict[str, list[str]], margin: float, loss_margin: float,
                      baseline: str | None = None, primary: tuple[str, ...] = (),
                      logit_margin: float | None = None, looks: list[dict] | None = None,
                      design: dict | None = None, kv_loss_margin: float | None = None,
                      mix_hosts: bool = False) -> Path:
    """study.json: what split_panels needs to find the study's kind, results files and equivalence margins, the
    looks taken at the study (`looks`, `design`: research.studies.looks), and whether it was made with --mix_hosts
    (research.studies.hosts). It is checked as every read checks it, so no index is written that a read would
    refuse."""
    path = study / STUDY_INDEX
    meta = {"study": name, "kind": kind, "seeds": seeds, "preset": preset, "margin": margin,
            "loss_margin": loss_margin, "conditions": conditions}
    if preset is None:  # a study of a pretrained model has no preset of this project
        del meta["preset"]
    if baseline is not None:  # a study file's condition the others are compared with (kind 'conditions')
        meta["baseline"] = baseline
    if primary:  # a study file's quantities read as one family
        meta["primary"] = list(primary)
    if logit_margin is not None:  # a study file's margin of the largest attention logit, in logits
        meta["logit_margin"] = logit_margin
    if kv_loss_margin is not None:  # a study file's margin of a loss change with quantized keys, a share of the loss
        meta["kv_loss_margin"] = kv_loss_margin
    if looks is not None:
        meta["looks"] = looks
    if design is not None:
        meta["design"] = design
    if mix_hosts:  # absent: one host kind, the others set aside (research.analysis.identity)
        meta["mix_hosts"] = True
    check_study_index(json.loads(json.dumps(meta)), path, study)
    remove_matching(study, temp_file_pattern(STUDY_INDEX))  # what a killed earlier write left
    atomic_write_text(path, json.dumps(meta, indent=2) + "\n")
    return path


def add_study_times(study: Path, record: dict) -> Path:
    """study.json with its time split (utils.time_split's record, summed over the study's runs) set, checked as
    write_study_index checks the whole."""
    path = study / STUDY_INDEX
    meta = {**_read_json(path, "study index", INDEX_FIX), "time_split": record}
    check_study_index(json.loads(json.dumps(meta)), path, study)
    atomic_write_text(path, json.dumps(meta, indent=2) + "\n")
    return path


# ----------------------------------------------------------------------------- combined_results.json

def _combined_entry(e: dict, cond: str, where: str) -> dict:
    """A results-like dict (one 'seed') from one condition of a combined file, checked as results.json is."""
    tokens = e["tokens"]
    n = len(tokens) if isinstance(tokens, list) else 0
    loss = e["train_loss"] if e.get("train_loss") is not None else e.get("loss")
    res = {"tag": e.get("tag", cond), "tokens": tokens,
           "loss": [None] * n if loss is None else loss,
           "val_loss": [None] * n if e.get("val_loss") is None else e["val_loss"],
           "mean_pr": [None] * n if e.get("mean_pr") is None else e["mean_pr"],
           "layer_pr": {} if e.get("layer_pr") is None else e["layer_pr"],
           "gamma_cv": {} if e.get("gamma_cv") is None else e["gamma_cv"],
           "gamma_final": {}, "seed": None, "n_seeds": 1 if e.get("n_seeds") is None else e["n_seeds"],
           "seeds": [None] if e.get("seeds") is None else e["seeds"]}
    validate(res, where, fix=COMBINED_FIX)
    return {**res, **{k: list(res[k]) for k in ("tokens", "loss", "val_loss", "mean_pr", "seeds")},
            **{k: {layer: list(v) for layer, v in res[k].items()} for k in ("layer_pr", "gamma_cv")}}


def runs_from_combined(d: dict | str | Path, path: str | Path = PILOT_COMBINED) -> dict[str, list[dict]]:
    """Results-like dicts (one 'seed' per condition) from a pilot combined dict or its file; every condition entry
    (an object with 'tokens') is checked as a results.json is, the message naming the file and the condition."""
    if isinstance(d, (str, Path)):
        path = Path(d)
        d = _read_json(path, "combined file", COMBINED_FIX)
    if not isinstance(d, dict):
        raise ResultsError(f"{path}: expected a JSON object of conditions, found {found(d)}. {COMBINED_FIX}")
    runs = {cond: [_combined_entry(e, cond, f"{path}: condition {shown(cond)}")] for cond, e in d.items()
            if isinstance(e, dict) and "tokens" in e}  # other entries: metadata, not conditions
    if not runs:
        raise ResultsError(f"{path}: no condition in it (an object with 'tokens' per probe): not a pilot's "
                           f"{PILOT_COMBINED}. {COMBINED_FIX}")
    return runs



# ----------------------------------------------------------------------------- the runs of a study

def _same_run(tag: str, condition: str) -> bool:
    """A file's tag names the run it is listed as: the same condition, and the same multiplier where both
    name one ('NoQK@4' in NoQK/lr_4/)."""
    a, b = grid_run(tag), grid_run(condition)
    if a and b:
        return a == b
    return base_condition(tag) == base_condition(condition)


def _n_layers(res: dict) -> int | None:
    probes = res.get("probes") or []
    return len(probes[0]["layers"]) if probes else None


def check_condition(condition: str, paths: list[Path], runs: list[dict]) -> None:
    """The runs of one condition, each loaded from its path: tagged as the condition, seeds as their folders say
    and none twice, one number of layers. ResultsError names the file, the field and the fix."""
    seeds: dict = {}
    layers: tuple | None = None
    folder = condition_dir(Path(), condition, 0, several_seeds=False)
    for path, res in zip(paths, runs):
        if not _same_run(res["tag"], condition):
            raise ResultsError(f"{path}: tag: the file is tagged {shown(res['tag'])} but sits in the folder of "
                               f"condition {shown(condition)} ({folder}/), as which it would be analysed; fix: move it "
                               f"to the folder of {shown(res['tag'])}, or train {condition} again into {folder}/")
        seed = seed_of(res)
        m = _SEED_DIR.match(path.parent.name)
        if seed is not None and m and int(m.group(1)) != seed:
            raise ResultsError(f"{path}: seed: the file says seed {seed} but sits in {path.parent.name}/; fix: move "
                               f"it to seed_{seed}/, or train that seed again")
        seed = int(m.group(1)) if seed is None and m else seed  # the folder's, as _folder_seed gives it
        if seed is not None and seed in seeds:
            raise ResultsError(f"{path}: seed: seed {seed} again ({seeds[seed]} is seed {seed} of {condition} too): "
                               f"the seed would count twice; fix: remove one of the two runs (and its study.json "
                               f"entry)")
        seeds[seed] = path
        n = _n_layers(res)
        if n is not None and layers is not None and n != layers[0]:
            raise ResultsError(f"{path}: probes: {n} layers per probe record, but {layers[1]} (also {condition}) has "
                               f"{layers[0]}: the seeds of a condition must train one model; fix: remove the odd "
                               f"run, or train it again with the condition's config")
        layers = layers or ((n, path) if n is not None else None)


def _inside(folder: Path, path: Path) -> Path:
    """`path`, which must not lead out of the study folder through a link."""
    if _within(folder, path) is None:
        raise ResultsError(f"{path}: leads outside the study folder {folder} through a link (or a link loop): a study "
                           f"reads only its own files; fix: replace the link by a copy of what it points to")
    return path


def _load_condition(condition: str, paths: list[Path], folder: Path | None = None) -> list[dict]:
    """The runs of one condition, checked (check_condition). `folder`: refuse a path that leads out of it through a
    link (the paths of a study.json were checked so when it was read)."""
    runs = [load_results(p if folder is None else _inside(folder, p)) for p in paths]
    check_condition(condition, paths, runs)
    return [_folder_seed(res, p) for res, p in zip(runs, paths)]


def _folder_seed(res: dict, path: Path) -> dict:
    """A run whose file names no seed takes the seed of the seed_<n> folder it sits in (recorded as
    `seed_from: "folder"`, never written back), so that it is paired by seed like any other run; a run with no
    seed either way stays unpaired (research.analysis.identity)."""
    m = _SEED_DIR.match(path.parent.name)
    if seed_of(res) is not None or not m:
        return res
    return {**res, "seed": int(m.group(1)), "seed_from": "folder"}


def _marked_by(file: str) -> str:
    """The study kind whose folders `file` marks, in the one table of kinds (utils.owners.OWNERS)."""
    return next(o.kind for o in OWNERS.values() if o.found_by == STUDY_INDEX and file in o.marks)


def load_study(folder: str | Path, index: dict | None = None) -> tuple[str, dict[str, list[dict]]]:
    """(kind, runs) of a study folder: runs maps condition -> results dicts, one per seed. `index`: the folder's
    study.json as read_study_index returned it, for a caller that has read it already (None: read it here)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: no such folder")
    if index is None:
        index = read_study_index(folder)
    if index:
        for cond, paths in index["conditions"].items():
            for p in paths:
                if not p.is_file():
                    raise ResultsError(f"{index['path']}: conditions.{cond}: lists {p.relative_to(folder)}, which "
                                       f"does not exist; fix: {INDEX_FIX}")
        return index["kind"], {c: _load_condition(c, paths) for c, paths in index["conditions"].items()}
    if (folder / PILOT_COMBINED).is_file():
        return _marked_by(PILOT_COMBINED), runs_from_combined(_inside(folder, folder / PILOT_COMBINED))
    runs = {c: _load_condition(c, paths, folder) for c in QK_CONDITIONS if (paths := condition_results(folder, c))}
    if runs:
        return "qk_norm", runs
    raise ResultsError(f"{folder}: no study found. Expected {STUDY_INDEX} (written by the study scripts), "
                       f"{PILOT_COMBINED} (the pilot), or condition folders {', '.join(QK_CONDITIONS)} "
                       f"holding {RESULTS_FILE}")
