"""How a study's runs are executed, for every study that trains: the catalog studies, study files and the spike
study (through research.studies.runner) and the fine-tuning study (research.studies.finetune) each build their runs
(`StudyRun`) and hand them with their own train function to `execute`, which trains them in this process one after
another, with --parallel P side by side in P worker processes pinned to their share of the cores
(research.studies.pinned: spawned, no Ray), or with --ray as Ray tasks, and reports a failed or interrupted run in
the same words every way. The driver alone writes study.json (its conditions: `results_paths`), the figures and the
report once every run is done.

On Ray each run is one Ray task that trains its run folder and returns its summary. The driver holds the study
folder's lock; each task takes its own run folder's lock (training.run.train_run), so any number of workers train
runs of one study at once. A task whose worker is lost (process killed, node gone) is retried by Ray up to
MAX_RETRIES times and resumes from the run's newest checkpoint (the catalog studies' train function resumes a folder
that has one); a task that fails on a user error is not retried, and its message reaches the driver as the
in-process executor would say it. Ctrl-C on the driver cancels the tasks; the checkpoints are kept and the same
command continues. Any other error of Ray's own (a node taken for dead, an actor or object lost, Ray's own failure)
ends the study in one line saying so (`ray_failed`, the one wording, raised by train_on_ray, the one boundary). This
is the only module that imports ray, and only inside its functions; of the studies' modules it imports pinned,
storage and cores alone (which import none). Each task pins its worker to --cpus_per_run cores of its own
(research.studies.cores). With --storage URI the nodes share no folder: each task trains in its node's own folder
through the storage and the driver writes the study folder (research.studies.storage).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import math
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Generic, TypeVar

from tqdm import tqdm

from configs import ConfigError
from research.results.vocabulary import RESULTS_FILE
from research.studies.cores import own_cores
from research.studies.pinned import Event, run_pinned
from research.studies.storage import Storage, check_storage, fetch, run_stores, train_stored
from training.errors import RunInterrupted
from utils.deadline import first_line
from utils.cli import positive_int
from utils.errors import Interrupted, UserError, cut, explain
from utils.runtime import Runtime, usable_cores

LOCAL_RAY = "local"  # --ray without an address: a Ray started for the study
_KEPT = "{run.cond} seed {run.seed}: finished earlier, kept"  # a run `execute` was told is finished
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


class StudyError(UserError):
    """A condition or the drawing failed; the message says which, why, and that the finished conditions are kept."""


Settings = TypeVar("Settings")  # a StudyRun's settings: its study's own type


@dataclasses.dataclass(frozen=True)
class StudyRun(Generic[Settings]):
    """One run of a study: its name in study.json (condition, or condition@rate), seed, settings and folder. The
    settings are what the study trains the run with and checks a kept run against: a catalog study's RunConfig, the
    fine-tuning study's record of its config, model and data (research.studies.finetune.run_record)."""
    cond: str
    seed: int
    cfg: Settings
    run_dir: Path
    # called with its folder after each checkpoint the run writes (--storage: research.studies.storage.RunSync)
    after_checkpoint: Callable[[Path], object] | None = None


# A study's train function: train(run, runtime) trains one run on `runtime`, the study's (settled once, in this
# process), or, given None, in a Ray worker: on that worker's device and precision, without progress bars. Returns
# the run's summary, if any. For Ray it is pickled: a module's function, or a functools.partial of one.
Train = Callable[[StudyRun, "Runtime | None"], object]


def run_failed(run: StudyRun, e: UserError | OSError, out: Path) -> StudyError:
    """The study's error for a run that failed on a user error: which run, why, and that the study continues."""
    return StudyError(f"in condition {run.cond}, seed {run.seed}: {explain(e)} (finished conditions in {out} are "
                      f"kept; once this is fixed, the same command continues the study)")


