r"""Runs kept elsewhere, read into one record (Run: condition, seed, values, step, source) for qk-decide: long and wide
CSV/TSV tables (W&B runs-table exports among them), JSON lines, TensorBoard event folders and trackio stores, each
read with the stdlib or the tracker's own reader. A metric a run lacks is float('nan') in its values, never left
out, so the caller names it missing. Which field comes from where, per format: docs/decide.md.

    runs = read_runs(["runs.csv", "tb/"], Columns(run_name=r"(?P<condition>[^/]+)/seed(?P<seed>\d+)"))
"""
from __future__ import annotations

import csv
import json
import math
import re
import sqlite3
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from utils.errors import UserError, cut, os_fix, os_problem, shown

# The bookkeeping columns of a W&B runs-table export: never metrics unless named (Runtime is numeric, in seconds)
WANDB_BOOKKEEPING = ("Name", "State", "Notes", "User", "Tags", "Created", "Runtime", "Sweep")
WANDB_NAME = "Name"  # the column --run_name reads in a table
EVENTS = "events.out.tfevents.*"  # TensorBoard's event file names
OWN_RUN = ("config.json", "metrics.jsonl")  # what a run folder of this project holds
TB_EXAMPLE = r"'(?P<condition>[^/]+)/seed(?P<seed>\d+)'"
KINDS = "a .csv, .tsv or .jsonl file, a trackio .db, a TensorBoard folder or a trackio folder"
_INTEGER = re.compile(r"([+-]?\d+)(\.0*)?")  # "42", "-1", "42.0": a whole number


@dataclass(frozen=True)
class Run:
    """One run of one condition, as read."""
    condition: str  # the condition (arm) the run belongs to
    seed: int | str | None  # int where the text is a whole number ("42", "42.0"), else the text; None: unknown
    values: dict[str, float]  # metric name -> value as recorded; NaN: missing (or recorded NaN), inf kept as read
    step: int | None  # the step the values are at; None: not known (a table without a step column)
    source: str  # where it came from, for messages: "runs.csv row 3", "tb/A/seed0", "trackio project p run r in d"


class ReadError(UserError, ValueError):
    """A file or folder qk-decide cannot read as runs; the message names it, the problem and the fix in one line."""


@dataclass(frozen=True)
class Columns:
    """Where each field of a Run is read from (the names of qk-decide's options in brackets)."""
    condition: str = "condition"  # column / config key / JSON key holding the condition (--condition)
    seed: str = "seed"  # ... holding the seed (--seed)
    step: str | None = "step"  # ... holding the step, if present; an absent column: step None
    metrics: tuple[str, ...] = ()  # metrics to read; (): every numeric column/key/tag but condition, seed, step
    wide: str | None = None  # a wide table: the metric its cells hold (seed column + one column per condition)
    run_name: str | None = None  # regex with groups condition/seed, searched in a run's name (--run_name)
    at_step: int | None = None  # the values at this step (else each metric's last, and step = the last step)


# The reader of this project's own run folders (config.json + metrics.jsonl), set by the module that has one;
# until then such a folder is a ReadError saying so.
OWN_READER: Callable[[Path, Columns], list[Run]] | None = None


