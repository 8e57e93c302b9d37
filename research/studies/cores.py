"""A Ray task's cores of its own: each run's task pins its worker process to --cpus_per_run cores that no other task on
its node holds, as --parallel pins its workers (research.studies.pinned), so that runs sharing a node (or a GPU)
never share cores. research.studies.ray_execution alone uses it, in the task; it imports no ray.

A core is claimed with an exclusive, non-blocking lock (fcntl.flock) on a file of the node's user cache
(<cache>/cores/<core>.lock, utils.cache): the OS releases it when the process ends, killed too, so a lost worker
holds no core. A task asking a fraction of a core, or more cores than are free (a node that declares more CPUs to
Ray than it has, or cores held by another study), runs unpinned, as Ray runs it; its threads stay capped at its
CPUs (Ray's OMP_NUM_THREADS). When the run ends the worker's affinity is put back (Ray reuses its workers).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

from utils.cache import user_cache_root
from utils.io import open_no_follow

try:
    import fcntl
except ImportError:  # Windows: no flock, and no sched_setaffinity either
    fcntl = None


def _claim(n: int, cores: list[int]) -> list[tuple[int, int]]:
    """(core, lock fd) of the first `n` of `cores` no other process holds; [] where fewer are free."""
    folder = user_cache_root() / "cores"
    folder.mkdir(parents=True, exist_ok=True)
    held: list[tuple[int, int]] = []
    for core in cores:
        if len(held) == n:
            break
        fd = open_no_follow(folder / f"{core}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by another task
            os.close(fd)
            continue
        held.append((core, fd))
    if len(held) < n:
        _release(held)
        return []
    return held


def _release(held: list[tuple[int, int]]) -> None:
    for _, fd in held:
        os.close(fd)  # closing the file releases its flock


@contextlib.contextmanager
def own_cores(cpus: float) -> Iterator[tuple[int, ...]]:
    """Pin this process to `cpus` cores of its own while the block runs; yields them, () where it runs unpinned."""
    if fcntl is None or not hasattr(os, "sched_setaffinity") or cpus < 1 or cpus != int(cpus):
        yield ()
        return
    before = os.sched_getaffinity(0)
    try:
        held = _claim(int(cpus), sorted(before))
    except OSError:  # no lock folder to be had: unpinned, as Ray runs it
        held = []
    try:
        if held:
            os.sched_setaffinity(0, [core for core, _ in held])
        yield tuple(core for core, _ in held)
    finally:
        if held:
            os.sched_setaffinity(0, before)
        _release(held)
