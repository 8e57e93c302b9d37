"""Which tool owns a folder, and the one table of the kinds of folder: the one rule every writer asks first, the
trainer included. No torch, nothing of the project above utils, so that training (below research) asks the same
table as the studies and the drawing.

OWNERS holds one record per kind of folder (`Owner`: who writes it, the files that mark its folders, the files it
writes beside them, and for a study kind `found_by` and `grid`); every other list of kinds (STUDY_KINDS, GRID_KINDS,
research.studies.kinds.KINDS) is derived from it. Every writer calls `refuse_foreign(folder, kind, tool)` before
it writes anything: a folder of its own, or of no owner, is written; one holding another owner's file is refused.
The table and the rule in full: docs/layout.md, "Study kinds".
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from utils.errors import UserError
from utils.formats import FormatError, Obj, OneOf, Opt, Text, check
from utils.run_names import CONFIG, RUN_FILES, is_own_run

STUDY_INDEX = "study.json"  # a study folder's index (research.results.layout declares it whole)
REDRAW = "redraw.json"  # split_panels.py --out: whose redraw a folder is
MODEL_KIND = "model"  # a folder whose config.json no tool of ours wrote (a Hugging Face model's): the export's only
QK_COMBINED = "combined.json"  # the QK-norm study's and a study file's combined decisions
PILOT_COMBINED = "combined_results.json"  # the pilot's runs in one file
INSPECT_FILE = "inspect.json"  # research/inspect_pretrained.py's results
PRETRAINED_KEYS = "pretrained_keys.json"  # research/pretrained_keys_study.py's results
CHECKPOINT_KEYS = "checkpoint_keys.json"  # research/checkpoint_keys_study.py's results
EXPORT_INFO = "export.json"  # research/export_hf.py's record of what it exported
STORAGE_INDEX = "storage.json"  # a --storage folder's record of the study it serves (research.studies.storage)
GPU_SESSION = "gpu_session.json"  # research/speed/gpu_session.py's record of a session
AUDIT_FILE = "audit.json"  # what qk-audit --json writes (any name the user gives; this one in docs)
DECIDE_FILE = "decide.json"  # what qk-decide --json writes (any name the user gives; this one in docs)
DECIDE_DESIGN = "decide_design.json"  # qk-decide --design's file, by the name docs/decide.md gives it
# python -m research.results.schema --json_schema DIR: the JSON Schema files it writes (research.results.schema
# publishes these names, a test checks them against its table)
SCHEMA_FILES = ("results.schema.json", "study.schema.json", "combined.qk_norm.schema.json",
                "combined.conditions.schema.json", "combined_results.schema.json", "pretrained_keys.schema.json",
                "checkpoint_keys.schema.json", "inspect.schema.json", "export.schema.json", "redraw.schema.json",
                "config.schema.json", "metrics.schema.json", "summary.schema.json", "stored.schema.json",
                "storage.schema.json", "audit.schema.json", "decide.schema.json", "decide_design.schema.json",
                "gpu_session.schema.json", "state.schema.json", "meta.schema.json", "data_tokenizer.schema.json",
                "gguf_source.schema.json", "lock.schema.json")


class OwnerError(UserError):
    """A folder that belongs to another owner than the writer about to write into it."""


@dataclass(frozen=True)
class Owner:
    """One kind of folder: who writes it, the files whose presence makes a folder its, and for a study kind how its
    folder is recognised and whether its runs are a grid."""

    kind: str  # a study kind of research.studies.kinds, or 'run', 'inspect', 'export', 'storage', 'schema', ...
    tool: str  # who writes it, for people
    marks: tuple[str, ...] = ()  # names directly in the folder that make it this owner's (none: a study.json)
    writes: tuple[str, ...] = ()  # other owners' marks it writes beside its own (then they are its)
    found_by: str | None = None  # a study kind's (research.studies.kinds draws it): STUDY_INDEX, its study.json
    #   names it (or, for the write-ups' folders, research.results.layout.load_study's files), or its own results
    #   file (its only mark); None: no study kind (a run, an inspection, an export, a redraw)
    grid: bool = False  # its runs are a learning-rate grid, named condition@multiplier (study.json checks it)


def _study(kind: str, tool: str, marks: tuple[str, ...] = (), writes: tuple[str, ...] = (),
           grid: bool = False) -> Owner:
    """A study kind whose folder holds a study.json naming it."""
    return Owner(kind, tool, marks, writes, STUDY_INDEX, grid)


def _one_file(kind: str, tool: str, file: str) -> Owner:
    """A study kind whose folder is recognised by its own results file."""
    return Owner(kind, tool, (file,), found_by=file)


REDRAW_KIND = "redraw"
STORAGE_KIND = "storage"
OWNERS: dict[str, Owner] = {o.kind: o for o in (
    Owner("run", "a training run (train_llm.py, or a study's condition)", RUN_FILES),
    Owner("inspect", "research/inspect_pretrained.py", (INSPECT_FILE,)),
    Owner("export", "research/export_hf.py", (EXPORT_INFO,)),
    Owner(STORAGE_KIND, "a study's --storage (research.studies.storage)", (STORAGE_INDEX,)),
    Owner("schema", "python -m research.results.schema --json_schema", SCHEMA_FILES),
    Owner("gpu_session", "research/speed/gpu_session.py", (GPU_SESSION,)),
    Owner("decide", "qk-decide --design (research/qk_decide.py)", (DECIDE_DESIGN,)),
    _one_file("pretrained_keys", "research/pretrained_keys_study.py", PRETRAINED_KEYS),
    _one_file("checkpoint_keys", "research/checkpoint_keys_study.py", CHECKPOINT_KEYS),
    _study("qk_norm", "the QK-norm study", (QK_COMBINED,)),
    _study("pilot", "the pilot (research/qk_norm_500k_study.py)", (PILOT_COMBINED,)),
    _study("keys", "the key-dynamics study"),
    _study("heads", "the head-specialization study"),
    _study("lr", "the learning-rate study", grid=True),
    _study("finetune", "research/finetune_keys_study.py"),
    _study("conditions", "a study file's study (research/study.py)", writes=(QK_COMBINED,)),
    _study("spikes", "the spike study", grid=True),
    Owner(REDRAW_KIND, "research/split_panels.py --out", (REDRAW,), writes=(QK_COMBINED, PILOT_COMBINED)),
)}
# Derived from OWNERS: the kinds of study a study.json may name, in the table's order (its check lists them so),
# and those of them whose runs are named condition@multiplier.
STUDY_KINDS = tuple(o.kind for o in OWNERS.values() if o.found_by == STUDY_INDEX)
GRID_KINDS = tuple(o.kind for o in OWNERS.values() if o.grid)


# What the owner rule reads of a study.json (research.results.study_formats.STUDY declares and checks the whole
# file) and of a redraw.json (all of it).
STUDY_OWNER = Obj({"kind": OneOf(STUDY_KINDS), "study": Opt(Text("a name (text)", nonempty=True))},
                  "a JSON object (the study index)")
REDRAW_FORMAT = Obj({"redraw_of": Text("a folder (text)", nullable=False, nonempty=True),
                     "kind": Text("a study kind (text)", nullable=False, nonempty=True)}, "a JSON object")
# A storage.json (all of it): the study a --storage serves; research.studies.storage writes and compares it.
STORAGE_FORMAT = Obj({"study": Text("a study name (text)", nullable=False, nonempty=True),
                      "kind": Text("a study kind (text)", nullable=False, nonempty=True),
                      "out": Text("the study's --out, an absolute folder (text)", nullable=False, nonempty=True)},
                     "a JSON object (the study a storage serves)")


def owned_file(kind: str) -> str:
    """The results file that marks a folder of `kind` (a kind of one file: research.studies.kinds' found_by)."""
    return OWNERS[kind].marks[0]


def reserved_names() -> dict[str, Owner]:
    """{name in lower case: its owner} for every file or folder name that marks an owner's folder: a study's folder
    holding one of them (a condition named so) would read as that owner's. Lower case: one name on macOS and
    Windows."""
    names: dict[str, Owner] = {}
    for owner in OWNERS.values():
        for name in owner.marks:
            names.setdefault(name.lower(), owner)
    return names


@dataclass(frozen=True)
class Held:
    """One owner found in a folder: its kind (None: a study.json or redraw.json that cannot be read), who it is, its
    files, and for a redraw the study folder it redraws."""

    kind: str | None
    who: str
    files: tuple[str, ...]
    owner: str | None = None  # its key in OWNERS (the kind, or 'redraw')
    redraw_of: str | None = None


def _read(path: Path, spec: Obj) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        check(spec, data)
    except (OSError, ValueError, FormatError):  # ValueError: not JSON, or not UTF-8
        return None
    return data


def _named(folder: Path) -> list[Held]:
    """The owners that a study.json and a redraw.json of `folder` name."""
    held = []
    if (folder / STUDY_INDEX).is_file():
        index = _read(folder / STUDY_INDEX, STUDY_OWNER)
        held.append(Held(None, "a study whose study.json cannot be read", (STUDY_INDEX,)) if index is None else
                    Held(index["kind"], f"the study {index.get('study') or index['kind']!r} (kind {index['kind']})",
                         (STUDY_INDEX,), index["kind"]))
    if (folder / REDRAW).is_file():
        mark = _read(folder / REDRAW, REDRAW_FORMAT)
        held.append(Held(None, f"a redraw whose {REDRAW} cannot be read", (REDRAW,), REDRAW_KIND) if mark is None else
                    Held(mark["kind"], f"a redraw of {mark['redraw_of']} (a {mark['kind']} study, drawn by "
                                       f"split_panels.py --out)", (REDRAW,), REDRAW_KIND, mark["redraw_of"]))
    return held


def _storage_of(folder: Path) -> str:
    """Who a storage folder is, in words: the study its storage.json names, where it can be read."""
    record = _read(folder / STORAGE_INDEX, STORAGE_FORMAT)
    if record is None:
        return f"a study's --storage whose {STORAGE_INDEX} cannot be read"
    return f"the --storage of the study {record['study']!r} (kind {record['kind']}, --out {record['out']})"


def _holds(folder: Path, name: str) -> bool:
    return (folder / name).exists() and (name != CONFIG or is_own_run(folder))  # a model folder's config.json too


def owners_of(folder: str | Path) -> list[Held]:
    """Every owner whose files `folder` holds, in OWNERS' order, then the study its study.json names and the study
    folder its redraw.json names. Files an owner found writes beside its own (Owner.writes) count as its."""
    folder = Path(folder)
    held = [Held(o.kind, _storage_of(folder) if o.kind == STORAGE_KIND else o.tool, found, o.kind)
            for o in OWNERS.values() if o.kind != REDRAW_KIND
            if (found := tuple(name for name in o.marks if _holds(folder, name)))]
    if not held and (folder / CONFIG).exists():  # a config.json no tool of ours wrote: a model folder, or anyone's
        held.append(Held(MODEL_KIND, f"a model folder or another program's files (its {CONFIG} is no run's config)",
                         (CONFIG,)))
    held += _named(folder)
    writes = {name for h in held if h.owner for name in OWNERS[h.owner].writes}
    return [h for h in held if not set(h.files) <= writes]


def refuse_foreign(folder: str | Path, kind: str, tool: str, redraw_of: str | Path | None = None,
                   fix: str = "pass another --out", accept: tuple[str, ...] = ()) -> None:
    """OwnerError when `folder` holds files of an owner other than `kind` (with `redraw_of`: other than the redraw
    of that study folder, split_panels.py --out) or the kinds in `accept` (the export: MODEL_KIND, a model folder it
    may replace with --force): which owner, by which file, and `fix`. `tool`: the command about to write (for the
    message). Called before anything is written, so nothing is written when it refuses."""
    source = None if redraw_of is None else str(Path(redraw_of).resolve())
    foreign = [h for h in owners_of(folder) if h.kind not in accept and (h.kind != kind or h.redraw_of != source)]
    if not foreign:
        return
    by = "; ".join(f"{h.who}, by its {', '.join(h.files)}" for h in foreign)
    own = kind if source is None else f"{kind}, a redraw of {source}"
    raise OwnerError(f"{folder} belongs to {by}: {tool} writes only into a folder of its own ({own}) or a new one, "
                     f"never over another tool's results and report; {fix} (nothing was written)")


def redraw_record(source: str | Path, kind: str) -> dict:
    """What redraw.json holds (REDRAW_FORMAT): the folder is a redraw of the `kind` study in `source`
    (split_panels.py --out, through research.studies.render), so that a later writer is refused naming the owner it
    truly is."""
    return {"redraw_of": str(Path(source).resolve()), "kind": kind}