def read_runs(paths: list[str | Path], columns: Columns = Columns()) -> list[Run]:
    """Every run of every path, in the paths' order (a file's rows in order, a folder's runs by name). ReadError,
    one line, for a path that cannot be read as runs."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    pattern = _name_pattern(columns)
    runs: list[Run] = []
    for path in paths:
        runs += _read_path(Path(path), columns, pattern)
    return runs


def _read_path(path: Path, columns: Columns, pattern: re.Pattern | None) -> list[Run]:
    """The runs of one path, by its kind: a folder by what it holds, a file by its extension."""
    if not path.exists():
        raise ReadError(f"{path}: no such file or folder. Fix: check the path (give {KINDS})")
    if path.is_dir():
        return _read_folder(path, columns, pattern)
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return _at_step(_read_table(path, columns, pattern, "\t" if suffix == ".tsv" else ","), path, columns)
    if suffix == ".jsonl":
        return _at_step(_read_jsonl(path, columns), path, columns)
    if suffix == ".db":
        return _read_trackio(path, path.parent, [path.stem], columns, pattern)
    raise ReadError(f"{path}: qk-decide does not read {suffix or 'files without an extension'}. Fix: give {KINDS}")


def _read_folder(path: Path, columns: Columns, pattern: re.Pattern | None) -> list[Run]:
    """A run folder of this project (checked first: it may hold a tensorboard/ or trackio/ folder of its own),
    else a TensorBoard folder, a trackio folder, or a folder of this project's run folders."""
    if _is_own_run(path):
        return _read_own(path, columns)
    event_dirs = sorted({p.parent for p in path.rglob(EVENTS) if p.is_file()})
    if event_dirs:
        return _read_tensorboard(path, event_dirs, columns, pattern)
    databases = sorted(p for p in path.glob("*.db") if p.is_file())
    if databases:
        return _read_trackio(path, path, [p.stem for p in databases], columns, pattern)
    if any(_is_own_run(p.parent) for p in path.rglob(OWN_RUN[1])):
        return _read_own(path, columns)
    raise ReadError(f"{path}: a folder without TensorBoard event files ({EVENTS}), trackio .db files or run folders "
                    f"of this project. Fix: give {KINDS}")


def _is_own_run(folder: Path) -> bool:
    return all((folder / name).is_file() for name in OWN_RUN)


def _read_own(path: Path, columns: Columns) -> list[Run]:
    """This project's run folders, through OWN_READER."""
    if OWN_READER is None:
        raise ReadError(f"{path} is a run folder of this project (or holds some), whose reader is not loaded. Fix: "
                        f"run qk-decide itself, which reads them, or export the runs to a CSV")
    return OWN_READER(path, columns)


# ---- names: a regex over a run's name ----

def _name_pattern(columns: Columns) -> re.Pattern | None:
    """--run_name compiled; ReadError where it is no regex or has neither group."""
    if columns.run_name is None:
        return None
    try:
        pattern = re.compile(columns.run_name)
    except re.error as e:
        raise ReadError(f"--run_name {shown(columns.run_name)} is not a regular expression ({e}). Fix: e.g. "
                        f"--run_name {TB_EXAMPLE}") from None
    if not {"condition", "seed"} & set(pattern.groupindex):
        raise ReadError(f"--run_name {shown(columns.run_name)} has no group (?P<condition>...) or (?P<seed>...). Fix: "
                        f"name the parts, e.g. --run_name {TB_EXAMPLE}")
    return pattern


def _from_name(pattern: re.Pattern, name: str, where: str) -> dict[str, str | None]:
    """The groups of --run_name searched in a run's name; ReadError where it does not match."""
    found = pattern.search(name)
    if found is None:
        raise ReadError(f"{where}: --run_name {shown(pattern.pattern)} does not match its name {shown(name)}. Fix: "
                        f"widen the pattern, or leave this run out")
    return found.groupdict()


def _condition(value, where: str, field: str) -> str:
    """A condition's text; ReadError where it is empty or missing."""
    text = "" if value is None else str(value).strip()
    if not text:
        raise ReadError(f"{where}: no condition ({field} is empty). Fix: fill it in, or leave this run out")
    return text


