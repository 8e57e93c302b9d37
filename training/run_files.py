"""The files of a run folder around its checkpoints: config.json, metrics.jsonl, summary.json, tokenizer/.

A folder holds a run when any file a run writes is there (`RunFolder.contents`: these, the probe's
results.json, a tracker's tensorboard/ or wandb/, checkpoint step folders); it can be continued
(`RunFolder.resumable`) when it has config.json or a complete checkpoint.

Only rank 0 of a run writes them, and only while it holds the folder's lock (utils.lock,
taken by training.run.train_run). metrics.jsonl is append-only while training and cut back
to the resumed step on every resume; a line a kill or a full disk tore is dropped with a
warning instead of stopping the resume.
"""
from __future__ import annotations

import json
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from configs.config import ConfigError, RunConfig
from configs.files import load_run_config, run_config_from_dict
from training import checkpoint
from training.errors import RunError
from training.resume import check_same_run
from utils.errors import os_fix, os_problem
from utils.io import (append_line, atomic_dir, atomic_write_text, remove_matching, temp_dir_pattern,
                      temp_file_pattern)
from utils.run_names import ATOMIC_FILES, CHECKPOINTS, CONFIG, METRICS, RUN_DIRS, SUMMARY, TOKENIZER

# What a run leaves under checkpoints/: step folders, complete or not, and those set aside as unreadable
_CHECKPOINT_ENTRY = re.compile(r"^step-\d+(\.unreadable(-\d+)?)?$")


