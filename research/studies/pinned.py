"""Jobs side by side on this machine, each worker process pinned to its own cores: how a study's runs share a small
CPU host without Ray (research.studies.executors, --parallel).

Each worker is a fresh (spawned) interpreter pinned with os.sched_setaffinity to its share of the cores
(`core_groups`), so its runs' torch threads keep to that share. A worker takes one job at a time while nothing has
failed and reports each job's start and end as an `Event`; its stdout is dropped, its stderr kept. A worker whose
driver is gone interrupts its job as Ctrl-C would. This module knows nothing of studies (docs/studies.md, "Side by
side on one machine").
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from typing import Callable, Iterator

from utils.runtime import usable_core_ids

_WAIT_S = 0.5  # how often the driver looks for workers that ended without a word
_ORPHAN_EXIT_S = 120  # a worker whose driver is gone: how long its interrupted job may take to stop


def core_groups(cores: list[int], workers: int) -> list[tuple[int, ...]]:
    """`cores` in `workers` contiguous groups of sizes as even as can be, the larger first: [0, 1, 2] in 2 ->
    [(0, 1), (2,)]. Needs 1 <= workers <= len(cores)."""
    size, extra = divmod(len(cores), workers)
    groups, start = [], 0
    for w in range(workers):
        end = start + size + (w < extra)
        groups.append(tuple(cores[start:end]))
        start = end
    return groups


@dataclasses.dataclass(frozen=True)
class Event:
    """What became of job `index` on worker `worker` (pinned to `cores`): "started", "finished" (`time_s`, its wall
    time) or "failed" (`error`, the exception it raised, whole where it pickles, else a RuntimeError; `trace`, its
    traceback as text); "lost": the worker ended without a word while running it (`error` says how)."""
    kind: str
    index: int
    worker: int
    cores: tuple[int, ...]
    time_s: float = 0.0
    error: BaseException | None = None
    trace: str = ""


def run_pinned(jobs: list, fn: Callable, workers: int, stop: Callable[[Event], bool]) -> Iterator[Event]:
    """Call fn(job) for every job in `workers` processes pinned to core_groups(usable_core_ids(), workers), one job
    at a time each, yielding every Event as it comes. After an Event for which `stop` is true no further job is
    handed out; those running end as they end. `fn` and every job must pickle (a module's function, or a
    functools.partial of one). Ended before every job is (Ctrl-C, which reaches the workers too, or the generator
    closed), it gives the workers still running SIGINT after a moment, and waits for them."""
    ctx = multiprocessing.get_context("spawn")
    tasks, events = ctx.Queue(), ctx.Queue()
    groups = core_groups(usable_core_ids(), workers)
    procs = [ctx.Process(target=_worker, args=(w, cores, fn, tasks, events), daemon=True)
             for w, cores in enumerate(groups)]
    for p in procs:
        p.start()
    todo = list(enumerate(jobs))
    given, running, stopping = set(), {}, False  # given: the jobs handed out, not yet ended; running: {worker: job}

    def give() -> None:
        index, job = todo.pop(0)
        tasks.put((index, job))
        given.add(index)
    try:
        while todo and len(given) < len(procs):  # one job a worker; then one more as each ends
            give()
        while given:
            try:
                arrived = [events.get(timeout=_WAIT_S)]
            except queue.Empty:
                arrived = [Event("lost", job, w, groups[w], error=RuntimeError(_ended(procs[w])))
                           for w, job in running.items() if procs[w].exitcode is not None]
                if not arrived and not any(p.is_alive() for p in procs):  # none left to take the jobs given
                    arrived = [Event("lost", index, -1, (), error=RuntimeError("every worker process ended before "
                                                                               "it could take the run"))
                               for index in sorted(given)]
            for event in arrived:
                if event.kind == "started":
                    running[event.worker] = event.index
                else:
                    running.pop(event.worker, None)
                    given.discard(event.index)
                stopping = stopping or stop(event)
                if not stopping and event.kind != "started" and todo:
                    give()
                yield event
    finally:  # however it ends: Ctrl-C here or in the caller, the caller's error, or every job done
        if given:
            _interrupt(procs)
        for _ in procs:
            tasks.put(None)  # a waiting worker ends at None
        for p in procs:
            p.join(timeout=_ORPHAN_EXIT_S)
            if p.is_alive():
                p.terminate()


def _ended(proc) -> str:
    """How a worker process ended, in words."""
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            return f"its worker process (pid {proc.pid}) was killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"its worker process (pid {proc.pid}) ended with exit status {code}"


def _interrupt(procs: list, grace_s: float = 5.0) -> None:
    """After Ctrl-C: give the workers still alive `grace_s` to stop on the Ctrl-C the terminal sent them too, then
    SIGINT (a driver interrupted alone); a second Ctrl-C here stops the waiting."""
    try:
        deadline = time.monotonic() + grace_s
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGINT)
    except KeyboardInterrupt:
        pass


def _worker(worker: int, cores: tuple[int, ...], fn: Callable, tasks, events) -> None:
    """One worker process: pinned to `cores`, stdout dropped, jobs until None; a job that raises is reported and
    the worker waits for the next (the driver decides); Ctrl-C ends it."""
    threading.Thread(target=_end_when_orphaned, args=(events,), daemon=True).start()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    else:  # no affinity to follow (macOS): the threads' outside budget says the share instead
        os.environ.setdefault("OMP_NUM_THREADS", str(len(cores)))
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the process's life
    try:
        while (item := _next_job(tasks)) is not None:
            index, job = item
            events.put(Event("started", index, worker, cores))
            start = time.perf_counter()
            try:
                fn(job)
            except BaseException as e:  # noqa: BLE001 - every way a job ends is the driver's to word
                events.put(Event("failed", index, worker, cores, time.perf_counter() - start, _portable(e),
                                 "".join(traceback.format_exception(e))))
                if not isinstance(e, Exception):
                    return  # Ctrl-C outside the job's own handling, or an exit
            else:
                events.put(Event("finished", index, worker, cores, time.perf_counter() - start))
    except KeyboardInterrupt:
        return  # while waiting for a job


def _next_job(tasks):
    """The next (index, job) from the driver, or None: the driver's end, or the driver gone."""
    parent = multiprocessing.parent_process()
    while True:
        try:
            return tasks.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return None


def _portable(e: BaseException) -> BaseException:
    """`e` where it survives pickling (the project's own errors do: utils.errors.PicklesWhole), else a RuntimeError
    naming it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any failure to pickle or rebuild
        return RuntimeError(f"{type(e).__name__}: {e}")


def _end_when_orphaned(events) -> None:
    """Wait for the driver to end; if this worker is still running then, interrupt its job as Ctrl-C would (the run
    stops at once, its checkpoints kept, its folder's lock released; the worker then takes no other job: _next_job),
    and end the process should that not end it."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    parent.join()
    events.cancel_join_thread()  # nobody reads the events any more
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(_ORPHAN_EXIT_S)
    os._exit(1)
