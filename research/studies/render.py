"""From a study folder's results to its figures, report.md and combined file. No torch.

Every study kind runs the same three steps: load the results (research.results), decide
(research.analysis), draw and write (research.plots). `render_study(folder)` is what the
study runner calls after training and what split_panels.py calls on any results folder;
`load_and_analyze(folder)` does the first two and draws in memory, for a notebook:

    study = load_and_analyze("research_results/qk_norm_50m_study")
    study.analysis.verdict.text, study.report, study.figures["2_key_pr_causal.png"]

Nothing is written until every results file has validated and every figure, report and
combined file has been built in memory; then, with the target folder locked (utils.lock),
each is written atomically, so a bad input or a crash never leaves half of the outputs new.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from matplotlib.figure import Figure

from research.analysis import finetune as finetune_analysis
from research.analysis import heads as heads_analysis
from research.analysis import keys as keys_analysis
from research.analysis import lr as lr_analysis
from research.analysis import pilot as pilot_analysis
from research.analysis import qk_norm as qk_norm_analysis
from research.analysis.rules import LOSS_MARGIN, MARGIN, check_margin
from research.plots import finetune as finetune_plots
from research.plots import heads as heads_plots
from research.plots import keys as keys_plots
from research.plots import lr as lr_plots
from research.plots import pilot as pilot_plots
from research.plots import qk_norm as qk_norm_plots
from research.plots import qk_norm_report
from research.plots.common import write_outputs
from research.results.layout import load_study, read_study_index, refuse_others_results
from research.results.values import json_safe
from research.results.vocabulary import PILOT_COMBINED, QK_COMBINED, REPORT
from utils.lock import FolderLock


def _decision_json(d) -> dict:
    return json_safe({"n": d.n, "difference": d.diff, "relative": d.rel, "ci": list(d.ci), "ci_level": d.ci_level,
                      "p": d.p, "p_bonferroni": d.p_adj, "margin": d.margin, "outcome": d.outcome,
                      "seeds_needed": d.seeds_needed})


def draw_qk_norm(runs: dict, analysis, margin: float, loss_margin: float) -> dict:
    combined = {"study": "qk_norm", "conditions": sorted(runs), "margin": margin, "loss_margin": loss_margin,
                "summary": analysis.summary,
                "decisions": {field: {f"{x}-{y}": _decision_json(d) for (x, y), d in ds.items()}
                              for field, ds in analysis.decisions.items()},
                "verdict": analysis.verdict.text, "verdict_pr_var": analysis.verdict_pr_var.text,
                "loss_verdict": analysis.loss_verdict.text, "train_loss_verdict": analysis.train_loss_verdict.text,
                "claims": {k: {"claim": c.claim, "status": c.status} for k, c in analysis.claims.items()}}
    return {**qk_norm_plots.figures(runs, analysis), REPORT: qk_norm_report.report(runs, analysis),
            QK_COMBINED: combined}


def draw_pilot(runs: dict, analysis, margin: float, loss_margin: float) -> dict:
    return {**pilot_plots.figures(analysis), REPORT: pilot_plots.report(analysis),
            PILOT_COMBINED: json_safe(pilot_analysis.combined_from_runs(runs))}


@dataclass(frozen=True)
class Kind:
    """How one kind of study decides and draws."""

    analyze: Callable[[dict, float, float], Any]  # (runs, margin, loss_margin) -> its research.analysis result
    draw: Callable[[dict, Any, float, float], dict]  # (runs, analysis, margins) -> {file: Figure, text or dict}


# study kind (as study.json names it) -> how its results become decisions, figures and a report, in memory
KINDS: dict[str, Kind] = {
    "qk_norm": Kind(qk_norm_analysis.analyze, draw_qk_norm),
    "pilot": Kind(pilot_analysis.analyze, draw_pilot),
    "keys": Kind(lambda runs, margin, loss_margin: keys_analysis.analyze(runs, margin),
                 lambda runs, an, margin, loss_margin: {**keys_plots.figures(an), REPORT: keys_plots.report(an)}),
    "heads": Kind(lambda runs, margin, loss_margin: heads_analysis.analyze(runs, margin=margin),
                  lambda runs, an, margin, loss_margin: {**heads_plots.figures(an), REPORT: heads_plots.report(an)}),
    "lr": Kind(lr_analysis.analyze,
               lambda runs, an, margin, loss_margin: {**lr_plots.figures(an), REPORT: lr_plots.report(an)}),
    "finetune": Kind(finetune_analysis.analyze,
                     lambda runs, an, margin, loss_margin: {**finetune_plots.figures(an),
                                                            REPORT: finetune_plots.report(runs, an)}),
}  # the same kinds as research.results.vocabulary.STUDY_KINDS, which a study.json is checked against


@dataclass(frozen=True)
class StudyView:
    """A study folder read, decided and drawn in memory, for a notebook (nothing is written)."""

    folder: Path
    kind: str  # qk_norm, pilot, keys, heads or lr
    runs: dict  # condition -> [results dict per seed]
    analysis: Any  # the decisions of research.analysis, e.g. QkNormAnalysis (its .verdict.text, .decisions, ...)
    outputs: dict  # file name -> Figure, report text or JSON-ready dict: what render_study writes
    index: dict  # its study.json, checked (research.results.layout.read_study_index); {} when it has none

    @property
    def figures(self) -> dict[str, Figure]:
        return {name: item for name, item in self.outputs.items() if isinstance(item, Figure)}

    @property
    def report(self) -> str:
        return self.outputs[REPORT]


def load_and_analyze(folder: str | Path, margin: float | None = None,
                     loss_margin: float | None = None) -> StudyView:
    """Load the study in `folder`, decide and draw it in memory. `margin` / `loss_margin`: the equivalence
    margins of key metrics and of losses, shares of the mean (default: those the study ran with, else
    research.analysis.rules'). ResultsError names a file that cannot be used."""
    margin = None if margin is None else check_margin("margin", margin)
    loss_margin = None if loss_margin is None else check_margin("loss_margin", loss_margin)
    index = read_study_index(folder)  # read once; checked: its margins are shares of the mean in (0, 1), or None
    kind, runs = load_study(folder, index)  # kind: one of STUDY_KINDS, all of them in KINDS
    margin = margin or index.get("margin") or MARGIN
    loss_margin = loss_margin or index.get("loss_margin") or LOSS_MARGIN
    analysis = KINDS[kind].analyze(runs, margin, loss_margin)
    return StudyView(Path(folder), kind, runs, analysis, KINDS[kind].draw(runs, analysis, margin, loss_margin), index)


def render_study(folder: str | Path, out: str | Path | None = None, margin: float | None = None,
                 loss_margin: float | None = None) -> list[Path]:
    """Draw every figure and the report of the study in `folder` (into `out`, default the same folder);
    returns the files written. `margin` / `loss_margin`: the equivalence margins of key metrics and of
    losses, shares of the mean (default: those the study ran with, else research.analysis.rules')."""
    view = load_and_analyze(folder, margin, loss_margin)
    target = Path(out or folder)
    with FolderLock(target, hint="pass --out to write the figures elsewhere"):
        if target.resolve() != Path(folder).resolve():  # another folder: never one holding others' results
            refuse_others_results(target, "split_panels.py", study=view.index.get("study"))
        return write_outputs(target, view.outputs)
