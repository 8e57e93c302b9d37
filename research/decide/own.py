"""This project's own folders for qk-decide. A run folder (results.json of a probed run, or a train_llm.py run's
config.json and summary.json), or a folder of them (a condition per folder, seed_<n> folders per seed), is read as
runs: the final loss, validation loss, key PR (mean_pr, mean_pr_var) each holds, at its last step. A study folder
(study.json) of the QK-norm or conditions kind is decided as its study decides it (its families, margins and looks:
research.studies.render.decide_study), so qk-decide on it gives the very decisions its combined.json holds.

    runs = own_runs(folder, condition_key)          # [records.Run]
    rows, conditions = study_rows(folder)           # [compare.Compared] as the study decided them
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from research.analysis.rules import FINAL_FIELDS, final_value
from research.analysis.runs import PAIRED, Compared, DecideError, paired_t
from research.decide.records import Run
from research.results.read import seed_of
from utils.run_names import CONFIG, RESULTS, SUMMARY, is_own_run

STUDY_KINDS = ("qk_norm", "conditions")  # the kinds whose decisions are comparisons of conditions by seed
DEPTH = 3  # how deep below a folder run folders are looked for


def is_study(path: Path) -> bool:
    return path.is_dir() and (path / "study.json").is_file()


def run_folders(path: Path) -> list[Path]:
    """The run folders at or below `path` (DEPTH levels): those with a results.json, or a run's config and
    summary."""
    found = []
    for depth in range(DEPTH + 1):
        for p in sorted(path.glob("/".join(["*"] * depth))) if depth else [path]:
            if p.is_dir() and ((p / RESULTS).is_file() or (is_own_run(p) and (p / SUMMARY).is_file())):
                found.append(p)
    return found


def _read(path: Path) -> dict:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DecideError(f"{path} cannot be read ({type(e).__name__}). Fix: restore the run's files, or leave the "
                          f"run out") from None
    if not isinstance(d, dict):
        raise DecideError(f"{path} is not a run's file (not a JSON object). Fix: restore it, or leave the run out")
    return d


def _dotted(d: dict, key: str):
    for part in key.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def own_run(folder: Path, top: Path, condition_key: str | None = None):
    """One run folder as a records.Run: its condition is the config value at `condition_key` (dotted, e.g.
    model.qk_norm) where given and present, else its folder's path below `top` without a seed_<n> part; its seed the
    run's; its values those of FINAL_FIELDS it holds (a results.json's last probe, else summary.json's finals)."""
    if (folder / RESULTS).is_file():
        res = _read(folder / RESULTS)
        values = {f: final_value(res, f) for f in FINAL_FIELDS}
        config, seed, step = res.get("config") or {}, seed_of(res), res.get("steps")
        if isinstance(step, list):
            step = step[-1] if step else None
    else:
        summary, config = _read(folder / SUMMARY), _read(folder / CONFIG)
        values = {"loss": summary.get("final_loss"), "val_loss": summary.get("final_val_loss")}
        seed, step = (config.get("train") or {}).get("seed"), summary.get("steps")
    values = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    named = _dotted(config, condition_key) if condition_key else None
    rel = folder.relative_to(top).parts
    if rel and rel[-1].startswith("seed_"):
        rel = rel[:-1]
    condition = str(named) if named is not None else ("/".join(rel) or folder.name)
    return Run(condition, seed, values, step if isinstance(step, int) else None, str(folder))


def own_runs(path: Path, condition_key: str | None = None) -> list:
    folders = run_folders(path)
    if not folders:
        raise DecideError(f"{path} holds no run of this project (no results.json, or config.json with summary.json, "
                          f"within {DEPTH} folders). Fix: pass a run folder, a study folder or runs in a file")
    return [own_run(f, path, condition_key) for f in folders]


def study_rows(folder: Path) -> tuple[list[Compared], list[str]]:
    """The comparisons of a QK-norm or conditions study folder as its study decides them (decide_study: its own
    families, margins and looks), one Compared per quantity and pair, family named as the study names it."""
    from research.results.layout import read_study_index
    from research.studies.render import decide_study
    index = read_study_index(folder)
    if index.get("kind") not in STUDY_KINDS:
        raise DecideError(f"{folder} is a {index.get('kind')} study: qk-decide decides the {' and '.join(STUDY_KINDS)}"
                          f" studies as they decide; its own report holds its decisions (python research/"
                          f"split_panels.py {folder})")
    kind, _, _, analysis = decide_study(folder, index)
    rows = []
    for name, decisions in analysis.decisions.items():
        level = {d.ci_level for d in decisions.values() if d.tested}
        k = round(0.05 / (1 - level.pop())) if len(level) == 1 else None
        for (x, y), d in decisions.items():
            t, p1 = paired_t(d)
            rows.append(Compared(name, x, y, PAIRED, d, f"{name}: the study's family", t, p1, runs=(d.n, d.n),
                                 k=k))
    return rows, list(analysis.conditions if kind.name == "conditions" else sorted(analysis.runs))
