"""The studies' own files declared (utils.formats specs): study.json (`STUDY`), and the combined.json of the two kinds
that write one under that name: the QK-norm study's (`QK_COMBINED_FORMAT`) and a study file's
(`CONDITIONS_COMBINED_FORMAT`). layout.py reads and writes study.json; research.results.schema publishes them all
as JSON Schema, one per kind. No torch.
"""
from __future__ import annotations

import math
from pathlib import Path

from research.results.checks import check_absolute_margin, check_margin, found
from research.results.vocabulary import GRID_KINDS, GRID_SEP, STUDY_KINDS, base_condition, split_grid_key
from utils.formats import Bool, Custom, FormatError, Integer, ListOf, MapOf, Number, Obj, OneOf, Opt, Rule, Text
from utils.time_split import TIME_SPLIT


def grid_run(name: str) -> tuple[str, float] | None:
    """('NoQK', 4.0) for a run name of the learning-rate grid with a positive multiplier; None otherwise."""
    if GRID_SEP not in name:
        return None
    try:
        cond, m = split_grid_key(name)
    except ValueError:
        return None
    return (cond, m) if cond and math.isfinite(m) and m > 0 else None


def _seeds_once(meta: dict, where: str, ctx) -> None:
    """Each seed once."""
    seeds = meta.get("seeds")
    if seeds is not None and len(set(seeds)) < len(seeds):
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        raise FormatError("seeds", "each seed once", f"seed(s) {', '.join(map(str, twice))} more than once")


def _runs_named_for_the_kind(meta: dict, where: str, ctx) -> None:
    """Each condition names its folder; a study of a grid kind (GRID_KINDS: 'lr', 'spikes') names its runs
    condition@multiplier, no other kind does; no run twice."""
    runs: dict = {}
    for cond in meta["conditions"]:
        grid, name = grid_run(cond), base_condition(cond)
        at = f"conditions.{cond}"
        if not name or name in (".", "..") or Path(name).name != name:
            raise FormatError(at, "a condition name, which is also its folder's (no '/', not '.' or '..')", found(cond))
        if meta["kind"] in GRID_KINDS and grid is None:
            raise FormatError(at, "a run of the learning-rate grid named condition@multiplier (e.g. 'NoQK@4', a "
                              f"positive multiplier), as a study of kind {meta['kind']!r} names them", found(cond))
        if meta["kind"] not in GRID_KINDS and GRID_SEP in cond:
            raise FormatError(at, f"a condition name without {GRID_SEP!r} (only a study of kind "
                              f"{' or '.join(map(repr, GRID_KINDS))} names its runs condition@multiplier)", found(cond))
        if grid in runs:
            raise FormatError(at, "one entry per run", f"the same run as conditions.{runs[grid]}")
        runs[grid or cond] = cond


def _baseline_is_a_condition(meta: dict, where: str, ctx) -> None:
    """The baseline is one of the conditions."""
    if "baseline" in meta and meta["baseline"] not in meta["conditions"]:
        raise FormatError("baseline", f"one of the conditions ({', '.join(meta['conditions'])})",
                          found(meta["baseline"]))


def _primary_once(meta: dict, where: str, ctx) -> None:
    """Each primary quantity once."""
    primary = meta.get("primary") or []
    twice = sorted({k for k in primary if primary.count(k) > 1})
    if twice:
        raise FormatError("primary", "each quantity once", f"{', '.join(twice)} more than once")


def _margin(name: str) -> Custom:
    """An equivalence margin, checked by check_margin (its message): a share of the mean in (0, 1)."""
    return Custom(lambda v: check_margin(name, v), "a margin", like=Number(nullable=False, gt=0, lt=1))


_NAME = Opt(Text("a name (text)", nullable=False, nonempty=True))
_SEEDS = ListOf(Integer(nullable=False), "a non-empty list of integers", nonempty=True, whole=True, show=found)
_ALPHA = Number("a level in (0, 1]", nullable=False, gt=0, le=1)
# study.json's looks (research.analysis.sequential.Look): per look, the seeds analysed, the alpha spent, whether the
# design planned it; a folder with none was decided at one look of its seeds at the full level
_LOOK = Obj({"seeds": _SEEDS, "alpha": _ALPHA,
             "planned": Bool()})
