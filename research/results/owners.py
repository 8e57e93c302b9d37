"""Which tool owns a folder: the one rule every writer of results, figures and reports asks first. No torch.

A folder belongs to the tool whose results file it holds. Each owner names the files that mark its folders once,
in OWNERS: a training run (its run files), the inspection (inspect.json), the studies that measure models into
one file (pretrained_keys.json, checkpoint_keys.json), the pilot's combined file, the QK-norm study's combined
file; a folder holding study.json belongs to the study kind it names (the catalog studies and the fine-tuning
study write it). research.studies.kinds finds a kind's folder by the same names.

Every writer (each study script, the fine-tuning, pretrained-keys and checkpoint-keys studies, inspect_pretrained,
split_panels and the drawing of every study through research.studies.render) calls `refuse_foreign(folder, kind,
tool)` before it writes anything: a folder of its own kind, or of no tool, is written; one holding another
owner's file is refused, naming that owner, the file and the fix, and nothing is written. So one tool's report.md
never replaces another's, and no folder ends up mixing two tools' results.

This sits in research/results, the lowest floor every such writer imports (docs/layout.md); training, below it,
guards its own folders (training.trainer: a folder holding a run is continued or refused).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from research.results.layout import read_study_index
from research.results.pretrained import FILE as PRETRAINED_FILE
from research.results.schema import ResultsError
from research.results.trajectory import FILE as TRAJECTORY_FILE
from research.results.vocabulary import INSPECT_FILE, PILOT_COMBINED, QK_COMBINED, RUN_FILES, STUDY_INDEX


@dataclass(frozen=True)
class Owner:
    """A tool (or kind of study) and the files whose presence makes a folder its."""

    kind: str  # a study kind of research.studies.kinds, or 'run', 'inspect'
    tool: str  # who writes it, for people
    files: tuple[str, ...]  # names directly in the folder


OWNERS: dict[str, Owner] = {o.kind: o for o in (
    Owner("run", "a training run (train_llm.py, or a study's condition)", RUN_FILES),
    Owner("inspect", "research/inspect_pretrained.py", (INSPECT_FILE,)),
    Owner("pretrained_keys", "research/pretrained_keys_study.py", (PRETRAINED_FILE,)),
    Owner("checkpoint_keys", "research/checkpoint_keys_study.py", (TRAJECTORY_FILE,)),
    Owner("pilot", "the pilot (research/qk_norm_500k_study.py)", (PILOT_COMBINED,)),
    Owner("qk_norm", "the QK-norm study", (QK_COMBINED,)),
)}
# Files a study kind writes that mark another owner's folder where no study.json says whose it is: a study of kind
# 'conditions' (research/study.py) writes combined.json too, beside the study.json that names it.
ALSO_WRITES = {"conditions": (QK_COMBINED,)}


def owned_file(kind: str) -> str:
    """The results file that marks a folder of `kind` (a kind of one file: research.studies.kinds' found_by)."""
    return OWNERS[kind].files[0]


@dataclass(frozen=True)
class Held:
    """One owner found in a folder: its kind (None: a study.json that cannot be read), who it is, its files."""

    kind: str | None
    who: str
    files: tuple[str, ...]


def owners_of(folder: str | Path) -> list[Held]:
    """Every owner whose files `folder` holds, in OWNERS' order, then the study its study.json names."""
    folder = Path(folder)
    held = [Held(o.kind, o.tool, found) for o in OWNERS.values()
            if (found := tuple(name for name in o.files if (folder / name).exists()))]
    if (folder / STUDY_INDEX).is_file():
        try:
            index = read_study_index(folder)
            own = set(ALSO_WRITES.get(index["kind"], ()))
            held = [h for h in held if h.kind == index["kind"] or not set(h.files) <= own]
            held.append(Held(index["kind"], f"the study {index.get('study') or index['kind']!r} (kind "
                                            f"{index['kind']})", (STUDY_INDEX,)))
        except ResultsError:
            held.append(Held(None, "a study whose study.json cannot be read", (STUDY_INDEX,)))
    return held


def refuse_foreign(folder: str | Path, kind: str, tool: str) -> None:
    """ResultsError when `folder` holds results of an owner other than `kind`: which owner, by which file, and the
    fix (another --out). `tool`: the command about to write (for the message). Called before anything is written,
    so nothing is written when it refuses."""
    foreign = [h for h in owners_of(folder) if h.kind != kind]
    if not foreign:
        return
    by = "; ".join(f"{h.who}, by its {', '.join(h.files)}" for h in foreign)
    raise ResultsError(f"{folder} belongs to {by}: {tool} writes only into a folder of its own ({kind}) or a new "
                       f"one, never over another tool's results and report; pass another --out (nothing was "
                       f"written)")
