"""Every JSON and JSON-lines file the project writes, with the declaration that says what it holds, published as
JSON Schema (draft 2020-12) in docs/schema/ by `python -m research.results.schema --json_schema DIR`, one schema
per kind of file: where two kinds write files of one name (combined.json: the QK-norm study's and a study file's),
each has its own schema, and `schema_for` picks it by the folder's owner (utils.owners: its study.json's kind, or
the study kind a redraw.json names). A JSON-lines file's schema validates each of its lines. The files written
below research/results (a checkpoint's state.json, the data cache's meta.json and data_tokenizer.json, a converted
model's gguf_source.json, a folder's .lock) are declared in utils.file_specs, which their readers check too. What
transformers or tokenizers write themselves (an export's or a converted model's config.json and
generation_config.json, a tokenizer folder's tokenizer.json and tokenizer_config.json) is theirs, not published
here. No torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from research.results import file_formats as ff
from research.results.checks import RESULTS
from research.results.pretrained import PRETRAINED_KEYS
from research.results.study_formats import CONDITIONS_COMBINED_FORMAT, QK_COMBINED_FORMAT, STUDY
from research.results.trajectory import TRAJECTORY
from research.results.vocabulary import METRICS_FILE
from utils import file_specs as fs
from utils.formats import Spec, check, json_schema
from utils.lock import LOCK_NAME
from utils.owners import (AUDIT_FILE, CHECKPOINT_KEYS, DECIDE_DESIGN, DECIDE_FILE, EXPORT_INFO, GPU_SESSION,
                          INSPECT_FILE, PILOT_COMBINED, QK_COMBINED, REDRAW, REDRAW_FORMAT, SCHEMA_FILES,
                          STORAGE_FORMAT, STORAGE_INDEX, STUDY_INDEX, owners_of)
from utils.owners import PRETRAINED_KEYS as PRETRAINED_FILE
from utils.run_names import CONFIG, RESULTS as RESULTS_FILE, SUMMARY


@dataclass(frozen=True)
class Published:
    """One kind of file: its name in a folder, its declaration (where, for the schema's text), what it is, the owner
    kinds whose folders hold it when another kind writes a file of the same name (else ()), and whether it is JSON
    lines (the schema validates each line)."""

    file: str
    spec: Spec
    source: str
    what: str
    kinds: tuple[str, ...] = ()
    lines: bool = False


_F = "research/results/file_formats.py:"
_U = "utils/file_specs.py:"
JSON_SCHEMAS: dict[str, Published] = {  # schema file -> the kind of file it validates
    "results.schema.json": Published(RESULTS_FILE, RESULTS, "research/results/checks.py:RESULTS",
                                     "One run's key probe: one value per probe in every per-probe list."),
    "study.schema.json": Published(STUDY_INDEX, STUDY, "research/results/study_formats.py:STUDY",
                                   "A study folder's index: its kind, seeds, margins and each condition's results "
                                   "files."),
    "combined.qk_norm.schema.json": Published(
        QK_COMBINED, QK_COMBINED_FORMAT, "research/results/study_formats.py:QK_COMBINED_FORMAT",
        "The numbers of the QK-norm study's report (a folder of kind qk_norm).", ("qk_norm",)),
    "combined.conditions.schema.json": Published(
        QK_COMBINED, CONDITIONS_COMBINED_FORMAT, "research/results/study_formats.py:CONDITIONS_COMBINED_FORMAT",
        "The numbers of a study file's report (research/study.py, a folder of kind conditions).", ("conditions",)),
    "combined_results.schema.json": Published(PILOT_COMBINED, ff.PILOT_COMBINED_FORMAT,
                                              _F + "PILOT_COMBINED_FORMAT", "The pilot's seed means per condition."),
    "pretrained_keys.schema.json": Published(PRETRAINED_FILE, PRETRAINED_KEYS,
                                             "research/results/pretrained.py:PRETRAINED_KEYS",
                                             "The keys of pretrained models (research/pretrained_keys_study.py)."),
    "checkpoint_keys.schema.json": Published(CHECKPOINT_KEYS, TRAJECTORY, "research/results/trajectory.py:TRAJECTORY",
                                             "The keys along checkpoints (research/checkpoint_keys_study.py)."),
    "inspect.schema.json": Published(INSPECT_FILE, ff.INSPECT, _F + "INSPECT",
                                     "A pretrained model's tour (research/inspect_pretrained.py)."),
    "export.schema.json": Published(EXPORT_INFO, ff.EXPORT, _F + "EXPORT",
                                    "What research/export_hf.py exported, from which run and checkpoint."),
    "redraw.schema.json": Published(REDRAW, REDRAW_FORMAT, "utils/owners.py:REDRAW_FORMAT",
                                    "Whose redraw a folder is (split_panels.py --out)."),
    "config.schema.json": Published(CONFIG, ff.RUN_CONFIG, _F + "RUN_CONFIG", "A run's config."),
    "metrics.schema.json": Published(METRICS_FILE, ff.METRICS_LINE, _F + "METRICS_LINE",
                                     "One line of a run's metrics.jsonl (JSON lines: each line validates).",
                                     lines=True),
    "summary.schema.json": Published(SUMMARY, ff.SUMMARY, _F + "SUMMARY", "A run's summary at its end."),
    "stored.schema.json": Published(ff.STORED_FILE, ff.STORED, _F + "STORED",
                                    "A run's stored files in its storage (--storage)."),
    "storage.schema.json": Published(STORAGE_INDEX, STORAGE_FORMAT, "utils/owners.py:STORAGE_FORMAT",
                                     "The one study a --storage location serves: its name, kind and --out."),
    "audit.schema.json": Published(AUDIT_FILE, ff.AUDIT, _F + "AUDIT", "One model's audit (research/qk_audit.py "
                                                                      "--json)."),
    "decide.schema.json": Published(DECIDE_FILE, ff.DECIDE, _F + "DECIDE", "Every comparison qk-decide made "
                                                                       "(research/qk_decide.py --json)."),
    "decide_design.schema.json": Published(DECIDE_DESIGN, ff.DECIDE_DESIGN_FORMAT, _F + "DECIDE_DESIGN_FORMAT",
                                           "A qk-decide design: the looks planned and taken (--design)."),
    "gpu_session.schema.json": Published(GPU_SESSION, ff.GPU_SESSION, _F + "GPU_SESSION",
                                         "One GPU session's record (research/speed/gpu_session.py)."),
    "state.schema.json": Published(fs.STATE_FILE, fs.CHECKPOINT_STATE, _U + "CHECKPOINT_STATE",
                                   "A checkpoint's state (training/checkpoint.py), in each step folder."),
    "meta.schema.json": Published(fs.BLOCKS_META, fs.BLOCKS_META_FORMAT, _U + "BLOCKS_META_FORMAT",
                                  "A data cache folder's record of its token blocks (data/blocks.py)."),
    "data_tokenizer.schema.json": Published(fs.DATA_TOKENIZER, fs.DATA_TOKENIZER_FORMAT, _U + "DATA_TOKENIZER_FORMAT",
                                            "A cached tokenizer's record (data/tokenizer.py)."),
    "gguf_source.schema.json": Published(fs.GGUF_SOURCE, fs.GGUF_SOURCE_FORMAT, _U + "GGUF_SOURCE_FORMAT",
                                         "A converted GGUF model's record (research/access/gguf.py)."),
    "lock.schema.json": Published(LOCK_NAME, fs.LOCK_HOLDER, _U + "LOCK_HOLDER",
                                  "Who holds a folder's lock: the contents of its .lock (utils/lock.py)."),
}
assert tuple(JSON_SCHEMAS) == SCHEMA_FILES, "utils.owners.SCHEMA_FILES names the schema tool's files"

_GENERATED = ("Generated from {source} by `python -m research.results.schema --json_schema DIR`: do not edit. "
              "{what} What JSON Schema cannot say (lengths given by other fields, checks across fields) is named in "
              "'$comment's and checked by the project's reader only.")


def json_schemas() -> dict[str, str]:
    """Each JSON Schema file's text, by file name, generated from the declarations."""
    return {name: json.dumps(json_schema(p.spec, p.file, _GENERATED.format(source=p.source, what=p.what)),
                             indent=1) + "\n" for name, p in JSON_SCHEMAS.items()}


def schema_for(folder: str | Path, file: str) -> str | None:
    """The schema file that validates the file named `file` in `folder` (None: the project writes no such file, or
    a file of a name two kinds write in a folder of neither). A name one kind writes has one schema; combined.json
    has one per kind, picked by the folder's owner kind (its study.json's, or the study a redraw.json redraws)."""
    named = [name for name, p in JSON_SCHEMAS.items() if p.file == file]
    if len(named) <= 1:
        return named[0] if named else None
    kinds = {h.kind for h in owners_of(folder)}
    mine = [name for name in named if kinds & set(JSON_SCHEMAS[name].kinds)]
    return mine[0] if len(mine) == 1 else None


def check_file(schema: str, value) -> None:
    """The project's own check of a loaded file (a JSON-lines file: its list of lines) against the declaration that
    `schema` publishes: FormatError names the first field that does not fit."""
    p = JSON_SCHEMAS[schema]
    for i, item in enumerate(value if p.lines else [value]):
        check(p.spec, item, f"line {i + 1}" if p.lines else "",
              {"probes": len(item.get("tokens") or [])} if p.spec is RESULTS and isinstance(item, dict) else None)