def results_paths(runs: list[StudyRun], out: Path) -> dict[str, list[str]]:
    """The conditions of study.json: each condition's results files, relative to the study folder, in run order."""
    paths: dict[str, list[str]] = {}
    for run in runs:
        paths.setdefault(run.cond, []).append(str((run.run_dir / RESULTS_FILE).relative_to(out)))
    return paths


def add_ray_args(p: argparse.ArgumentParser) -> None:
    """How the runs are executed, every study command's options (checked by check_ray_options): --parallel P,
    --ray [ADDRESS], --gpus_per_run, --cpus_per_run."""
    p.add_argument("--parallel", type=positive_int, default=1, metavar="P",
                   help="Train P runs at a time side by side, each in a worker process of its own pinned to its share "
                        "of the cores this process may use (on 2 cores, --parallel 2: two runs of one thread each), "
                        "without Ray; one line as each run starts and ends. A run's results are those it gives alone "
                        "on the same threads (--threads, or its share of the cores). Default: 1, one run after "
                        "another in this process on every core")
    p.add_argument("--ray", nargs="?", const=LOCAL_RAY, metavar="ADDRESS",
                   help="Train the study's runs as Ray tasks (pip install '.[ray]'), several at once: without ADDRESS "
                        "on a Ray started on this machine for the study, with ADDRESS (host:port, or auto) on that "
                        "running cluster, whose nodes must all see --out (docs/studies.md, On Ray). Default: the runs "
                        "train one after another in this process")
    p.add_argument("--gpus_per_run", type=float, metavar="G",
                   help="GPUs each run's Ray task asks for (with --ray); a fraction below 1 lets several runs share "
                        "one GPU. Default: 1 where the cluster has GPUs, else 0")
    p.add_argument("--cpus_per_run", type=float, metavar="C",
                   help="CPU cores each run's Ray task asks for (with --ray). Default: 1")
    p.add_argument("--storage", metavar="URI",
                   help="With --ray: where the runs keep their checkpoints and results as they train (file:///PATH, "
                        "s3://BUCKET/PATH, gs://BUCKET/PATH), so that the nodes need no shared folder: each task "
                        "trains in its node's own folder, a retried one resumes from the stored checkpoint on any "
                        "node, and this process writes --out (docs/studies.md, On Ray). Default: every node sees --out")


def check_ray_options(args: argparse.Namespace, study: str = "", kind: str = "",
                      out: Path | None = None) -> Storage | None:
    """--gpus_per_run and --cpus_per_run only with --ray; with --ray, Ray is installed, the address is one Ray connects
    to, and the resources asked for can be asked of Ray (finite numbers: Ray takes NaN and infinity), before anything
    is written and before Ray starts; --parallel without --ray, and at most one run a core. Imports no ray. With
    --storage: the storage for the study named `study` of `kind` writing `out` (research.studies.storage
    .check_storage: it serves no other study and no other tool owns it), for `execute`; None without."""
    parallel = getattr(args, "parallel", 1)
    if parallel > 1 and args.ray is not None:
        raise ConfigError(f"--parallel {parallel} trains the runs in worker processes on this machine, --ray as Ray "
                          f"tasks: give one of them (nothing was started)")
    cores = usable_cores()
    if parallel > cores:
        raise ConfigError(f"--parallel {parallel}: this process may use {cores} CPU core(s), and each "
                          f"run side by side takes at least one: give --parallel {cores} or fewer "
                          f"(nothing was started)")
    storage = getattr(args, "storage", None)
    if args.ray is None and storage is not None:
        raise ConfigError("--storage keeps the runs of Ray tasks on a cluster without a shared folder: add --ray, or "
                          "leave --storage out to train the runs one after another in this process")
    if args.ray is None:
        given = next((n for n in ("gpus_per_run", "cpus_per_run") if getattr(args, n) is not None), None)
        if given:
            raise ConfigError(f"--{given} sets the resources of each run's Ray task: add --ray, or leave --{given} "
                              f"out to train the runs one after another in this process")
        return None
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("--ray needs Ray, which is not installed: pip install '.[ray]' (or pip install -r "
                          "requirements.txt), or leave --ray out to train the runs one after another")
    check_address(args.ray)
    cpus_per_run, gpus_per_run = args.cpus_per_run, args.gpus_per_run
    for name, value in (("--cpus_per_run", cpus_per_run), ("--gpus_per_run", gpus_per_run)):
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"{name} {value:g}: give a finite number of {name[2:5].upper()}s per run, e.g. 1 "
                              f"(nothing was started)")
    if cpus_per_run is not None and cpus_per_run <= 0:
        raise ConfigError(f"--cpus_per_run {cpus_per_run:g}: give a positive number of CPU cores per run, e.g. 1")
    if gpus_per_run is not None and (gpus_per_run < 0 or (gpus_per_run > 1 and gpus_per_run != int(gpus_per_run))):
        raise ConfigError(f"--gpus_per_run {gpus_per_run:g}: give a fraction up to 1 (runs sharing a GPU, e.g. 0.25), "
                          f"a whole number of GPUs, or 0")
    if storage is None:
        return None
    if out is None:
        raise ValueError("check_ray_options: --storage needs the study and its --out")
    serves = Storage.of(storage, study, kind, out)
    check_storage(serves)  # last: it writes a marker file there, over the network
    return serves


