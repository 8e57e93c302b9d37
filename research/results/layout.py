"""The study folder layout, and loading a whole study from it (no torch).

    <study>/study.json                              index: kind, seeds, preset, results files
    <study>/<condition>/results.json                one seed
    <study>/<condition>/seed_<s>/results.json       several seeds
    <study>/combined_results.json                   the pilot's combined file (the write-ups' format)

`load_study(folder)` recognises a study from its files: study.json (written by the study
runner) names the kind; otherwise combined_results.json means the pilot; otherwise
condition folders QK / QK_frozen / NoQK mean the three-condition study, as the
write-ups' own results folder is laid out.
"""
from __future__ import annotations

import json
from pathlib import Path

from research.results.schema import ResultsError, load_results
from research.results.vocabulary import (GRID_SEP, PILOT_COMBINED, QK_CONDITIONS, RESULTS_FILE, STUDY_INDEX,
                                         split_grid_key)
from utils.io import atomic_write_text, remove_matching, temp_file_pattern


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
    return sorted((study / condition).glob(f"seed_*/{RESULTS_FILE}"), key=lambda p: int(p.parent.name[5:]))


def write_study_index(study: Path, *, name: str, kind: str, seeds: list[int], preset: str,
                      conditions: dict[str, list[str]], margin: float, loss_margin: float) -> Path:
    """study.json: what split_panels needs to find the study's kind, results files and equivalence margins."""
    path = study / STUDY_INDEX
    remove_matching(study, temp_file_pattern(STUDY_INDEX))  # what a killed earlier write left
    atomic_write_text(path, json.dumps({"study": name, "kind": kind, "seeds": seeds, "preset": preset,
                                        "margin": margin, "loss_margin": loss_margin, "conditions": conditions},
                                       indent=2) + "\n")
    return path


def study_settings(folder: str | Path) -> dict:
    """study.json of a study folder as a dict ({} when there is none or it cannot be read)."""
    try:
        meta = json.loads((Path(folder) / STUDY_INDEX).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return meta if isinstance(meta, dict) else {}


def runs_from_combined(d: dict | str | Path) -> dict[str, list[dict]]:
    """Results-like dicts (one 'seed' per condition) from a pilot combined dict or its file."""
    if isinstance(d, (str, Path)):
        d = json.loads(Path(d).read_text())
    runs = {}
    for cond, e in d.items():
        if not isinstance(e, dict) or "tokens" not in e:
            continue  # metadata, not a condition
        n = len(e["tokens"])
        runs[cond] = [{"tag": e.get("tag", cond), "tokens": list(e["tokens"]),
                       "loss": list(e.get("train_loss", e.get("loss")) or [None] * n),
                       "val_loss": list(e.get("val_loss") or [None] * n),
                       "mean_pr": list(e.get("mean_pr") or [None] * n),
                       "layer_pr": dict(e.get("layer_pr") or {}), "gamma_cv": dict(e.get("gamma_cv") or {}),
                       "gamma_final": {}, "seed": None, "n_seeds": e.get("n_seeds", 1),
                       "seeds": e.get("seeds", [None])}]
    return runs


def load_study(folder: str | Path) -> tuple[str, dict[str, list[dict]]]:
    """(kind, runs) of a study folder: runs maps condition -> results dicts, one per seed."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: no such folder")
    index = folder / STUDY_INDEX
    if index.is_file():
        try:
            meta = json.loads(index.read_text())
            kind, conditions = meta["kind"], meta["conditions"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ResultsError(f"{index}: corrupted study index ({e}); delete it to fall back to the "
                               f"condition folders, or rerun the study") from e
        return kind, {c: [load_results(folder / p) for p in paths] for c, paths in conditions.items()}
    if (folder / PILOT_COMBINED).is_file():
        try:
            combined = json.loads((folder / PILOT_COMBINED).read_text())
        except json.JSONDecodeError as e:
            raise ResultsError(f"{folder / PILOT_COMBINED}: not valid JSON ({e})") from e
        return "pilot", runs_from_combined(combined)
    runs = {c: [load_results(p) for p in condition_results(folder, c)] for c in QK_CONDITIONS}
    runs = {c: r for c, r in runs.items() if r}
    if runs:
        return "qk_norm", runs
    raise ResultsError(f"{folder}: no study found. Expected {STUDY_INDEX} (written by the study scripts), "
                       f"{PILOT_COMBINED} (the pilot), or condition folders {', '.join(QK_CONDITIONS)} "
                       f"holding {RESULTS_FILE}")
