r"""Runs kept elsewhere, read into one record (Run: condition, seed, values, step, source) for qk-decide: long and wide
CSV/TSV tables (W&B runs-table exports among them), JSON lines, TensorBoard event folders and trackio stores, each
read with the stdlib or the tracker's own reader. A metric a run lacks is float('nan') in its values, never left
out, so the caller names it missing. Which field comes from where, per format: docs/decide.md.

    runs = read_runs(["runs.csv", "tb/"], Columns(run_name=r"(?P<condition>[^/]+)/seed(?P<seed>\d+)"))
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Callable

from research.decide.records import (Columns, ReadError, Run, _at_step, _condition, _from_name,
                                     _is_number, _name_pattern, _number, _seed, _step, flatten)
from research.decide.trackers import EVENTS, _read_tensorboard, _read_trackio
from utils.errors import cut, os_fix, os_problem, shown

__all__ = ["Columns", "ReadError", "Run", "read_runs", "flatten"]

# The bookkeeping columns of a W&B runs-table export: never metrics unless named (Runtime is numeric, in seconds)
WANDB_BOOKKEEPING = ("Name", "State", "Notes", "User", "Tags", "Created", "Runtime", "Sweep")
WANDB_NAME = "Name"  # the column --run_name reads in a table
OWN_RUN = ("config.json", "metrics.jsonl")  # what a run folder of this project holds
KINDS = "a .csv, .tsv or .jsonl file, a trackio .db, a TensorBoard folder or a trackio folder"


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




def _numeric_key(values: list) -> bool:
    """A metric by default: a key with a number in some line and nothing else but null or absence."""
    present = [v for v in values if v is not None]
    return bool(present) and all(_is_number(v) for v in present)