def check_address(address: str) -> None:
    """--ray's ADDRESS is LOCAL_RAY, auto or HOST:PORT (a port 1-65535); ConfigError in one line otherwise (Ray's own
    parse raised a ValueError of several lines, e.g. for an http:// address)."""
    if address in (LOCAL_RAY, "auto"):
        return
    match = ADDRESS.match(address)
    if not match or not 0 < int(match.group(1)) < 65536:
        raise ConfigError(f"--ray {cut(address, 100)}: not the address of a Ray cluster: {ADDRESS_FORMS} (nothing was "
                          f"started)")


def execute(runs: list[StudyRun], out: Path, train: Train, *, runtime: Runtime, progress: bool,
            ray: str | None = None, gpus_per_run: float | None = None, cpus_per_run: float | None = None,
            on_cpu: bool = False, finished: Callable[[StudyRun], bool] | None = None, parallel: int = 1,
            storage: Storage | None = None) -> None:
    """Train `runs` with `train`, in their order in this process (`ray` None, `parallel` 1), `parallel` at a time in
    worker processes pinned to their cores (train_side_by_side), or as Ray tasks on the Ray at `ray` (LOCAL_RAY, auto
    or HOST:PORT; `on_cpu`: the runs ask for no GPU by default). `finished`, for a study that keeps its finished runs
    itself: asked of every run before any trains (it may refuse one), and a run it calls finished is kept, not
    trained; without it every run goes to `train` (the catalog studies' trainer resumes a finished run, training
    nothing). A run that fails on a user error ends the study in run_failed's words, every way.
    `progress`: a bar over the runs on Ray (in this process, the train function shows its own)."""
    done = [bool(finished and finished(run)) for run in runs]
    if ray is not None or parallel > 1:
        for run in (run for run, d in zip(runs, done) if d):
            print(_KEPT.format(run=run), flush=True)
        todo = [run for run, d in zip(runs, done) if not d]
        if todo and ray is not None:
            train_on_ray(todo, out, ray, train=train, on_cpu=on_cpu, gpus_per_run=gpus_per_run,
                         cpus_per_run=cpus_per_run, progress=progress, storage=storage)
        elif todo:
            train_side_by_side(todo, out, train, min(parallel, len(todo)))
        return
    for run, d in zip(runs, done):
        if d:
            print(_KEPT.format(run=run), flush=True)
            continue
        print(f"== {run.cond} (seed {run.seed}) -> {run.run_dir}", flush=True)
        try:
            train(run, runtime)
        except RunInterrupted as e:
            raise run_interrupted(run, e, out) from None
        except (UserError, OSError) as e:
            raise run_failed(run, e, out) from None