# the design of a study planned with --until_decided at its first command (research.studies.looks)
_DESIGN = Obj({"seeds": _SEEDS, "max_seeds": Integer(nullable=False, lo=2), "round": Integer(nullable=False, lo=1),
               "rho": Number("a positive number", nullable=False, gt=0), "alpha": _ALPHA,
               # written since the designs were calibrated (research.analysis.sequential.Design); absent before
               "first": Opt(Number("a share in [0, 1)", nullable=False, ge=0, lt=1)),
               "calibrated": Opt(Bool()),
               # written since issue 65: what defines the study's families and outcomes, fixed with the design
               # (research.analysis.sequential.FAMILY; null: the project's default margin); absent before
               "family": Opt(Obj({
                   "conditions": ListOf(Text("a condition name (text)", nullable=False, nonempty=True),
                                        "a non-empty list of condition names", nonempty=True, show=found),
                   "baseline": Text("a condition name (text) or null", nonempty=True),
                   "primary": ListOf(Text("a quantity key (text)", nullable=False, nonempty=True),
                                     "a list of quantity keys", show=found),
                   "margin": _margin("margin"), "loss_margin": _margin("loss_margin"),
                   "logit_margin": Opt(Number("a margin in logits or null", gt=0)),
                   "kv_loss_margin": Opt(Number("a margin or null", gt=0, lt=1))}))})
# study.json, as write_study_index writes it (study and preset may be absent: a study of a pretrained model has no
# preset of this project); the paths of conditions are checked against the folder by _check_paths.
STUDY = Obj({
    "study": _NAME, "preset": _NAME,
    "kind": OneOf(STUDY_KINDS),
    "seeds": Opt(ListOf(Integer(nullable=False), "a non-empty list of integers", nonempty=True, whole=True,
                        show=found)),
    "(seeds)": Rule(_seeds_once),
    "margin": Opt(_margin("margin")), "loss_margin": Opt(_margin("loss_margin")),
    "baseline": Opt(Text("a condition name (text)", nullable=False, nonempty=True)),
    # a study file's primary quantities (research.analysis.conditions.check_primary says which names are quantities,
    # when the conditions kind reads them) and the largest logit's margin in logits
    "primary": Opt(ListOf(Text("a quantity key (text)", nullable=False, nonempty=True),
                          "a non-empty list of quantity keys", nonempty=True, show=found)),
    "(primary)": Rule(_primary_once),
    "logit_margin": Opt(Custom(lambda v: check_absolute_margin("logit_margin", v, "logits"), "a margin in logits",
                               like=Number(nullable=False, gt=0))),  # finite: JSON holds no infinity
    "kv_loss_margin": Opt(_margin("kv_loss_margin")),  # a study file's, for a loss change with quantized keys
    "looks": Opt(ListOf(_LOOK, "a list of looks (seeds, alpha, planned)")),
    "design": Opt(_DESIGN),
    # made with --mix_hosts: its runs' host kinds (utils.hosts) are combined, not set aside (research.studies.hosts)
    "mix_hosts": Opt(Bool()),
    # the study's wall time by phase (utils.time_split): its runs' summary.json time splits summed ("runs": how
    # many), with the figures and the driver's own time (in "rest") of the command that drew it
    "time_split": Opt(TIME_SPLIT),
    "conditions": MapOf(ListOf(Text("a path (text)", nullable=False, pattern=r"\S"),
                               "a non-empty list of results files (paths relative to the study folder)", nonempty=True,
                               show=found),
                        "an object mapping each condition to its results files", path="dot", nonempty=True,
                        show=found),
}, "a JSON object (the study index)", show=found, rules=(_runs_named_for_the_kind, _baseline_is_a_condition))


# ----------------------------------------------------------------------------- combined.json (QK-norm study)

_NUMBERS = ListOf(Number(), "a list of numbers or null")
_FINALS = {f"{name}{part}": spec for name in ("final_pr", "final_pr_var", "final_loss", "final_val_loss")
           for part, spec in (("", Number()), ("_ci95", Number()), ("_per_seed", _NUMBERS))}
