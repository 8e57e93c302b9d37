"""From a study folder's results to its figures, report.md, report.html and combined file. No torch.

Every kind runs the same steps (research.studies.kinds): load, decide, draw from the decisions alone, "In short"
first. `render_study(folder)` is what every study and split_panels.py call; `load_and_analyze(folder)` draws in memory:

    study = load_and_analyze("research_results/qk_norm_50m_study")
    study.analysis.verdict.text, study.report, study.figures["2_key_pr_causal.png"]

Nothing is written until every input validated and every output was built; then each is written atomically.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from configs.config import ConfigError
from research.analysis.identity import hosts_mixed
from research.analysis.rules import check_margin
from research.analysis.sequential import at_looks, family_changes, fixed_family, recorded, value_text
from research.plots.common import with_figures, write_outputs
from research.plots.in_short import with_in_short
from research.plots.looks import open_questions, section as looks_section
from research.results.layout import read_study_index
from research.results.vocabulary import REPORT
from research.studies.kinds import Kind, read, with_section
from utils.lock import FolderLock
from utils.owners import REDRAW, redraw_record, refuse_foreign


@dataclass(frozen=True)
class StudyView:
    """A study folder read, decided and drawn in memory, for a notebook (nothing is written)."""

    folder: Path
    kind: str  # its name in research.studies.kinds.KINDS
    inputs: Any  # what was read: condition -> [results dict per seed], or the study's own results file
    comparison: Any  # research.analysis.identity.Comparison: the runs decided, cut at one budget (None: one file)
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
    kind, inputs, comparison, analysis = decide_study(folder, index, margin, loss_margin)
    looks, design = recorded(index)
    with at_looks(looks, design):  # the report's words on its intervals follow its looks
        outputs = kind.draw(analysis, comparison)
        short, settle = kind.in_short(analysis), kind.settle(analysis)
    primary = kind.primary(analysis) if kind.primary else {}
    looks = looks_section(looks, design, primary, index.get("design"))
    if looks:
        outputs[REPORT] = with_section(outputs[REPORT], looks)
    questions = open_questions(kind.name, index, primary)
    if questions:
        outputs[REPORT] = outputs[REPORT].rstrip("\n") + "\n\n" + questions
    outputs[REPORT] = with_figures(with_in_short(outputs[REPORT], short, settle), outputs)  # the answer first
    return StudyView(Path(folder), kind.name, inputs, comparison, analysis, outputs, index)


def decide_study(folder: str | Path, index: dict, margin: float | None = None,
                 loss_margin: float | None = None) -> tuple[Kind, Any, Any, Any]:
    """(kind, inputs, comparison, analysis) of the study in `folder` whose checked study.json is `index`: decided at
    the looks it records (research.analysis.sequential.at_looks; one look at the full level where it records none),
    its runs' host kinds combined where it was made with --mix_hosts (research.analysis.identity.hosts_mixed),
    nothing drawn. A study planned with --until_decided is decided on the margins its design fixed: another `margin`
    or `loss_margin` is refused (ConfigError, one line)."""
    looks, design = recorded(index)
    if design is not None:
        given = {k: v for k, v in (("margin", margin), ("loss_margin", loss_margin)) if v is not None}
        changes = family_changes(fixed_family(index), {**fixed_family(index), **given})
        if changes:
            key, fixed, now = changes[0]
            raise ConfigError(f"--{key} {value_text(now)}: {folder} holds a study whose design fixed {key} "
                              f"{value_text(fixed)} at its first command, and its outcomes are read against that "
                              f"alone: leave --{key} out to draw it (nothing was written)")
    kind, inputs = read(Path(folder), index)
    with at_looks(looks, design), hosts_mixed(bool(index.get("mix_hosts"))):
        analysis, comparison = kind.decide(inputs, margin or index.get("margin"),
                                           loss_margin or index.get("loss_margin"))
    return kind, inputs, comparison, analysis


def render_study(folder: str | Path, out: str | Path | None = None, margin: float | None = None,
                 loss_margin: float | None = None) -> list[Path]:
    """Draw every figure and the report of the study in `folder` (into `out`, default the same folder);
    returns the files written. `margin` / `loss_margin`: the equivalence margins of key metrics and of
    losses, shares of the mean (default: those the study ran with, else research.analysis.rules').

    A drawing into another folder is a redraw of `folder` and marks it so (utils.owners' redraw.json, written
    first, with the rest): the folder is then that redraw's alone, and a run, a study or a redraw of another folder
    is refused there, naming it."""
    view = load_and_analyze(folder, margin, loss_margin)
    target = Path(out or folder)
    source = None if target.resolve() == Path(folder).resolve() else folder
    refuse_foreign(target, view.kind, f"the drawing of a {view.kind} study (split_panels.py)", redraw_of=source)
    with FolderLock(target, hint="pass --out to write the figures elsewhere"):
        marks = {} if source is None else {REDRAW: redraw_record(source, view.kind)}
        return write_outputs(target, {**marks, **view.outputs})
