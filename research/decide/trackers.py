"""Runs in experiment trackers, for qk-decide: TensorBoard event folders (TensorBoard's own EventAccumulator) and
trackio stores (trackio's own SQLiteStorage), each scalar's last value or its value at --at_step. The record, the
names and the values: research.decide.records.
"""
from __future__ import annotations

import math
import re
import sqlite3
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from research.decide.records import (TB_EXAMPLE, Columns, ReadError, Run, _condition, _from_name, _is_number, _seed,
                                     flatten)
from utils.errors import cut, shown

EVENTS = "events.out.tfevents.*"  # TensorBoard's event file names

# ---- series of (step, value): TensorBoard and trackio ----

def _pick(series: dict[str, list[tuple[int, float]]], columns: Columns, where: str) -> tuple[dict, int | None]:
    """(values, step) of one run from each metric's (step, value) points in the order written: the last point
    (step: where the metrics end; without --metrics the largest last step of any), or the point at --at_step."""
    names = list(columns.metrics) or list(series)
    values, ends = {}, {}
    for name in names:
        points = series.get(name)
        if not points:
            values[name] = math.nan  # never written: missing
        elif columns.at_step is None:
            ends[name], values[name] = points[-1]
        else:
            values[name] = _value_at(points, columns.at_step, where, name)
    if columns.at_step is not None:
        return values, columns.at_step
    if columns.metrics and len(set(ends.values())) > 1:
        said = ", ".join(f"{m} at {s}" for m, s in list(ends.items())[:4])
        raise ReadError(f"{where}: its metrics end at different steps ({said}). Fix: pass --at_step N, a step "
                        f"they all have")
    return values, max(ends.values()) if ends else None


def _value_at(points: list[tuple[int, float]], step: int, where: str, name: str) -> float:
    """The value written last at `step`; ReadError naming the steps nearest where there is none."""
    at = [v for s, v in points if s == step]
    if at:
        return at[-1]
    steps = sorted({s for s, _ in points})
    below, above = [s for s in steps if s < step], [s for s in steps if s > step]
    near = " and ".join(str(s) for s in (below[-1:] + above[:1]))
    raise ReadError(f"{where}: {name!r} has no value at step {step} (nearest steps: {near}). Fix: pass --at_step "
                    f"with a step every run has")


# ---- TensorBoard ----

def _read_tensorboard(root: Path, event_dirs: list[Path], columns: Columns, pattern: re.Pattern | None
                      ) -> list[Run]:
    """One Run per folder holding event files; its name (the path below `root`, "." for `root`) gives condition
    and seed through --run_name."""
    if pattern is None or "condition" not in pattern.groupindex:
        raise ReadError(f"{root} is a TensorBoard folder: its runs' conditions and seeds come from their folder "
                        f"names. Fix: pass --run_name with groups, e.g. --run_name {TB_EXAMPLE}")
    runs = []
    for folder in event_dirs:
        where = str(folder)
        named = _from_name(pattern, folder.relative_to(root).as_posix(), where)
        values, step = _pick(_tensorboard_series(folder, where), columns, where)
        runs.append(Run(_condition(named.get("condition"), where, "--run_name"), _seed(named.get("seed")), values,
                        step, where))
    return runs


