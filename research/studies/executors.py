"""The one executor of every trained study's runs: the runner's studies and the fine-tuning study build their runs
(research.studies.study_runs) and hand them with their own train function to `execute`, which trains them here one
after another, with --parallel P side by side in P worker processes pinned to their share of the cores (.pinned, no
Ray), or with --ray as Ray tasks (.ray_execution), a failed or interrupted run worded alike every way. The driver alone
writes study.json (its conditions: `results_paths`), the figures and the report once every run is done."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import math
import time
from pathlib import Path
from typing import Callable

from configs import ConfigError
from research.results.vocabulary import RESULTS_FILE
from research.studies.pinned import Event, run_pinned
from research.studies.ray_execution import LOCAL_RAY, check_address, train_on_ray
from research.studies.storage import Storage, check_storage
from research.studies.study_runs import StudyError, StudyRun, Train, run_failed
from training.errors import RunInterrupted
from utils.cli import positive_int
from utils.errors import Interrupted, UserError
from utils.runtime import Runtime, usable_cores

_KEPT = "{run.cond} seed {run.seed}: finished earlier, kept"  # a run `execute` was told is finished


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


@dataclasses.dataclass(frozen=True)
class ExecuteOptions:
    """How `execute` trains a study's runs: on `runtime` here (`ray` None, `parallel` 1), `parallel` at a time in pinned
    workers, or as tasks on the Ray at `ray` (see train_on_ray); from_args: a study command's parsed options."""
    runtime: Runtime
    progress: bool = False
    ray: str | None = None
    gpus_per_run: float | None = None
    cpus_per_run: float | None = None
    parallel: int = 1
    storage: Storage | None = None
    on_cpu: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace, runtime: Runtime, storage: Storage | None, on_cpu: bool):
        return cls(runtime, not args.no_progress, args.ray, args.gpus_per_run, args.cpus_per_run, args.parallel,
                   storage, on_cpu)


def execute(runs: list[StudyRun], out: Path, train: Train, options: ExecuteOptions,
            finished: Callable[[StudyRun], bool] | None = None) -> None:
    """Train `runs` with `train` as `options` say. `finished`, for a study that keeps its finished runs itself: asked
    of every run before any trains (it may refuse one), and a run it calls finished is kept, not trained; without it
    every run goes to `train` (the catalog studies' trainer resumes a finished run, training nothing). A run that
    fails on a user error ends the study in run_failed's words, every way."""
    done, o = [bool(finished and finished(run)) for run in runs], options
    if o.ray is not None or o.parallel > 1:
        for run in (run for run, d in zip(runs, done) if d):
            print(_KEPT.format(run=run), flush=True)
        todo = [run for run, d in zip(runs, done) if not d]
        if todo and o.ray is not None:
            train_on_ray(todo, out, o.ray, train=train, on_cpu=o.on_cpu, gpus_per_run=o.gpus_per_run,
                         cpus_per_run=o.cpus_per_run, progress=o.progress, storage=o.storage)
        elif todo:
            train_side_by_side(todo, out, train, min(o.parallel, len(todo)))
        return
    for run, d in zip(runs, done):
        if d:
            print(_KEPT.format(run=run), flush=True)
            continue
        print(f"== {run.cond} (seed {run.seed}) -> {run.run_dir}", flush=True)
        try:
            train(run, o.runtime)
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
