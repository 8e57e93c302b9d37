"""From a study folder's results to its figures, report.md and combined file. No torch.

Every study kind runs the same three steps: load the results (research.results), decide
(research.analysis), draw and write (research.plots). `render_study(folder)` is what the
study runner calls after training and what split_panels.py calls on any results folder.

Nothing is written until every results file has validated and every figure, report and
combined file has been built in memory; then, with the target folder locked (utils.lock),
each is written atomically, so a bad input or a crash never leaves half of the outputs new.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from research.analysis import heads as heads_analysis
from research.analysis import keys as keys_analysis
from research.analysis import lr as lr_analysis
from research.analysis import pilot as pilot_analysis
from research.analysis import qk_norm as qk_norm_analysis
from research.analysis.rules import LOSS_MARGIN, MARGIN
from research.plots import heads as heads_plots
from research.plots import keys as keys_plots
from research.plots import lr as lr_plots
from research.plots import pilot as pilot_plots
from research.plots import qk_norm as qk_norm_plots
from research.plots import qk_norm_report
from research.plots.common import write_outputs
from research.results import ResultsError
from research.results.layout import load_study, study_settings
from research.results.values import json_safe
from research.results.vocabulary import PILOT_COMBINED, QK_COMBINED, REPORT
from utils.lock import FolderLock


def _decision_json(d) -> dict:
    return json_safe({"n": d.n, "difference": d.diff, "relative": d.rel, "ci": list(d.ci), "ci_level": d.ci_level,
                      "ci90": list(d.ci90), "p_holm": d.p_holm, "margin": d.margin, "outcome": d.outcome,
                      "seeds_needed": d.seeds_needed})


def render_qk_norm(runs: dict, margin: float, loss_margin: float) -> dict:
    analysis = qk_norm_analysis.analyze(runs, margin, loss_margin)
    combined = {"study": "qk_norm", "conditions": sorted(runs), "margin": margin, "loss_margin": loss_margin,
                "summary": analysis.summary,
                "decisions": {field: {f"{x}-{y}": _decision_json(d) for (x, y), d in ds.items()}
                              for field, ds in analysis.decisions.items()},
                "verdict": analysis.verdict.text, "loss_verdict": analysis.loss_verdict.text,
                "claims": {k: {"claim": c.claim, "status": c.status} for k, c in analysis.claims.items()}}
    return {**qk_norm_plots.figures(runs, analysis), REPORT: qk_norm_report.report(runs, analysis),
            QK_COMBINED: combined}


def render_pilot(runs: dict, margin: float, loss_margin: float) -> dict:
    analysis = pilot_analysis.analyze(runs, margin, loss_margin)
    return {**pilot_plots.figures(analysis), REPORT: pilot_plots.report(analysis),
            PILOT_COMBINED: json_safe(pilot_analysis.combined_from_runs(runs))}


def render_keys(runs: dict, margin: float, loss_margin: float) -> dict:
    analysis = keys_analysis.analyze(runs, margin)
    return {**keys_plots.figures(analysis), REPORT: keys_plots.report(analysis)}


def render_heads(runs: dict, margin: float, loss_margin: float) -> dict:
    analysis = heads_analysis.analyze(runs, margin=margin)
    return {**heads_plots.figures(analysis), REPORT: heads_plots.report(analysis)}


def render_lr(runs: dict, margin: float, loss_margin: float) -> dict:
    analysis = lr_analysis.analyze(runs, margin, loss_margin)
    return {**lr_plots.figures(analysis), REPORT: lr_plots.report(analysis)}


# study kind (as study.json names it) -> how its results become figures and a report
# (runs, margin, loss_margin) -> {file name: Figure, report text or JSON-ready dict}, built in memory
KINDS: dict[str, Callable[[dict, float, float], dict]] = {
    "qk_norm": render_qk_norm, "pilot": render_pilot, "keys": render_keys, "heads": render_heads, "lr": render_lr}


def render_study(folder: str | Path, out: str | Path | None = None, margin: float | None = None,
                 loss_margin: float | None = None) -> list[Path]:
    """Draw every figure and the report of the study in `folder` (into `out`, default the same folder);
    returns the files written. `margin` / `loss_margin`: the equivalence margins of key metrics and of
    losses, shares of the mean (default: those the study ran with, else research.analysis.rules')."""
    kind, runs = load_study(folder)
    settings = study_settings(folder)
    margin = settings.get("margin", MARGIN) if margin is None else margin
    loss_margin = settings.get("loss_margin", LOSS_MARGIN) if loss_margin is None else loss_margin
    if kind not in KINDS:
        raise ResultsError(f"{Path(folder) / 'study.json'}: unknown study kind {kind!r} "
                           f"(known: {', '.join(KINDS)})")
    outputs = KINDS[kind](runs, margin, loss_margin)
    target = Path(out or folder)
    with FolderLock(target, hint="pass --out to write the figures elsewhere"):
        return write_outputs(target, outputs)