def _tensorboard_series(folder: Path, where: str) -> dict[str, list[tuple[int, float]]]:
    """Each scalar tag's (step, value) points, read by TensorBoard's EventAccumulator (all kept): plain scalars
    (SummaryWriter.add_scalar) and the scalars plugin's one-number tensors (add_scalar(new_style=True), tf.summary)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    try:
        acc.Reload()
    except Exception as e:  # TensorBoard's own errors (DataLossError, ...) share no base class but Exception
        raise ReadError(f"{where}: its event files cannot be read ({cut(str(e), 80)}). Fix: check the files, or "
                        f"leave this folder out") from None
    tags = acc.Tags()
    series = {tag: [(e.step, float(e.value)) for e in acc.Scalars(tag)] for tag in tags.get("scalars", [])}
    for tag in tags.get("tensors", []):
        if tag in series or acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue
        arrays = [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
        if arrays and all(a.shape == () for _, a in arrays):
            series[tag] = [(step, float(a)) for step, a in arrays]
    return series


# ---- trackio ----

@contextmanager
def _trackio_at(folder: Path) -> Iterator:
    """trackio's SQLiteStorage reading `folder`, and trackio as it was after. trackio takes its folder from
    TRACKIO_DIR once, at import, into module globals (0.43), so they are pointed here for the while (as
    training.tracking does) and back; its download of a Hub dataset or bucket into the folder stays off."""
    import trackio  # noqa: F401  (imports the modules whose globals are pointed)
    from trackio.sqlite_storage import SQLiteStorage
    saved = []
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "trackio" or name.startswith("trackio.")):
            for attr, path in (("TRACKIO_DIR", folder), ("MEDIA_DIR", folder / "media"),
                               ("ARTIFACTS_DIR", folder / "artifacts")):
                if isinstance(vars(module).get(attr), Path):
                    saved.append((module, attr, vars(module)[attr]))
                    setattr(module, attr, path)
    attempted = SQLiteStorage._dataset_import_attempted
    SQLiteStorage._dataset_import_attempted = True
    try:
        yield SQLiteStorage
    finally:
        SQLiteStorage._dataset_import_attempted = attempted
        for module, attr, old in saved:
            setattr(module, attr, old)


def _read_trackio(given: Path, folder: Path, projects: list[str], columns: Columns, pattern: re.Pattern | None
                  ) -> list[Run]:
    """Every run of each project (a .db file in `folder`), read by trackio's SQLiteStorage: condition and seed
    from its config's keys, else --run_name over its name; each metric's last value, or its value at --at_step."""
    runs = []
    with _trackio_at(folder) as storage:
        for project in projects:
            try:
                for record in storage.get_run_records(project):
                    config = storage.get_run_config(project, run=record["name"], run_id=record["id"]) or {}
                    logs = storage.get_logs(project, run=record["name"], run_id=record["id"])
                    where = f"trackio project {project} run {record['name']} in {folder}"
                    runs.append(_trackio_run(flatten(config), logs, columns, pattern, record["name"], where))
            except sqlite3.DatabaseError as e:
                raise ReadError(f"{folder / (project + '.db')}: not a trackio store ({e}). Fix: give trackio's folder "
                                f"or a project's .db file") from None
    if not runs:
        raise ReadError(f"{given} holds no trackio runs. Fix: give the folder trackio logged into (TRACKIO_DIR)")
    return runs


def _trackio_run(config: dict, logs: list[dict], columns: Columns, pattern: re.Pattern | None, name: str,
                 where: str) -> Run:
    """One trackio run from its flattened config and its logs (dicts of metric -> value, with step, timestamp)."""
    named = _from_name(pattern, name, where) if pattern else {}
    if columns.condition in config:
        condition = config[columns.condition]
    elif "condition" in named:
        condition = named["condition"]
    else:
        raise ReadError(f"{where}: its config has no key {shown(columns.condition)} (its keys: "
                        f"{cut(', '.join(config), 80)}). Fix: name it with --condition, or pass --run_name "
                        f"{TB_EXAMPLE}")
    if columns.seed in config:
        seed = config[columns.seed]
    elif pattern is not None:
        seed = named.get("seed")  # a pattern without a seed group: unknown
    else:
        raise ReadError(f"{where}: its config has no key {shown(columns.seed)} (its keys: {cut(', '.join(config), 80)})"
                        f". Fix: name it with --seed, or pass --run_name {TB_EXAMPLE}")
    series: dict[str, list[tuple[int, float]]] = {}
    for log in logs:
        for key, value in flatten(log).items():
            if key not in ("step", "timestamp") and _is_number(value):
                series.setdefault(key, []).append((int(log["step"]), float(value)))
    values, step = _pick(series, columns, where)
    return Run(_condition(condition, where, f"key {columns.condition!r}"), _seed(seed), values, step, where)