def _seed(value) -> int | str | None:
    """A seed: an int where the value is a whole number, else its text; None where empty or missing."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    text = str(value).strip()
    if not text:
        return None
    whole = _INTEGER.fullmatch(text)
    return int(whole[1]) if whole else text


def _step(value, where: str) -> int | None:
    """A step (a whole number of optimizer steps); None where empty or missing; ReadError where not whole."""
    seed = _seed(value)
    if seed is None or isinstance(seed, int):
        return seed
    raise ReadError(f"{where}: step {shown(value)} is not a whole number. Fix: write the step as an integer, or "
                    f"name another step column with --step")


def _number(value, where: str, metric: str) -> float:
    """A metric's value as a float (an empty cell or null: NaN, the missing value; "nan", "inf" as written)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return math.nan
    if isinstance(value, bool):
        value = str(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ReadError(f"{where}, {metric!r}: {shown(value)} is not a number. Fix: correct it, leave it empty for a "
                        f"missing value, or read other metrics with --metrics") from None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _at_step(runs: list[Run], path: Path, columns: Columns) -> list[Run]:
    """A table's runs at --at_step, where it has a step column (a table without one is kept whole: step None)."""
    if columns.at_step is None or all(r.step is None for r in runs):
        return runs
    kept = [r for r in runs if r.step == columns.at_step]
    if not kept:
        steps = sorted({r.step for r in runs if r.step is not None})
        raise ReadError(f"{path}: no run at step {columns.at_step} (its steps: {_steps_text(steps)}). Fix: pass "
                        f"--at_step with one of its steps")
    return kept


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 6 else f"{', '.join(map(str, steps[:3]))}, ..., {steps[-1]}"


# ---- tables: CSV, TSV, W&B exports ----

def _read_table(path: Path, columns: Columns, pattern: re.Pattern | None, delimiter: str) -> list[Run]:
    """A long table (one row per run) or, with columns.wide, a wide one (one row per seed)."""
    rows = _table_rows(path, delimiter)
    header = [name.strip() for name in rows[0][1]]
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise ReadError(f"{path}: column {shown(twice[0])} appears twice in the header. Fix: rename one of them")
    records = []
    for n, row in rows[1:]:
        if len(row) != len(header):
            raise ReadError(f"{path} row {n} has {len(row)} cells, the header {len(header)}. Fix: give every row one "
                            f"cell per column (empty for a missing value)")
        records.append((n, dict(zip(header, row))))
    if not records:
        raise ReadError(f"{path} has a header but no rows. Fix: export the runs' rows too")
    if columns.wide is not None:
        return _wide_runs(path, header, records, columns)
    return _long_runs(path, header, records, columns, pattern)


def _table_rows(path: Path, delimiter: str) -> list[tuple[int, list[str]]]:
    """(row number, cells) of each row that is not blank; the header is row 1 (the number is the line a row ends
    on, the spreadsheet's row number where no cell spans lines)."""
    reader = None
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, delimiter=delimiter)
            rows = [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]
    except UnicodeDecodeError as e:
        raise ReadError(f"{path} is not UTF-8 text (byte {e.start}). Fix: save it as UTF-8") from None
    except csv.Error as e:
        raise ReadError(f"{path} row {reader.line_num if reader else 1}: {e}. Fix: correct the quoting there") from None
    except OSError as e:
        raise ReadError(f"{path} cannot be read: {os_problem(e)}. Fix: {os_fix(e, reading=True)}") from None
    if not rows:
        raise ReadError(f"{path} is empty. Fix: give a table with a header row and one row per run")
    return rows


def _missing_columns(path: Path, header: list[str], wanted: list[str], fix: str) -> None:
    """ReadError naming the first column of `wanted` the header lacks, and the columns it has."""
    absent = [name for name in wanted if name not in header]
    if absent:
        raise ReadError(f"{path} has no column {shown(absent[0])} (its columns: {cut(', '.join(header), 80)}). "
                        f"Fix: {fix}")


def _long_runs(path: Path, header: list[str], records: list, columns: Columns, pattern: re.Pattern | None
               ) -> list[Run]:
    """One Run per row; condition and seed from their columns, or from --run_name over the Name column."""
    name_col = WANDB_NAME if pattern and WANDB_NAME in header else None  # a table without one: its columns
    groups = set(pattern.groupindex) if name_col else set()
    condition_col = None if "condition" in groups else columns.condition
    seed_col = None if "seed" in groups else columns.seed
    wanted = [c for c in (condition_col, seed_col) if c]
    _missing_columns(path, header, wanted, "name the condition and seed columns with --condition and --seed (or "
                                           "--run_name over a Name column)")
    step_col = columns.step if columns.step in header else None
    if columns.metrics:
        _missing_columns(path, header, list(columns.metrics), "name metrics the table has with --metrics")
        metrics = list(columns.metrics)
    else:
        skip = {columns.condition, columns.seed, columns.step, name_col, *WANDB_BOOKKEEPING}
        metrics = [c for c in header if c not in skip and _numeric_column([r[c] for _, r in records])]
    runs = []
    for n, record in records:
        where = f"{path} row {n}"
        named = _from_name(pattern, record[name_col], where) if name_col else {}
        condition = named.get("condition") if condition_col is None else record[condition_col]
        seed = named.get("seed") if seed_col is None else record[seed_col]
        runs.append(Run(_condition(condition, where, f"column {condition_col!r}" if condition_col else "--run_name"),
                        _seed(seed), {m: _number(record[m], where, m) for m in metrics},
                        _step(record[step_col], where) if step_col else None, where))
    return runs


