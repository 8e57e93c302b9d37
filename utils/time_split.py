"""Where a run's or a study's wall time goes: seconds per phase, measured with time.perf_counter. No torch.

    times = TimeSplit()
    with times.phase("probes"):
        ...
    times.record()   # {"wall_s": ..., "train_steps": ..., ..., "rest": ...}: summary.json's and study.json's

One `TimeSplit` per run, which the trainer and the callbacks (StepInfo.times) add to. Phases nest and count once,
so the phases and `rest` add up to the wall time: docs/speed.md, "Where a study's time goes (issue 66)".
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Iterator, Mapping

from utils.formats import FormatError, Integer, Number, Obj, Opt, check

# The phases, in the order a line says them; `rest` is the wall time no other phase claims.
PHASES = ("train_steps", "probes", "validation", "gain_ablation", "writing", "figures", "rest")
LABELS = {"train_steps": "training steps", "probes": "probes", "validation": "validation",
          "gain_ablation": "gain ablation", "writing": "writing results", "figures": "figures", "rest": "the rest"}
MEASURED = PHASES[:-1]
CORE = ("train_steps", "probes")  # the work itself; the rest of the wall time is overhead

_SECONDS = Number("a number of seconds >= 0", nullable=False, ge=0, ok=math.isfinite)
# A time split as summary.json, a checkpoint's state.json and study.json hold it (study.json: summed over `runs`).
TIME_SPLIT = Obj({"wall_s": _SECONDS, **{name: _SECONDS for name in PHASES},
                  "runs": Opt(Integer("a count of runs (a whole number >= 0)", nullable=False, lo=0))},
                 "an object of seconds: wall_s and each phase's")


def is_record(value) -> bool:
    """Whether `value` is a time split as TIME_SPLIT declares it."""
    try:
        check(TIME_SPLIT, value)
    except FormatError:
        return False
    return True


class TimeSplit:
    """Seconds per phase of one run (or study) since it was made, plus what earlier sessions recorded (`restore`)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(MEASURED, 0.0)
        self._start = time.perf_counter()
        self._earlier_wall = 0.0
        self._open: list[list] = []  # [name, start, seconds of inner phases] of each phase now open, innermost last

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the time inside as `name`'s, less that of the phases opened inside it."""
        if name not in self.seconds:
            raise ValueError(f"no phase {name!r}: one of {', '.join(MEASURED)}")
        entry = [name, time.perf_counter(), 0.0]
        self._open.append(entry)
        try:
            yield
        finally:
            self._open.pop()
            spent = time.perf_counter() - entry[1]
            self.seconds[name] += spent - entry[2]
            if self._open:
                self._open[-1][2] += spent

    def add(self, name: str, seconds: float) -> None:
        """`seconds` measured elsewhere (the training loop times its steps itself), outside any open phase."""
        if name not in self.seconds:
            raise ValueError(f"no phase {name!r}: one of {', '.join(MEASURED)}")
        self.seconds[name] += seconds
        if self._open:
            self._open[-1][2] += seconds

    def wall(self) -> float:
        return self._earlier_wall + time.perf_counter() - self._start

    def record(self) -> dict[str, float]:
        """{"wall_s", and seconds per phase of PHASES}: `rest` is the wall time no phase claims."""
        wall = self.wall()
        return {"wall_s": wall, **self.seconds, "rest": max(0.0, wall - sum(self.seconds.values()))}

    def restore(self, record: Mapping[str, float] | None) -> None:
        """Add the seconds an earlier session recorded (a resumed run's checkpoint); None: nothing recorded."""
        if not record:
            return
        for name in MEASURED:
            self.seconds[name] += float(record.get(name, 0.0))
        self._earlier_wall += float(record.get("wall_s", 0.0))


def add_records(records: list[Mapping[str, float]]) -> dict[str, float]:
    """The sum of several records (a study's runs), field by field."""
    return {key: sum(float(r.get(key, 0.0)) for r in records) for key in ("wall_s", *PHASES)}


def overhead_share(record: Mapping[str, float]) -> float:
    """The share of the wall time outside the training steps and the probes' own time."""
    wall = record["wall_s"]
    return (wall - sum(record[k] for k in CORE)) / wall if wall > 0 else 0.0


def split_line(record: Mapping[str, float]) -> str:
    """One line: the wall time, each phase's seconds and share, and the overhead beside the steps and probes."""
    wall = record["wall_s"] or 1e-12
    parts = ", ".join(f"{LABELS[k]} {record[k]:.1f} s ({100 * record[k] / wall:.0f}%)" for k in PHASES)
    return (f"{record['wall_s']:.1f} s: {parts}; besides the steps and the probes "
            f"{100 * overhead_share(record):.1f}%")
