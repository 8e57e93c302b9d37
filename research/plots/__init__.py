"""Figures and reports of every study, drawn from results files alone (no torch).

`render_study(folder)` recognises the study in a folder, loads its results, and
writes its figures, report.md and combined file:

- study.json (written by research/studies.py) names the kind and the results files;
- otherwise combined_results.json means the QK vs NoQK pilot;
- otherwise condition folders QK / QK_frozen / NoQK holding results.json (or
  seed_<s>/results.json) mean the three-condition QK-norm study, as the write-ups'
  own results folder is laid out.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path

from research.results import ResultsError, load_results
from utils.io import atomic_write_text

KINDS = {"qk_norm": "research.plots.qk_norm", "pilot": "research.plots.pilot", "keys": "research.plots.keys",
         "heads": "research.plots.heads"}
QK_CONDITIONS = ("QK", "QK_frozen", "NoQK")


def condition_dir(out: Path, condition: str, seed: int, several_seeds: bool) -> Path:
    return out / condition / f"seed_{seed}" if several_seeds else out / condition


def _condition_results(folder: Path, condition: str) -> list[Path]:
    one = folder / condition / "results.json"
    if one.is_file():
        return [one]
    return sorted((folder / condition).glob("seed_*/results.json"), key=lambda p: int(p.parent.name[5:]))


def load_study(folder: str | Path) -> tuple[str, dict[str, list[dict]]]:
    """(kind, runs): runs maps condition -> list of results dicts, one per seed."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultsError(f"{folder}: no such folder")
    index = folder / "study.json"
    if index.is_file():
        try:
            meta = json.loads(index.read_text())
            kind, conditions = meta["kind"], meta["conditions"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ResultsError(f"{index}: corrupted study index ({e}); delete it to fall back to the "
                               f"condition folders, or rerun the study") from e
        if kind not in KINDS:
            raise ResultsError(f"{index}: unknown study kind {kind!r} (known: {', '.join(KINDS)})")
        return kind, {c: [load_results(folder / p) for p in paths] for c, paths in conditions.items()}
    if (folder / "combined_results.json").is_file():
        pilot = importlib.import_module(KINDS["pilot"])
        try:
            combined = json.loads((folder / "combined_results.json").read_text())
        except json.JSONDecodeError as e:
            raise ResultsError(f"{folder / 'combined_results.json'}: not valid JSON ({e})") from e
        return "pilot", pilot.runs_from_combined(combined)
    runs = {c: [load_results(p) for p in _condition_results(folder, c)] for c in QK_CONDITIONS}
    runs = {c: r for c, r in runs.items() if r}
    if runs:
        return "qk_norm", runs
    raise ResultsError(f"{folder}: no study found. Expected study.json (written by the study scripts), "
                       f"combined_results.json (the pilot), or condition folders {', '.join(QK_CONDITIONS)} "
                       f"holding results.json")


def render_study(folder: str | Path, out: str | Path | None = None) -> list[Path]:
    """Draw every figure and the report of the study in `folder` (into `out`, default the same
    folder); returns the files written."""
    kind, runs = load_study(folder)
    folder = Path(out or folder)
    folder.mkdir(parents=True, exist_ok=True)
    mod = importlib.import_module(KINDS[kind])
    written = list(mod.render(folder, runs))
    written.append(mod.write_report(folder, runs))
    if kind == "qk_norm":
        path = folder / "combined.json"
        atomic_write_text(path, json.dumps({"study": "qk_norm", "conditions": sorted(runs),
                                            "summary": mod.summary(runs)}, indent=2) + "\n")
        written.append(path)
    elif kind == "pilot":
        written.append(mod.write_combined(folder, runs))
    return written