def run_interrupted(run: StudyRun, e: RunInterrupted, out: Path) -> Interrupted:
    """The study's Ctrl-C in a run: where the run stopped, what it keeps, and that the same command continues."""
    where = f"at step {e.step}" if e.step is not None else f"while {e.stage}"
    kept = f" (its checkpoint at step {e.checkpoint} is kept)" if e.checkpoint is not None else ""
    return Interrupted(f"interrupted in condition {run.cond}, seed {run.seed}, {where}{kept}. Finished conditions in "
                       f"{out} are kept: run the same command again to continue the study")


# Side by side, in worker processes pinned to their cores (research.studies.pinned)

def train_side_by_side(runs: list[StudyRun], out: Path, train: Train, workers: int) -> None:
    """Train every run as `train(run, None)` (picklable: see Train) in `workers` spawned processes, each pinned to its
    share of this process's cores, so that each run's threads follow its share; one line per run as it starts and
    ends, then the wall time and each run's time. A failed run (a user error, a bug, a lost worker) stops the handing
    out of runs; those running finish and are kept; then the study ends in one line naming the failed run."""
    start, times, failure = time.perf_counter(), {}, None
    print(f"parallel: {len(runs)} runs, {workers} at a time, each in a worker process pinned to its own core(s)",
          flush=True)
    try:
        with contextlib.closing(run_pinned([(run, train) for run in runs], _train_pinned, workers,
                                           stop=lambda event: event.kind in ("failed", "lost"))) as events:
            for event in events:
                run = runs[event.index]
                what = {"started": f"started on core(s) {','.join(map(str, event.cores))}",
                        "finished": f"finished in {event.time_s:.1f} s"}.get(event.kind, event.kind)
                print(f"== {run.cond} (seed {run.seed}) -> {run.run_dir}: {what}", flush=True)
                times.update({event.index: event.time_s} if event.kind == "finished" else {})
                failure = failure or (event if event.kind in ("failed", "lost") else None)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: the runs in progress were stopped, their checkpoints kept; the finished "
                          f"conditions in {out} are kept: run the same command again to continue the study") from None
    if failure:
        raise _side_by_side_failure(runs[failure.index], failure, out)
    print(f"parallel: {len(runs)} runs in {time.perf_counter() - start:.1f} s wall time; each run: "
          + ", ".join(f"{runs[i].cond} seed {runs[i].seed} {t:.1f} s" for i, t in sorted(times.items())), flush=True)


def _train_pinned(job: tuple[StudyRun, Train]) -> None:
    """One run in a worker process: on the worker's own runtime, without progress bars."""
    run, train = job
    train(run, None)


def _side_by_side_failure(run: StudyRun, event: Event, out: Path) -> BaseException:
    """The study's error for a run that failed in its worker, in the in-process executor's words where it has them."""
    e = event.error
    if isinstance(e, RunInterrupted):
        return run_interrupted(run, e, out)
    if isinstance(e, (UserError, OSError)):
        return run_failed(run, e, out)
    if event.kind == "lost":
        return StudyError(f"in condition {run.cond}, seed {run.seed}: {e} (finished conditions in {out} and the "
                          f"run's checkpoints are kept: the same command continues the study)")
    return RuntimeError(f"in condition {run.cond}, seed {run.seed}, in its worker process:\n{event.trace}")


# On Ray

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
        raise ConfigError(f"--ray {address}: no Ray cluster answers there ({e}): start one with `ray start --head` "
                          f"and give the address it prints (a cluster with token authentication, ray start's default, "
                          f"also needs RAY_AUTH_MODE=token here and its token: docs/studies.md, On Ray), or give --ray "
                          f"alone to start one here") from None
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
