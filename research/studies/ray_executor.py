"""The Ray executor of a study's runs (--ray): each run is one Ray task that trains its run folder, returns its
summary.

The driver (research.studies.runner) holds the study folder's lock and writes study.json, the figures and the report
once every task is done; each task takes its own run folder's lock (training.run.train_run), so any number of
workers train runs of one study at once. A task whose worker is lost (process killed, node gone) is retried by Ray
up to MAX_RETRIES times and resumes from the run's newest checkpoint (train_condition resumes a folder that has
one); a task that fails on a user error is not retried, and its message reaches the driver as the in-process
executor would say it. Ctrl-C on the driver cancels the tasks; the checkpoints are kept and the same command
continues. This is the only module that imports ray, and only inside its functions.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from configs import ConfigError
from research.studies.runner import LOCAL_RAY, StudyRun, StudyError, run_failed, train_condition
from utils.errors import Interrupted, UserError
from utils.runtime import usable_cores

MAX_RETRIES = 3  # a lost worker's task is run again this many times at most (system failures only)
_WAIT_S = 0.5  # how often the driver looks for started runs while it waits
_CANCEL_WAIT_S = 60  # after Ctrl-C, how long the driver waits for the cancelled runs to stop (their locks released)
_AUTH_MODE = "RAY_AUTH_MODE"  # ray.init sets it in this process's environment


def check_options(gpus_per_run: float | None, cpus_per_run: float | None) -> None:
    """Ray is installed and the resources asked for can be asked of Ray, before anything is written."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("--ray needs Ray, which is not installed: pip install '.[ray]' (or pip install -r "
                          "requirements.txt), or leave --ray out to train the runs one after another")
    if cpus_per_run is not None and cpus_per_run <= 0:
        raise ConfigError(f"--cpus_per_run {cpus_per_run:g}: give a positive number of CPU cores per run, e.g. 1")
    if gpus_per_run is not None and (gpus_per_run < 0 or (gpus_per_run > 1 and gpus_per_run != int(gpus_per_run))):
        raise ConfigError(f"--gpus_per_run {gpus_per_run:g}: give a fraction up to 1 (runs sharing a GPU, e.g. 0.25), "
                          f"a whole number of GPUs, or 0")


class _Events:
    """A Ray actor the tasks tell when they start (on which worker); the driver takes what came since it last
    looked. A task started again by Ray after a lost worker tells it again: that is how the driver sees a retry."""

    def __init__(self):
        self.events: list[tuple[int, str]] = []

    def put(self, index: int, where: str) -> None:
        self.events.append((index, where))

    def take(self) -> list[tuple[int, str]]:
        events, self.events = self.events, []
        return events


def _where() -> str:
    """The worker a task runs on: its host and Ray node id (short)."""
    import ray
    return f"{socket.gethostname()} (node {ray.get_runtime_context().get_node_id()[:8]}, pid {os.getpid()})"


def train_study_run(run: StudyRun, *, replan_schedule: bool, logger: str, divergence_is_a_result: bool) -> dict | None:
    """A catalog study's run in a Ray worker: its folder's lock, its device and precision (this worker's), no bars."""
    return train_condition(run.cfg, run.run_dir, run.cond, progress=False, replan_schedule=replan_schedule,
                           divergence_is_a_result=divergence_is_a_result, logger=logger)


def _train_task(run: StudyRun, index: int, events, train: Callable[[StudyRun], dict | None]) -> dict:
    """One run, in a Ray worker: tells the driver where it started, trains, returns the summary and its time."""
    import ray
    where = _where()
    ray.get(events.put.remote(index, where))
    start = time.perf_counter()
    summary = train(run)
    return {"summary": summary, "where": where, "time_s": time.perf_counter() - start}


def _connect(address: str) -> None:
    import ray
    if address == LOCAL_RAY:
        # address "local": a new Ray for this study, never one found running on this machine (ray start's)
        ray.init(address="local", num_cpus=usable_cores(), include_dashboard=False, log_to_driver=False)
        return
    try:
        _reachable(address)
        ray.init(address=address, log_to_driver=False)
    except ConnectionError as e:
        raise ConfigError(f"--ray {address}: no Ray cluster answers there ({e}): start one with `ray start --head` "
                          f"and give the address it prints (a cluster with token authentication, ray start's default, "
                          f"also needs RAY_AUTH_MODE=token here and its token: docs/studies.md, On Ray), or give --ray "
                          f"alone to start one here") from None


