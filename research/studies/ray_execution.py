"""A study's runs as Ray tasks (executors.execute with --ray), each training its run folder under that folder's own lock
and returning its summary. A task whose worker is lost is retried up to MAX_RETRIES times, resuming from the run's
newest checkpoint; a user error is not retried and reaches the driver in the in-process executor's words. Ctrl-C
cancels the tasks, checkpoints kept; any other error of Ray's own ends the study in one line (ray_failed, raised by
train_on_ray, the one boundary). The only module that imports ray, and only inside its functions."""
from __future__ import annotations

import os
import re
import socket
import sys
import time
from pathlib import Path

from tqdm import tqdm

from configs import ConfigError
from research.studies.cores import own_cores
from research.studies.storage import Storage, fetch, run_stores, train_stored
from research.studies.study_runs import StudyError, StudyRun, Train, run_failed
from utils.deadline import first_line
from utils.errors import Interrupted, UserError, cut
from utils.runtime import usable_cores

LOCAL_RAY = "local"  # --ray without an address: a Ray started for the study
MAX_RETRIES = 3  # a lost worker's task is run again this many times at most (system failures only)
_WAIT_S = 0.5  # how often the driver looks for started runs while it waits
_CANCEL_WAIT_S = 60  # after Ctrl-C, how long the driver waits for the cancelled runs to stop (their locks released)
_AUTH_MODE = "RAY_AUTH_MODE"  # ray.init sets it in this process's environment
# The health checks of a Ray started here (Ray 2.60's _system_config; its defaults: a check every 3 s, 10 s to
# answer, dead after 5 misses). On a busy small host the node's own raylet answered too slowly and the head took
# its only node for dead, failing every run; here a node is dead after 20 checks in a row go unanswered, at least
# 100 s (a check every 5 s, each given 30 s). A cluster started by `ray start` keeps its own settings.
LOCAL_HEALTH_CHECKS = {"health_check_period_ms": 5_000, "health_check_timeout_ms": 30_000,
                       "health_check_failure_threshold": 20}
ADDRESS = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")  # HOST:PORT, an IPv6 host in brackets
ADDRESS_FORMS = ("give HOST:PORT (the address `ray start --head` prints, e.g. 10.0.0.5:6379), auto (the cluster of "
                 "the node this runs on), or --ray alone for a Ray started here")


def check_address(address: str) -> None:
    """--ray's ADDRESS is LOCAL_RAY, auto or HOST:PORT (a port 1-65535); ConfigError in one line otherwise (Ray's own
    parse raised a ValueError of several lines, e.g. for an http:// address)."""
    if address in (LOCAL_RAY, "auto"):
        return
    match = ADDRESS.match(address)
    if not match or not 0 < int(match.group(1)) < 65536:
        raise ConfigError(f"--ray {cut(address, 100)}: not the address of a Ray cluster: {ADDRESS_FORMS} (nothing was "
                          f"started)")


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


def _train_task(run: StudyRun, index: int, events, train: Train, store=None) -> dict:
    """One run, in a Ray worker pinned to cores of its own (research.studies.cores): tells the driver where it
    started, trains (with --storage in this node's own folder: research.studies.storage.train_stored), returns the
    summary, its time and (`stored`) the stored files' list."""
    import ray
    with own_cores(ray.get_runtime_context().get_assigned_resources().get("CPU", 0)) as cores:
        where = _where() + (f", cores {','.join(map(str, cores))}" if cores else "")
        ray.get(events.put.remote(index, where))
        start = time.perf_counter()
        summary, stored = train_stored(run, train, store) if store else (train(run, None), None)
    return {"summary": summary, "where": where, "time_s": time.perf_counter() - start, "stored": stored}


def start_local_ray(num_cpus: int) -> None:
    """A new Ray on this machine (address "local": never one found running here, ray start's), without dashboard
    or worker logs on the driver, with LOCAL_HEALTH_CHECKS; the tests start theirs with it too."""
    import ray
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             _system_config=LOCAL_HEALTH_CHECKS)


