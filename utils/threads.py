"""How many CPU threads a run computes with, decided once per process (no torch: the rule is tested by hand).

Beside one busy process two threads keep about a quarter of their speed and one thread more than half, so, unless
the user says: --threads N (asked > 0) gives N; with OMP_NUM_THREADS set, the cores this process may use, shared
among torchrun's processes, at most that budget; else the cores that other processes left free when this process
first asked (/proc/stat over FREE_SAMPLE_S), shared among torchrun's processes, at least 1. The count can change a
bf16 run's values in the last bits, so the run's provenance records it and why (`cpu_threads`, `cpu_threads_why`),
and `--threads N` with the recorded N repeats the run bit for bit. The rule as a user meets it: docs/training.md,
"Devices and precision"; the measurements behind it: docs/speed.md, "A busy host".
"""
from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

FREE_SAMPLE_S = 0.2  # long enough to see a process that keeps a core busy, short beside importing torch


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count of this process and why, as the run's start line and provenance say it."""

    threads: int
    why: str  # 'asked (--threads)', 'OMP_NUM_THREADS=1', 'free cores: 1 of 2 (others kept 1.0 busy)'


def omp_budget(env: dict | os._Environ = os.environ) -> int | None:
    """OMP_NUM_THREADS as a positive count (OpenMP's nested form "4,2": the outer), None where unset or not one."""
    budget = str(env.get("OMP_NUM_THREADS", "")).split(",")[0].strip()
    return int(budget) if budget.isdigit() and int(budget) > 0 else None


def choose_threads(asked: int, cores: int, local_world_size: int, budget: int | None,
                   busy: float | None) -> ThreadChoice:
    """The rule of the module docstring, pure: `cores` this process may use, `budget` OMP_NUM_THREADS, `busy` how many
    of the cores other processes kept busy (None: not known)."""
    world = max(1, local_world_size)
    share = max(1, cores // world)
    if asked > 0:
        return ThreadChoice(asked, "asked (--threads)")
    if budget is not None:
        return ThreadChoice(min(share, budget), f"OMP_NUM_THREADS={budget}")
    if busy is None:
        return ThreadChoice(share, f"cores: {cores}" + ("" if share == 1 else " (load not readable)"))
    taken = min(cores - 1, int(busy + 0.5))  # a core busy half its time or more is another's
    free = cores - taken
    others = f" (others kept {busy:.1f} busy)" if taken else ""
    return ThreadChoice(max(1, min(share, free // world)), f"free cores: {free} of {cores}{others}")


def _core_times(ids: set[int]) -> dict[int, tuple[int, int]] | None:
    """(idle, total) jiffies of each core in `ids` from /proc/stat; None where it cannot be read (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in ids:
            ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal (guest is in user)
            out[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return out if set(out) == ids else None


def busy_cores(ids: set[int], seconds: float = FREE_SAMPLE_S) -> float | None:
    """How many of the cores `ids` were busy over `seconds` (summed fractions), while this thread sleeps; None where
    /proc/stat cannot be read."""
    before = _core_times(ids)
    if before is None:
        return None
    time.sleep(seconds)
    after = _core_times(ids)
    if after is None:
        return None
    busy = 0.0
    for core in ids:
        idle, total = (a - b for a, b in zip(after[core], before[core]))
        busy += 1 - idle / total if total > 0 else 0.0
    return busy


def usable_core_ids() -> list[int]:
    """The cores this process may run on (its affinity), in order; every core of the machine where the OS keeps no
    affinity (macOS, Windows)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


@functools.cache
def busy_at_start(ids: tuple[int, ...]) -> float | None:
    """busy_cores, measured once per process and set of cores: every run of a process (a study's, a test session's)
    takes the choice its first run took."""
    return busy_cores(set(ids))


def thread_choice(asked: int, local_world_size: int) -> ThreadChoice:
    """This process's facts put to choose_threads (the load sampled only where the rule reads it)."""
    ids = tuple(usable_core_ids())
    budget = omp_budget()
    one_each = len(ids) // max(1, local_world_size) <= 1  # one thread whatever the load: nothing to sample
    busy = busy_at_start(ids) if asked <= 0 and budget is None and not one_each else None
    return choose_threads(asked, len(ids), local_world_size, budget, busy)


def cpu_threads(provenance: dict) -> int | None:
    """The CPU threads a run computed with, where it trained on CPU (on a GPU they move no value); None otherwise."""
    on_cpu = str(provenance.get("device") or "").startswith("cpu")
    return provenance.get("cpu_threads") if on_cpu and isinstance(provenance.get("cpu_threads"), int) else None