def parse_metrics(text: str) -> tuple[list[dict], list[str]]:
    """(rows, problems): every line that is a JSON object with an integer step, and what was dropped."""
    rows, problems = [], []
    lines = text.split("\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("no integer step")
            rows.append(row)
        except ValueError:
            torn = i == len(lines) and not text.endswith("\n")
            problems.append(f"line {i}{' (the last, cut off)' if torn else ''}: {line[:60]!r}")
    return rows, problems


class RunFolder:
    def __init__(self, path: str | Path, log: Callable = print):
        self.path, self.log = Path(path), log
        self.checkpoints = self.path / CHECKPOINTS

    def contents(self) -> list[str]:
        """Names of the run files present (for messages): files, folders (with a slash), checkpoint folders."""
        names = [f for f in ATOMIC_FILES if (self.path / f).exists()]
        names += [f"{d}/" for d in RUN_DIRS if (self.path / d).is_dir()]
        if self.checkpoints.is_dir():
            names += [f"checkpoints/{p.name}" for p in sorted(self.checkpoints.iterdir())
                      if _CHECKPOINT_ENTRY.match(p.name)]
        return names

    def kept(self) -> str:
        """What a run stopped by a write error keeps, and how to go on (for its message)."""
        ckpt = checkpoint.latest_checkpoint(self.checkpoints)
        where = (f"the newest checkpoint is {ckpt.path} (step {ckpt.step})" if ckpt
                 else "no checkpoint was written yet (a resume starts again from step 0)")
        return f"The files written before are intact and {where}; continue with --resume (a study: run it again)"

    @contextmanager
    def write_errors(self):
        """A full disk, a read-only folder or a checkpoint that cannot be written: one RunError, what is kept."""
        try:
            yield
        except OSError as e:
            raise RunError(f"cannot write to {self.path}: {os_problem(e, self.path)}. Fix: {os_fix(e)}. "
                           f"{self.kept()}") from e
        except checkpoint.CheckpointError as e:
            fix = "free space on that disk (or point --out elsewhere)" if e.disk_full else "check its disk"
            raise RunError(f"{e}. Fix: {fix}. {self.kept()}") from e

    def holds_run(self) -> bool:
        """Any file a run writes is there: starting a new run would overwrite it."""
        return bool(self.contents())

    def resumable(self) -> bool:
        """Something to continue from: config.json or a complete checkpoint."""
        return (self.path / CONFIG).exists() or bool(checkpoint.list_checkpoints(self.checkpoints))

    def saved_config(self) -> RunConfig | None:
        """The run's config: config.json, else (missing or unreadable) the newest copy a checkpoint holds."""
        error = None
        if (self.path / CONFIG).exists():
            try:
                return load_run_config(self.path / CONFIG)
            except ConfigError as e:
                error = e
        for ckpt in reversed(checkpoint.list_checkpoints(self.checkpoints)):
            try:
                cfg = run_config_from_dict(json.loads((ckpt.path / "state.json").read_text())["config"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # ConfigError is a ValueError
            if error:
                self.log(f"warning: {error}; using the config saved in {ckpt.path} (config.json is rewritten)")
            return cfg
        if error:
            raise ConfigError(f"{error} (no checkpoint holds a copy of it), or start again in another --out")
        return None

    # ---------------------------------------------------------- start-up
    def check_start(self, resume: bool, cfg: RunConfig) -> RunConfig | None:
        """Refuse to overwrite a run, to resume nothing, or to resume with another config than `cfg` (nothing is
        written here); returns the saved config of a resumed run."""
        found = self.contents()
        if found and not self.resumable():  # the same answer with or without --resume
            raise RunError(f"{self.path} holds files of a run ({', '.join(found)}) but nothing to continue from (no "
                           f"{CONFIG} and no complete checkpoint), so it cannot be continued: move them away or "
                           f"choose another --out (nothing was overwritten)")
        if not resume:
            if found:
                raise FileExistsError(f"{self.path} already holds a run ({', '.join(found)}): pass --resume to "
                                      f"continue it, or choose another --out (nothing was overwritten)")
            return None
        if not found:
            raise RunError(f"--resume: {self.path} holds no run to continue (no {CONFIG} and no checkpoint): "
                           f"drop --resume to start a new run there, or check the --out path")
        saved = self.saved_config()
        if saved is None:
            raise RunError(f"--resume: {self.path} has no {CONFIG} and none of its checkpoints' state.json gives "
                           f"the run's config: restore {CONFIG} from a copy, or choose another --out")
        check_same_run(saved, cfg, self.path)
        return saved

    def remove_orphans(self) -> list[Path]:
        """What killed processes left: temporary files and folders of this run's own naming only."""
        removed = [p for name in ATOMIC_FILES for p in remove_matching(self.path, temp_file_pattern(name))]
        removed += remove_matching(self.path, temp_dir_pattern(TOKENIZER))
        removed += checkpoint.remove_orphans(self.checkpoints)
        for p in removed:
            self.log(f"removed {p} (left by an interrupted run)")
        return removed

    def write_config(self, cfg: RunConfig) -> None:
        """config.json, rewritten only when it changes (a resume with other --tokens)."""
        text = json.dumps(cfg.to_dict(), indent=2) + "\n"
        path = self.path / CONFIG
        if not path.exists() or path.read_text(errors="replace") != text:
            atomic_write_text(path, text)

    def copy_tokenizer(self, source: Path) -> None:
        if not (self.path / TOKENIZER).is_dir():
            with atomic_dir(self.path / TOKENIZER) as tmp:
                shutil.copytree(source, tmp, dirs_exist_ok=True)

    # ----------------------------------------------------------- metrics
    def read_metrics(self) -> tuple[list[dict], list[str]]:
        path = self.path / METRICS
        if not path.exists():
            return [], []
        return parse_metrics(path.read_text(encoding="utf-8", errors="replace"))

    def truncate_metrics(self, step: int) -> None:
        """Keep the rows of steps <= step (the checkpoint resumed from), dropping torn lines with a warning."""
        path = self.path / METRICS
        if not path.exists():
            return
        text = path.read_text(encoding="utf-8", errors="replace")
        rows, problems = parse_metrics(text)
        for p in problems:
            self.log(f"warning: {path}: dropped unreadable {p}")
        keep = [r for r in rows if r["step"] <= step]
        if problems or len(keep) != len(rows) or (text and not text.endswith("\n")):
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))

    def append_metrics(self, record: dict) -> None:
        append_line(self.path / METRICS, json.dumps(record))

    def metric_at(self, step: int, key: str):
        """The last value of `key` logged at `step` (None if none)."""
        values = [r[key] for r in self.read_metrics()[0] if r["step"] == step and key in r]
        return values[-1] if values else None

    # ----------------------------------------------------------- summary
    def read_summary(self) -> dict | None:
        try:
            d = json.loads((self.path / SUMMARY).read_text())
        except (OSError, ValueError):
            return None
        return d if isinstance(d, dict) else None

    def write_summary(self, summary: dict) -> None:
        atomic_write_text(self.path / SUMMARY, json.dumps(summary, indent=2) + "\n")