_DECISION_FIELDS = {"n": Integer(), **{k: Number() for k in ("difference", "relative", "ci_level", "p",
                                                               "p_bonferroni", "margin")},
                     "ci": ListOf(Number(), "a list of 2 numbers", n=2), "outcome": Text(nullable=False),
                     "seeds_needed": Opt(Integer()),  # written until issue 52: a plug-in count that did not hold
                     # written since issue 64 (docs/decisions.md#ratio-quantities): how it was decided, per-seed
                     # log ratios ("ratio": ci, margin and log_ratio are log ratios, relative and relative_ci the
                     # ratio minus 1) or differences; each seed's value as the report shows it and the seeds marked
                     # as outliers
                     "on": Opt(OneOf(("difference", "ratio"))), "log_ratio": Opt(Number()),
                     "relative_ci": Opt(ListOf(Number(), "a list of 2 numbers", n=2)),
                     "seeds": Opt(ListOf(Integer(), "a list of integers or null", nullable=True)),
                     "per_seed": Opt(_NUMBERS),
                     "outliers": Opt(ListOf(Integer(), "positions in per_seed marked as outliers")),
                     "note": Opt(Text())}
_DECISION = Obj(_DECISION_FIELDS)
# combined.json, the numbers of the QK-norm study's report (research.studies.render): written for people and
# notebooks, read back by no tool of the project; declared so that what it holds is said once (a test checks a
# rendered file against it).
QK_COMBINED_FORMAT = Obj({
    "study": OneOf(("qk_norm",)),
    "conditions": ListOf(Text(nullable=False), "a non-empty list of condition names", nonempty=True),
    "margin": _margin("margin"), "loss_margin": _margin("loss_margin"),
    "summary": MapOf(Obj({"tag": Text(nullable=False), "label": Text(nullable=False), "n": Integer(lo=1),
                          "seeds": ListOf(Integer(), "a list of integers or null"), "tokens": _NUMBERS, **_FINALS}),
                     path="dot"),
    "decisions": MapOf(MapOf(_DECISION, path="dot"), path="dot"),  # field -> "x-y" -> decision
    **{k: Text(nullable=False) for k in ("verdict", "verdict_pr_var", "loss_verdict", "train_loss_verdict")},
    "claims": MapOf(Obj({"claim": Text(nullable=False), "status": Text(nullable=False)}), path="dot"),
})


# ----------------------------------------------------------------------------- combined.json (a study file's study)

_SHARE_OR_NULL = Number("a margin (a share) or null", gt=0)
# combined.json of a study file (research/study.py, kind 'conditions'; research.studies.kinds): the study file's
# settings, each quantity's family size (Bonferroni), the token budget compared, each condition's mean per quantity,
# and each comparison's decision with its margin as a share, the condition it is relative to and its change of it.
CONDITIONS_COMBINED_FORMAT = Obj({
    "study": OneOf(("conditions",)),
    "conditions": ListOf(Text(nullable=False), "a non-empty list of condition names", nonempty=True),
    "baseline": Text("a condition name or null"),
    "primary": ListOf(Text("a quantity key (text)", nullable=False, nonempty=True), "a list of quantity keys"),
    "margin": _SHARE_OR_NULL, "loss_margin": _SHARE_OR_NULL,
    "logit_margin": Number("a margin in logits or null", gt=0), "kv_loss_margin": _SHARE_OR_NULL,
    "family_k": MapOf(Integer("a number of comparisons", nullable=False, lo=0), path="dot"),
    "tokens": Number("the training tokens every run compared reached, or null"),
    "summary": MapOf(MapOf(Obj({"mean": Number(), "ci95": Number(), "n": Integer(lo=0)}), path="dot"), path="dot"),
    "decisions": MapOf(MapOf(Obj({**_DECISION_FIELDS, "margin_share": Number(), "reference": Text(),
                                  "of_reference": Number()}), path="dot"), path="dot"),  # quantity -> "x-y" -> it
})