def _connect(address: str) -> None:
    import ray
    if address == LOCAL_RAY:
        start_local_ray(usable_cores())
        return
    try:
        _reachable(address)
        ray.init(address=address, log_to_driver=False)
    except ConnectionError as e:
        raise ConfigError(f"--ray {address}: no Ray cluster answers there ({e}). Fix: `ray start --head` and pass the "
                          f"address it prints (with its token: docs/studies.md, On Ray), or --ray alone to start one "
                          f"here") from None
    except (ValueError, RuntimeError) as e:  # an address Ray refuses its own way (RAY_ADDRESS for auto, say)
        raise ConfigError(f"--ray {address}: Ray cannot connect there ({first_line(e)}): {ADDRESS_FORMS}") from None


def _reachable(address: str) -> None:
    """ConnectionError at once where nothing listens at HOST:PORT (Ray itself would retry for many minutes)."""
    if address == "auto":
        return  # the cluster Ray finds (RAY_ADDRESS, or the one this node belongs to)
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise ConnectionError(f"nothing listens at {address}: {e.strerror or e}") from None


def ray_failed(e: BaseException, out: Path, run: str = "") -> StudyError:
    """The one line of any error of Ray's own (ray.exceptions.RayError that is not a run's: a node taken for dead
    after missed health checks, an actor or worker lost, a task lost more often than Ray retries it, Ray's system
    error): what failed, and that the same command continues the study from what is kept. `run`: the run it befell,
    where one did."""
    where = f"in condition {run}: " if run else ""
    return StudyError(f"{where}Ray failed ({type(e).__name__}: {first_line(e)}); the finished conditions and every "
                      f"run's checkpoints in {out} are kept: the same command continues the study (with --ray or "
                      f"without; a node taken for dead on a busy machine is one cause: fewer runs at once, with a "
                      f"larger --cpus_per_run, load it less)")


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


def train_on_ray(runs: list[StudyRun], out: Path, address: str, *, train: Train, on_cpu: bool,
                 gpus_per_run: float | None, cpus_per_run: float | None, progress: bool = False,
                 storage: Storage | None = None) -> None:
    """Train every run as a Ray task calling `train(run, None)` (picklable: see Train), on a Ray started here
    (address LOCAL_RAY; a process already connected to Ray keeps its connection) or on the cluster at `address`;
    `on_cpu`: the runs ask for no GPU by default. One line per run as it starts, is retried, finishes or fails, and
    (`progress`) a bar over the runs, then the wall time and each run's time. `storage`: the --storage
    (check_ray_options), claimed for the study before anything is uploaded."""
    import ray
    owns = not ray.is_initialized()
    auth_mode = os.environ.get(_AUTH_MODE)
    try:  # the one boundary of Ray's own errors: one line (ray_failed)
        if owns:
            _connect(address)
        _run_all(runs, out, _resources(gpus_per_run, cpus_per_run, on_cpu), progress, train,
                 run_stores(storage, runs, out))
    except ray.exceptions.RayError as e:
        raise ray_failed(e, out) from None
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


def _run_all(runs: list[StudyRun], out: Path, options: dict, progress: bool, train: Train, stores: list) -> None:
    import ray
    start = time.perf_counter()
    events = ray.remote(num_cpus=0)(_Events).remote()
    task = ray.remote(_train_task).options(**options)
    pending = {task.remote(run, i, events, train, stores[i]): i for i, run in enumerate(runs)}
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
                        raise ray_failed(e, out, f"{runs[i].cond}, seed {runs[i].seed}") from None
                    times[i] = result["time_s"]
                    fetch(stores[i], result["stored"], runs[i].run_dir)  # --storage: the run's files into --out
                    say(f"{name(i)}: finished on {result['where']} in {result['time_s']:.1f} s")
                    bar.update()
        except ray.exceptions.RayError:  # Ray's own (train_on_ray words it): the other runs stop
            _cancel(pending)
            raise
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
