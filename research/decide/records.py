"""The record qk-decide reads runs into (Run), its errors (ReadError), where each field is read from (Columns), and
the helpers every reader shares: a run's name through --run_name, a condition, a seed, a step and a metric's value
read from text, --at_step. research.decide.readers (tables, JSON lines) and research.decide.trackers (TensorBoard,
trackio) read through them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from utils.errors import UserError, shown

TB_EXAMPLE = r"'(?P<condition>[^/]+)/seed(?P<seed>\d+)'"
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
