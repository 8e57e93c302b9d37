"""A run's metrics.jsonl read back for the per-step analyses (the spike-warning study). No torch.

The trainer appends one JSON object per logged step ({"step", "tokens", "loss", "grad_norm", ...}; with per-step
telemetry also "logit_max", "key_norm", "update_rms": utils.telemetry) and one {"step", "tokens", "val_loss"} line
per evaluation. `load_steps` is the one checked reader: a file that is missing, cannot be parsed, is not a
trainer's log, or was not logged at every step is one ResultsError naming the file and the fix.
"""
from __future__ import annotations

import json
from pathlib import Path

from research.results.schema import ResultsError
from research.results.values import parse_json
from utils.errors import os_problem
from research.results.vocabulary import METRICS_FILE as METRICS

STEPS_FIX = ("train that run again: delete its folder and run the same study command, which trains only the runs "
             "that are missing (with --log_every 1)")


def load_steps(path: str | Path, fix: str = STEPS_FIX, diverged: bool = False) -> list[dict]:
    """The training lines (those with a loss) of a metrics.jsonl, one per step in step order; NaN/inf losses as
    None. `diverged`: the run diverged (results.json says so), so it may have logged nothing (its first step).
    ResultsError: '<path>: <what is wrong>; fix: <fix>'."""
    path = Path(path)
    if diverged and not path.exists():
        return []
    if not path.is_file():
        raise ResultsError(f"{path}: no {METRICS} beside the run's results (the per-step log this study reads); "
                           f"fix: {fix}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ResultsError(f"{path}: cannot read it: {os_problem(e)}; fix: {fix}") from e
    except UnicodeDecodeError as e:
        raise ResultsError(f"{path}: corrupted: not text ({e}); fix: {fix}") from e
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = parse_json(line)
        except json.JSONDecodeError as e:
            raise ResultsError(f"{path}: corrupted: line {i} is not JSON ({e.msg}), damaged or cut off; "
                               f"fix: {fix}") from e
        if not isinstance(row, dict) or type(row.get("step")) is not int:
            raise ResultsError(f"{path}: line {i} is not a training log line (a JSON object with an integer "
                               f"\"step\"): not a metrics.jsonl of this project's trainer; fix: {fix}")
        if "loss" in row:
            rows.append(row)
    if not rows and diverged:
        return []
    if not rows:
        raise ResultsError(f"{path}: no training line (one with \"loss\") in it: not a metrics.jsonl of this "
                           f"project's trainer, or a run that never logged; fix: {fix}")
    steps = [r["step"] for r in rows]
    if steps != list(range(steps[0], steps[0] + len(steps))):
        gap = next(b - a for a, b in zip(steps, steps[1:]) if b - a != 1)
        raise ResultsError(f"{path}: logged steps {steps[0]}..{steps[-1]} with a gap of {gap} (--log_every above "
                           f"1, or lines lost); the spike rule reads every step; fix: {fix}")
    return rows
