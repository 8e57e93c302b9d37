"""The one registry of study kinds: how each kind's folder is read, decided, drawn and written. No torch.

A kind is one record (`Kind`): `load` reads its folder's inputs, `compare` says which runs may be compared
(research.analysis.identity), `analyze` decides them, and from that analysis alone `figures`, `report`, `in_short` and
`combined` build what is written; research.studies.render runs these steps for any folder. A kind is found from its
study.json or its own results file (`found_by`); what its folder is lives in utils.owners.OWNERS (`Kind.owner`).
Each entry names its analysis and plots by module (`OnDemand`), imported at first call, so a study loads its own
kind's alone (tests/test_import_closure.py). Adding a kind: docs/layout.md, "Study kinds".
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from configs.config import ConfigError
from research.analysis.identity import Comparison, compare
from research.analysis.rules import LOSS_MARGIN, MARGIN
from research.analysis.wording import inline_open, settle_line
from research.results import ResultsError
from research.results.layout import INDEX_FIX, load_study
from research.results.values import json_safe
from research.results.vocabulary import METRICS_FILE, PILOT_COMBINED, QK_COMBINED, REPORT, REPORT_PAGE
from utils.owners import OWNERS, STUDY_INDEX, Owner, owned_file


def _no_combined(analysis) -> dict:
    return {}


def _no_short(analysis) -> list[str]:
    return []


def _seeds_settle(analysis) -> str:
    return settle_line("seed")


def nothing_to_pair(inputs) -> None:
    """A kind that measures one model or one run from one file: it pairs text batches or checkpoints within that
    file, and has no runs to pair."""
    return None


def with_section(report: str, section: str) -> str:
    """`report` with `section` placed after its title and opening paragraph."""
    blocks = report.split("\n\n")
    at = 2 if len(blocks) > 2 and not blocks[1].startswith("#") else 1
    return "\n\n".join([*blocks[:at], section.rstrip("\n"), *blocks[at:]])


@dataclass(frozen=True)
class OnDemand:
    """The function `name` of the module at dotted path `module` (a kind's reader, analysis or plots), imported at
    its first call: importing the registry loads no kind's decisions or figures, a study loads those of its own kind."""

    module: str
    name: str

    def __call__(self, *args, **kwargs):
        return getattr(importlib.import_module(self.module), self.name)(*args, **kwargs)


def _analysis(module: str, name: str = "analyze") -> OnDemand:
    return OnDemand(f"research.analysis.{module}", name)


def _plots(module: str, name: str) -> OnDemand:
    return OnDemand(f"research.plots.{module}", name)


def _plots_value(module: str, name: str):
    """A constant of a kind's plots module (its figures' names), imported where first asked."""
    return getattr(importlib.import_module(f"research.plots.{module}"), name)


@dataclass(frozen=True)
class Kind:
    """One kind of study, from its folder to the files it writes."""

    name: str  # as study.json's "kind" names it
    load: Callable[[Path, dict], Any]  # (folder, its checked study.json or {}) -> the inputs analyze decides
    analyze: Callable[[Any, float | None, float | None], Any]  # (inputs, margin, loss_margin; None: the
    #   kind's default, the one its inputs ran with) -> a frozen dataclass of research.analysis
    figures: Callable[[Any], dict]  # (analysis) -> {file name: Figure}
    report: Callable[[Any], str]  # (analysis) -> report.md
    outputs: Callable[[list[str]], list[str]]  # (conditions) -> the names of the files it writes, in order
    combined: Callable[[Any], dict] = _no_combined  # (analysis) -> {file name: JSON-ready dict}
    compare: Callable[[Any], Comparison | None] = compare  # (inputs) -> the runs to decide and why, or None
    # (analysis) -> {label: Decision}: the comparisons a study of this kind adds seeds for while one is undecided
    # (--until_decided, research.studies.looks); None: nothing to decide, the option is refused with `no_primary`
    primary: Callable[[Any], dict] | None = None
    no_primary: str = ""  # why a kind without primary comparisons cannot add seeds by looks (else: nothing to decide)
    named_primary: bool = False  # its primary comparisons are the study's own (a study file's `primary:`), if any
    # (analysis) -> the lines of its report's "In short" (research.plots.in_short): each primary question with its
    # outcome, effect, interval and family, or, for a kind that decides nothing, its main measured numbers
    in_short: Callable[[Any], list[str]] = _no_short
    # (analysis) -> the one line on what would settle an outcome its report leaves open (wording.settle_line)
    settle: Callable[[Any], str] = _seeds_settle

    @property
    def owner(self) -> Owner:
        """Its record in the one table of kinds (utils.owners.OWNERS): how its folder is recognised, the files that
        mark its folders, those it also writes, who it is for people, whether its runs are a grid; every writer's
        folder check reads it there."""
        return OWNERS[self.name]

    @property
    def found_by(self) -> str | None:
        """The results file that marks a folder of this kind, where no study.json names it (its table record's)."""
        return None if self.owner.found_by == STUDY_INDEX else self.owner.found_by

    def decide(self, inputs, margin: float | None, loss_margin: float | None) -> tuple[Any, Comparison | None]:
        """(the analysis, the comparison it rests on): the runs `compare` keeps, decided by `analyze`."""
        comparison = self.compare(inputs)
        return self.analyze(inputs if comparison is None else comparison.runs, margin, loss_margin), comparison

    def draw(self, analysis, comparison: Comparison | None = None) -> dict:
        """{file name: Figure, report text or JSON-ready dict}: everything the kind writes, in memory."""
        report = self.report(analysis)
        if comparison is not None:
            report = with_section(report, comparison.section())
        return {**self.figures(analysis), REPORT: report, **self.combined(analysis)}


# ---------------------------------------------------------------------------------- kinds of trained runs

def _runs(folder: Path, index: dict) -> dict:
    return load_study(folder, index)[1]


def _margins(analyze, with_loss: bool = True):
    """An analyze of runs with the project's margins where a study gives none."""
    def run(runs: dict, margin: float | None, loss_margin: float | None):
        margin = MARGIN if margin is None else margin
        if with_loss:
            return analyze(runs, margin=margin, loss_margin=LOSS_MARGIN if loss_margin is None else loss_margin)
        return analyze(runs, margin=margin)
    return run


def _decision_json(d) -> dict:
    """A Decision as combined.json keeps it: `on` says whether it was decided on per-seed differences or log ratios
    (then ci, margin and log_ratio are log ratios, relative and relative_ci the ratio minus 1, difference the mean
    difference in units); per_seed as the report's column shows it, in `seeds` order, and outliers as positions in
    per_seed (a seed may be unknown, or a name)."""
    marks = d.outliers
    seeds = list(d.seeds) if d.seeds is not None and len(d.seeds) == len(d.values) else None
    return json_safe({"n": d.n, "difference": d.diff, "relative": d.rel, "ci": list(d.ci), "ci_level": d.ci_level,
                      "p": d.p, "p_bonferroni": d.p_adj, "margin": d.margin, "outcome": d.outcome, "on": d.on,
                      "log_ratio": d.log_mean, "relative_ci": list(d.ci_rel), "seeds": seeds,
                      "per_seed": list(d.per_seed),
                      "outliers": [i for i, m in enumerate(marks) if m], "note": d.note})


def _qk_norm_combined(analysis) -> dict:
    return {QK_COMBINED: {
        "study": "qk_norm", "conditions": sorted(analysis.runs), "margin": analysis.margin,
        "loss_margin": analysis.loss_margin, "summary": analysis.summary,
        "decisions": {name: {f"{x}-{y}": _decision_json(d) for (x, y), d in decisions.items()}
                      for name, decisions in analysis.decisions.items()},
        **{key: inline_open(v.text) for key, v in (  # a JSON reader has no In short: the route inline
            ("verdict", analysis.verdict), ("verdict_pr_var", analysis.verdict_pr_var),
            ("loss_verdict", analysis.loss_verdict), ("train_loss_verdict", analysis.train_loss_verdict))},
        "claims": {k: {"claim": c.claim, "status": c.status} for k, c in analysis.claims.items()}}}


def _conditions_combined(analysis) -> dict:
    return {QK_COMBINED: {
        "study": "conditions", "conditions": analysis.conditions, "baseline": analysis.baseline,
        "primary": list(analysis.primary), "margin": analysis.margin, "loss_margin": analysis.loss_margin,
        "logit_margin": analysis.logit_margin, "kv_loss_margin": analysis.kv_loss_margin,
        "family_k": analysis.family_k,
        "tokens": json_safe(analysis.budget_tokens), "summary": json_safe(analysis.summary),
        "decisions": {q: {f"{x}-{y}": {**_decision_json(d), "margin_share": d.share,
                                       "reference": analysis.reference((x, y)),
                                       "of_reference": json_safe(analysis.of_reference((x, y), d))}
                          for (x, y), d in decisions.items()}
                      for q, decisions in analysis.decisions.items()}}}


def _conditions_load(folder: Path, index: dict):
    """The runs, with the study file's settings that study.json keeps (baseline, primary quantities, logit and
    key-cache loss margins): a research.analysis.conditions.ConditionRuns."""
    from research.analysis import conditions as conditions_analysis
    primary = ()
    if index.get("primary") is not None:
        try:
            primary = conditions_analysis.check_primary(index["primary"])
        except ConfigError as e:
            raise ResultsError(f"{index['path']}: {e}; fix: {INDEX_FIX}") from None
    return conditions_analysis.ConditionRuns(_runs(folder, index), index.get("baseline"), primary,
                                             index.get("logit_margin"), index.get("kv_loss_margin"))


def _conditions_compare(inputs) -> Comparison:
    """identity.compare on the runs, the study file's settings kept beside them."""
    c = compare(inputs.runs)
    return dataclasses.replace(c, runs=dataclasses.replace(inputs, runs=c.runs))


def _spikes_load(folder: Path, index: dict):
    """The runs with each one's metrics.jsonl (beside its results.json) read by the one checked reader: a
    research.analysis.spikes.SpikeRuns."""
    from research.analysis import spikes as spikes_analysis
    from research.results.steps import load_steps

    def steps(res: dict, path: Path) -> list[dict]:
        return load_steps(path.parent / METRICS_FILE, diverged=bool(res.get("diverged")))
    runs = _runs(folder, index)
    return spikes_analysis.SpikeRuns({c: [{**res, spikes_analysis.STEPS: steps(res, Path(p))}
                                          for res, p in zip(rl, index["conditions"][c])] for c, rl in runs.items()},
                                     index.get("seeds"))


def _grid_compare(runs: dict) -> Comparison:
    """identity.compare for a learning-rate grid, where a run that diverged did so at its rate: its result."""
    return compare(runs, divergence_is_a_result=True)


def _spikes_compare(inputs) -> Comparison:
    """identity.compare on the runs of the grid, the seeds' order kept beside them."""
    c = _grid_compare(inputs.runs)
    return dataclasses.replace(c, runs=dataclasses.replace(inputs, runs=c.runs))


def _qk_norm_primary(analysis) -> dict:
    """The QK-norm study's question: the three pairs and the difference of the steps, on key PR and on the validation
    loss."""
    out = {}
    for field, what in (("mean_pr", "key PR"), ("val_loss", "validation loss")):
        out.update({f"{what} {x}\u2212{y}": d for (x, y), d in analysis.decisions[field].items()})
        if analysis.steps[field] is not None:
            out[f"{what} (A\u2212B)\u2212(B\u2212C)"] = analysis.steps[field]
    return out


def _conditions_primary(analysis) -> dict:
    """A study file's primary quantities (its findings), every comparison of each."""
    return {f"{q} {x}\u2212{y}": d for q in analysis.primary for (x, y), d in analysis.decisions[q].items()}


def _pilot_primary(analysis) -> dict:
    """The pilot's question: the final key PR and validation loss, with QK-norm minus without."""
    return {what: analysis.decisions[f] for f, what in (("mean_pr", "key PR"), ("val_loss", "validation loss"))
            if f in analysis.decisions}


def _lr_primary(analysis) -> dict:
    """The learning-rate study's question: each pair's sensitivity of the final loss to the rate."""
    return {f"sensitivity {x}\u2212{y}": d for (x, y), d in analysis.decisions.items()}


def _keys_primary(analysis) -> dict:
    """The key-dynamics study's question: the change of each layer group's key norm, with minus without weight
    decay on the gains."""
    return {f"weight decay on the gains, {g}": d for g, d in analysis.weight_decay.items()}


def _finetune_primary(analysis) -> dict:
    """The fine-tuning study's question: trained minus frozen gains, in the final key metrics and validation loss."""
    return dict(analysis.final)


def _pilot_combined(analysis) -> dict:
    return {PILOT_COMBINED: json_safe({c: pc.combined for c, pc in analysis.conditions.items()})}


def _per_condition(plots: str) -> Callable[[list[str]], list[str]]:
    """One set of figures per condition (the FIGURE_BASES of research.plots.<plots>), named after it when there are
    several (research.plots.keys.figure_name), then the report."""
    def outputs(conditions: list[str]) -> list[str]:
        bases, name = _plots_value(plots, "FIGURE_BASES"), _plots_value("keys", "figure_name")
        figures = [name(b, c, len(conditions)) for c in conditions for b in bases]
        return [*figures, REPORT, REPORT_PAGE]
    return outputs


def _named(plots: str, *extra: str) -> Callable[[list[str]], list[str]]:
    """A kind's fixed figures (the FIGURES of research.plots.<plots>), then the report and its combined file(s)."""
    return lambda conditions: [*_plots_value(plots, "FIGURES"), REPORT, REPORT_PAGE, *extra]


# ---------------------------------------------------------------------------------- kinds of measured models

def _pretrained_analyze(res: dict, margin: float | None, loss_margin: float | None):
    return _analysis("pretrained", "analyze_file")(res, margin)


def _trajectory_analyze(res: dict, margin: float | None, loss_margin: float | None):
    """One model's checkpoints, or several seeds' (research.analysis.trajectory_seeds)."""
    from research.results.trajectory import across_seeds
    analyze = _analysis("trajectory_seeds" if across_seeds(res) else "trajectory")
    return analyze(res, margin, LOSS_MARGIN if loss_margin is None else loss_margin)


def _trajectory_draw(one, seeds):
    """What one model's checkpoints (`one`) or several seeds' (`seeds`) draw, by the analysis's type: its figures,
    report, "In short" and settle line."""
    def draw(analysis):
        from research.analysis.trajectory_seeds import SeedTrajectory
        return (seeds if isinstance(analysis, SeedTrajectory) else one)(analysis)
    return draw


def _file(name: str, load_file: Callable[[Path], dict]) -> Callable[[Path, dict], dict]:
    def load(folder: Path, index: dict) -> dict:
        path = Path(folder) / name
        if not path.is_file():
            raise ResultsError(f"{folder}: no {name} in it")
        return load_file(path)
    return load


PRETRAINED_FILE, TRAJECTORY_FILE = owned_file("pretrained_keys"), owned_file("checkpoint_keys")  # utils.owners.OWNERS
KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("qk_norm", _runs, _margins(_analysis("qk_norm")), _plots("qk_norm", "figures"),
         _plots("qk_norm_report", "report"), _named("qk_norm", QK_COMBINED), _qk_norm_combined,
         primary=_qk_norm_primary, in_short=_plots("qk_norm_report", "in_short")),
    Kind("pilot", _runs, _margins(_analysis("pilot")), _plots("pilot", "figures"), _plots("pilot", "report"),
         _named("pilot", PILOT_COMBINED), _pilot_combined, primary=_pilot_primary,
         in_short=_plots("pilot", "in_short")),
    Kind("keys", _runs, _margins(_analysis("keys"), with_loss=False), _plots("keys", "figures"),
         _plots("keys", "report"), _per_condition("keys"), primary=_keys_primary, in_short=_plots("keys", "in_short")),
    Kind("heads", _runs, _margins(_analysis("heads"), with_loss=False), _plots("heads", "figures"),
         _plots("heads", "report"), _per_condition("heads"), in_short=_plots("heads", "in_short")),
    Kind("lr", _runs, _margins(_analysis("lr")), _plots("lr", "figures"), _plots("lr", "report"), _named("lr"),
         compare=_grid_compare, primary=_lr_primary, in_short=_plots("lr", "in_short")),
    Kind("finetune", _runs, _margins(_analysis("finetune")), _plots("finetune", "figures"),
         _plots("finetune", "report"), _named("finetune"), primary=_finetune_primary,
         in_short=_plots("finetune", "in_short")),
    Kind("conditions", _conditions_load, _margins(_analysis("conditions")), _plots("conditions", "figures"),
         _plots("conditions", "report"), _named("conditions", QK_COMBINED), _conditions_combined,
         compare=_conditions_compare, primary=_conditions_primary, named_primary=True,
         in_short=_plots("conditions", "in_short")),
    Kind("spikes", _spikes_load, _analysis("spikes", "analyze_runs"), _plots("spikes", "figures"),
         _plots("spikes", "report"), _named("spikes"), compare=_spikes_compare, in_short=_plots("spikes", "in_short"),
         no_primary="its seeds are split into calibration (the first half chooses the alarm thresholds) and "
                    "evaluation (the second half tests them), and seeds added in rounds would move the split"),
    Kind("pretrained_keys", _file(PRETRAINED_FILE, OnDemand("research.results.pretrained", "load_pretrained_keys")),
         _pretrained_analyze, _plots("pretrained", "figures"), _plots("pretrained_report", "report"),
         _named("pretrained"), compare=nothing_to_pair, in_short=_plots("pretrained_report", "in_short"),
         settle=lambda a: settle_line("batch")),
    Kind("checkpoint_keys", _file(TRAJECTORY_FILE, OnDemand("research.results.trajectory", "load_trajectory")),
         _trajectory_analyze, _trajectory_draw(_plots("trajectory", "figures"), _plots("trajectory_seeds", "figures")),
         _trajectory_draw(_plots("trajectory", "report"), _plots("trajectory_seeds", "report")), _named("trajectory"),
         compare=nothing_to_pair,
         in_short=_trajectory_draw(_plots("trajectory", "in_short"), _plots("trajectory_seeds", "in_short")),
         settle=_trajectory_draw(lambda a: settle_line("batch"), _plots("trajectory_seeds", "settle"))),
)}


def read(folder: Path, index: dict) -> tuple[Kind, object]:
    """(the kind of a study folder, its inputs read and checked): the kind its study.json names, else the one whose
    results file it holds, else what research.results.layout.load_study recognizes (the pilot's combined file,
    QK-norm condition folders). ResultsError names a file that cannot be used."""
    if index:
        kind = KINDS[index["kind"]]
        return kind, kind.load(folder, index)
    for kind in KINDS.values():
        if kind.found_by and (Path(folder) / kind.found_by).is_file():
            return kind, kind.load(folder, index)
    name, runs = load_study(folder, index)
    return KINDS[name], runs
