"""From a study folder's results to its figures, report.md and combined file. No torch.

Every study kind runs the same three steps: load the results (research.results), decide
(research.analysis), draw and write (research.plots). `render_study(folder)` is what the
study runner calls after training and what split_panels.py calls on any results folder.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from research.analysis import heads as heads_analysis
from research.analysis import keys as keys_analysis
from research.analysis import pilot as pilot_analysis
from research.analysis import qk_norm as qk_norm_analysis
from research.plots import heads as heads_plots
from research.plots import keys as keys_plots
from research.plots import pilot as pilot_plots
from research.plots import qk_norm as qk_norm_plots
from research.plots import qk_norm_report
from research.plots.common import save_figures
from research.results import ResultsError, save_results
from research.results.layout import load_study
from research.results.vocabulary import PILOT_COMBINED, QK_COMBINED, REPORT
from utils.io import atomic_write_text


def _write_report(folder: Path, text: str) -> Path:
    atomic_write_text(folder / REPORT, text)
    return folder / REPORT


def render_qk_norm(folder: Path, runs: dict) -> list[Path]:
    analysis = qk_norm_analysis.analyze(runs)
    paths = save_figures(folder, qk_norm_plots.figures(runs, analysis))
    paths.append(_write_report(folder, qk_norm_report.report(runs, analysis)))
    combined = {"study": "qk_norm", "conditions": sorted(runs), "summary": analysis.summary}
    atomic_write_text(folder / QK_COMBINED, json.dumps(combined, indent=2) + "\n")
    return paths + [folder / QK_COMBINED]


def render_pilot(folder: Path, runs: dict) -> list[Path]:
    analysis = pilot_analysis.analyze(runs)
    paths = save_figures(folder, pilot_plots.figures(analysis))
    paths.append(_write_report(folder, pilot_plots.report(analysis)))
    save_results(folder / PILOT_COMBINED, pilot_analysis.combined_from_runs(runs))
    return paths + [folder / PILOT_COMBINED]


def render_keys(folder: Path, runs: dict) -> list[Path]:
    analysis = keys_analysis.analyze(runs)
    return save_figures(folder, keys_plots.figures(analysis)) + [_write_report(folder, keys_plots.report(analysis))]


def render_heads(folder: Path, runs: dict) -> list[Path]:
    analysis = heads_analysis.analyze(runs)
    return save_figures(folder, heads_plots.figures(analysis)) + [_write_report(folder, heads_plots.report(analysis))]


# study kind (as study.json names it) -> how its results become figures and a report
KINDS: dict[str, Callable[[Path, dict], list[Path]]] = {
    "qk_norm": render_qk_norm, "pilot": render_pilot, "keys": render_keys, "heads": render_heads}


def render_study(folder: str | Path, out: str | Path | None = None) -> list[Path]:
    """Draw every figure and the report of the study in `folder` (into `out`, default the same
    folder); returns the files written."""
    kind, runs = load_study(folder)
    if kind not in KINDS:
        raise ResultsError(f"{Path(folder) / 'study.json'}: unknown study kind {kind!r} "
                           f"(known: {', '.join(KINDS)})")
    target = Path(out or folder)
    target.mkdir(parents=True, exist_ok=True)
    return KINDS[kind](target, runs)