def _reachable(address: str) -> None:
    """ConnectionError at once where nothing listens at host:port (Ray itself would retry for many minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", or an address Ray reads its own way
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise ConnectionError(f"nothing listens at {address}: {e.strerror or e}") from None


def _resources(gpus_per_run: float | None, cpus_per_run: float | None, on_cpu: bool) -> dict:
    """The task options for the cluster Ray is connected to; ConfigError where no node could ever run one task."""
    import ray
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if gpus_per_run is None:
        gpus_per_run = 1.0 if not on_cpu and any(n.get("GPU", 0) > 0 for n in nodes) else 0.0
    cpus_per_run = 1.0 if cpus_per_run is None else cpus_per_run
    if not any(n.get("CPU", 0) >= cpus_per_run and n.get("GPU", 0) >= gpus_per_run for n in nodes):
        largest = ", ".join(f"{n.get('CPU', 0):g} CPU / {n.get('GPU', 0):g} GPU" for n in nodes) or "no node"
        raise ConfigError(f"no node of the Ray cluster has {cpus_per_run:g} CPU core(s) and {gpus_per_run:g} GPU(s) "
                          f"for one run (its nodes: {largest}): give a smaller --cpus_per_run or --gpus_per_run "
                          f"(nothing was trained)")
    return {"num_cpus": cpus_per_run, "num_gpus": gpus_per_run, "max_retries": MAX_RETRIES,
            "retry_exceptions": False}


def train_on_ray(runs: list[StudyRun], out: Path, address: str, *, train: Callable[[StudyRun], dict | None],
                 on_cpu: bool, gpus_per_run: float | None, cpus_per_run: float | None, progress: bool = False) -> None:
    """Train every run as a Ray task calling `train(run)` (picklable: a module's function or a partial of one;
    train_study_run for a catalog study), on a Ray started here (address LOCAL_RAY; a process already connected to
    Ray keeps its connection) or on the cluster at `address`; `on_cpu`: the runs ask for no GPU by default. One line
    per run as it starts, is retried, finishes or fails, and (`progress`) a bar over the runs, then the wall time
    and each run's time."""
    import ray
    owns = not ray.is_initialized()
    auth_mode = os.environ.get(_AUTH_MODE)
    if owns:
        _connect(address)
    try:
        _run_all(runs, out, _resources(gpus_per_run, cpus_per_run, on_cpu), progress, train)
    finally:
        if owns:
            ray.shutdown()
            _restore_env(_AUTH_MODE, auth_mode)


def _restore_env(key: str, value: str | None) -> None:
    """ray.init sets RAY_AUTH_MODE in this process's environment and leaves it there after ray.shutdown: put back
    what was there, so that a later study in this process (or a process it starts) connects to a cluster as asked."""
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def _run_all(runs: list[StudyRun], out: Path, options: dict, progress: bool, train) -> None:
    import ray
    start = time.perf_counter()
    events = ray.remote(num_cpus=0)(_Events).remote()
    task = ray.remote(_train_task).options(**options)
    pending = {task.remote(run, i, events, train): i for i, run in enumerate(runs)}
    bar = tqdm(total=len(runs), disable=not progress, unit="run", desc="runs", dynamic_ncols=True)

    def say(line: str) -> None:  # a line above the bar (printed as it is, where there is none)
        bar.write(line)
        sys.stdout.flush()
    say(f"ray: {len(runs)} runs as tasks of {options['num_cpus']:g} CPU core(s) and {options['num_gpus']:g} GPU(s) "
          f"each, on {len([n for n in ray.nodes() if n.get('Alive')])} node(s)")
    starts: dict[int, int] = {}
    times: dict[int, float] = {}

    def name(i: int) -> str:
        return f"== {runs[i].cond} (seed {runs[i].seed}) -> {runs[i].run_dir}"

    def show_starts() -> None:
        for i, where in ray.get(events.take.remote()):
            starts[i] = starts.get(i, 0) + 1
            again = f" again (try {starts[i]}: its worker was lost, resuming from its newest checkpoint)" \
                if starts[i] > 1 else ""
            say(f"{name(i)}: started{again} on {where}")
    with bar:  # closed however the loop ends
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1, timeout=_WAIT_S)
                show_starts()
                for ref in done:
                    i = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:  # raised in the task: a user error is the study's
                        _cancel(pending)
                        cause = e.cause
                        if isinstance(cause, (UserError, OSError)):
                            say(f"{name(i)}: failed")
                            raise run_failed(runs[i], cause, out) from None
                        raise cause if isinstance(cause, BaseException) else e
                    except ray.exceptions.RayError as e:  # the worker lost more often than Ray retries
                        _cancel(pending)
                        say(f"{name(i)}: failed")
                        raise StudyError(f"in condition {runs[i].cond}, seed {runs[i].seed}: its Ray worker was lost "
                                         f"{MAX_RETRIES + 1} times ({type(e).__name__}: {str(e).splitlines()[0]}); its "
                                         f"checkpoints and the finished conditions in {out} are kept: the same command "
                                         f"continues the study") from None
                    times[i] = result["time_s"]
                    say(f"{name(i)}: finished on {result['where']} in {result['time_s']:.1f} s")
                    bar.update()
        except KeyboardInterrupt:
            _cancel(pending, wait_s=_CANCEL_WAIT_S)
            raise Interrupted(f"interrupted: the {len(pending)} unfinished run(s) on Ray were cancelled; their "
                              f"checkpoints and the finished conditions in {out} are kept: run the same command again "
                              f"to continue the study") from None
    print(f"ray: {len(runs)} runs in {time.perf_counter() - start:.1f} s wall time; each run: "
          + ", ".join(f"{runs[i].cond} seed {runs[i].seed} {t:.1f} s" for i, t in sorted(times.items())), flush=True)


def _cancel(pending: dict, wait_s: float = 0) -> None:
    """Stop the tasks still queued or running (a running one gets Ctrl-C: it stops as an interrupted run does, its
    checkpoints kept), and wait up to `wait_s` for them to end, so that no run still holds its folder when the
    driver ends (a second Ctrl-C stops the waiting)."""
    import ray
    for ref in pending:
        try:
            ray.cancel(ref)
        except Exception:  # noqa: BLE001 - a task that ended meanwhile cannot be cancelled; nothing to stop
            pass
    if wait_s and pending:
        try:
            ray.wait(list(pending), num_returns=len(pending), timeout=wait_s)
        except KeyboardInterrupt:
            pass