def _numeric_column(cells: list[str]) -> bool:
    """A metric by default: a column with a number in some cell and nothing else but empty cells."""
    filled = [c for c in cells if c.strip()]
    if not filled:
        return False
    try:
        [float(c) for c in filled]
    except ValueError:
        return False
    return True


def _wide_runs(path: Path, header: list[str], records: list, columns: Columns) -> list[Run]:
    """One Run per filled cell of a wide table: the seed column, an optional step column, one column per condition
    holding its value of metric columns.wide."""
    _missing_columns(path, header, [columns.seed], "name the seed column with --seed")
    step_col = columns.step if columns.step in header else None
    conditions = [c for c in header if c not in (columns.seed, step_col)]
    if not conditions:
        raise ReadError(f"{path} has no condition columns beside {columns.seed!r}. Fix: give one column per condition")
    runs = []
    for n, record in records:
        where = f"{path} row {n}"
        seed, step = _seed(record[columns.seed]), _step(record[step_col], where) if step_col else None
        runs += [Run(c, seed, {columns.wide: _number(record[c], where, c)}, step, f"{where} column {c!r}")
                 for c in conditions if record[c].strip()]
    return runs


# ---- JSON lines ----

def _read_jsonl(path: Path, columns: Columns) -> list[Run]:
    """One Run per line: a JSON object (nested objects flattened as "a/b") with the condition, seed and step keys."""
    objects = _json_objects(path)
    keys = list(dict.fromkeys(k for _, obj in objects for k in obj))
    for key in (columns.condition, columns.seed):
        if key not in keys:
            raise ReadError(f"{path}: no line has the key {shown(key)} (its keys: {cut(', '.join(keys), 80)}). Fix: "
                            f"name the condition and seed keys with --condition and --seed")
    if columns.metrics:
        absent = [m for m in columns.metrics if m not in keys]
        if absent:
            raise ReadError(f"{path}: no line has the metric {shown(absent[0])} (its keys: {cut(', '.join(keys), 80)})."
                            f" Fix: name metrics it has with --metrics")
        metrics = list(columns.metrics)
    else:
        skip = {columns.condition, columns.seed, columns.step}
        metrics = [k for k in keys if k not in skip and _numeric_key([obj.get(k) for _, obj in objects])]
    runs = []
    for n, obj in objects:
        where = f"{path} line {n}"
        runs.append(Run(_condition(obj.get(columns.condition), where, f"key {columns.condition!r}"),
                        _seed(obj.get(columns.seed)), {m: _number(obj.get(m), where, m) for m in metrics},
                        _step(obj.get(columns.step), where) if columns.step else None, where))
    return runs


def _json_objects(path: Path) -> list[tuple[int, dict]]:
    """(line number, flattened object) of each line that is not blank; ReadError naming a line that is no object."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ReadError(f"{path} is not UTF-8 text (byte {e.start}). Fix: save it as UTF-8") from None
    except OSError as e:
        raise ReadError(f"{path} cannot be read: {os_problem(e)}. Fix: {os_fix(e, reading=True)}") from None
    objects = []
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ReadError(f"{path} line {n} is not JSON ({e.msg}, column {e.colno}). Fix: one JSON object per "
                            f"line") from None
        if not isinstance(obj, dict):
            raise ReadError(f"{path} line {n} is a JSON {type(obj).__name__}, not an object. Fix: one JSON object "
                            f"per line, e.g. {{\"condition\": \"A\", \"seed\": 0, \"loss\": 2.5}}")
        objects.append((n, flatten(obj)))
    if not objects:
        raise ReadError(f"{path} is empty. Fix: give one JSON object per run and line")
    return objects


def flatten(obj: dict, prefix: str = "") -> dict:
    """A nested dict as one level, its keys joined by "/": {"val": {"loss": 2}} -> {"val/loss": 2}."""
    out = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "/"))
        else:
            out[name] = value
    return out


def _numeric_key(values: list) -> bool:
    """A metric by default: a key with a number in some line and nothing else but null or absence."""
    present = [v for v in values if v is not None]
    return bool(present) and all(_is_number(v) for v in present)


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
