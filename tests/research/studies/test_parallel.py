"""--parallel P: a study's runs side by side in P spawned worker processes, each pinned to its share of the cores
(research/studies/pinned.py through research/studies/executors.py): every run trained once on its own cores, one line
as each starts and ends, a failed run named in the in-process executor's words with the finished runs kept, and a
study's results those of its runs trained one at a time on as many threads."""
from __future__ import annotations

import argparse
import json
import os
import time

import pytest

from research.studies import PILOT, executors
from research.studies.executors import ExecuteOptions, check_ray_options, execute
from research.studies.study_runs import StudyError, StudyRun
from research.studies.pinned import core_groups
from utils.runtime import usable_core_ids
from research.studies.runner import run_study
from tests.helpers import STEP_TOKENS, comparable_index, comparable_results
from tests.research.studies.test_runner import study_args
from tests.research.studies.toy_train import toy_train
from utils.errors import ConfigError
from utils.runtime import resolve_runtime

RUNTIME = resolve_runtime("cpu", "fp32")
two_cores = pytest.mark.skipif(len(usable_core_ids()) < 2, reason="needs 2 cores this process may use")


def test_the_cores_are_split_into_even_contiguous_groups():
    assert core_groups([0, 1], 2) == [(0,), (1,)]
    assert core_groups([0, 1, 2], 2) == [(0, 1), (2,)]
    assert core_groups([4, 5, 6, 7], 2) == [(4, 5), (6, 7)]
    assert core_groups([0, 1, 2, 3, 4], 3) == [(0, 1), (2, 3), (4,)]
    assert core_groups([3], 1) == [(3,)]


def test_parallel_is_checked_before_anything_starts(monkeypatch):
    monkeypatch.setattr(executors, "usable_cores", lambda: 2)
    ok = argparse.Namespace(parallel=2, ray=None, gpus_per_run=None, cpus_per_run=None)
    check_ray_options(ok)
    with pytest.raises(ConfigError, match=r"^--parallel 3: this process may use 2 CPU core\(s\), .* give --parallel 2 "
                                          r"or fewer \(nothing was started\)$"):
        check_ray_options(argparse.Namespace(**{**vars(ok), "parallel": 3}))
    with pytest.raises(ConfigError, match=r"^--parallel 2 trains the runs in worker processes on this machine, --ray "
                                          r"as Ray tasks: give one of them"):
        check_ray_options(argparse.Namespace(**{**vars(ok), "ray": "local"}))


@two_cores
@pytest.mark.slow  # two spawned workers import torch: 8 s on a busy 2-core host
def test_runs_side_by_side_train_once_each_on_their_own_cores(tmp_path, capsys):
    runs = [StudyRun(c, s, {}, tmp_path / c / f"seed_{s}") for s in (0, 1) for c in ("A", "B")]
    kept = StudyRun("C", 0, {}, tmp_path / "C")
    execute([kept, *runs], tmp_path, toy_train, ExecuteOptions(RUNTIME, parallel=2),
            finished=lambda run: run is kept)
    where = [json.loads((run.run_dir / "where.json").read_text()) for run in runs]
    groups = core_groups(usable_core_ids(), 2)
    assert all(w["runtime"] is None and tuple(w["cores"]) in groups for w in where)  # a worker's own runtime
    # at most two workers (a worker that starts first may take every run of no length), none of them this process
    assert len({w["pid"] for w in where}) <= 2 and os.getpid() not in {w["pid"] for w in where}
    assert not kept.run_dir.exists()
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["C seed 0: finished earlier, kept",
                         "parallel: 4 runs, 2 at a time, each in a worker process pinned to its own core(s)"]
    for run in runs:
        assert sum(ln.startswith(f"== {run.cond} (seed {run.seed}) -> {run.run_dir}: started on core(s) ")
                   for ln in lines) == 1
        assert sum(ln.startswith(f"== {run.cond} (seed {run.seed}) -> {run.run_dir}: finished in ")
                   for ln in lines) == 1
    assert lines[-1].startswith("parallel: 4 runs in ") and "; each run: A seed 0 " in lines[-1]


@two_cores
@pytest.mark.slow  # two spawned workers import torch: 8 s on a busy 2-core host
def test_a_failed_run_ends_the_study_in_one_line_and_the_running_one_finishes(tmp_path, capsys):
    # A0 runs until a second after B0 has started and failed: no run is handed out after B0, A0 finishes and is kept
    started = str(tmp_path / "B0 started")
    runs = [StudyRun("A", 0, {"wait_for": started, "sleep": 1.0}, tmp_path / "A0"),
            StudyRun("B", 0, {"touch": started, "fail": True}, tmp_path / "B0"),
            StudyRun("A", 1, {}, tmp_path / "A1"), StudyRun("B", 1, {}, tmp_path / "B1")]
    with pytest.raises(StudyError) as failed:
        execute(runs, tmp_path, toy_train, ExecuteOptions(RUNTIME, parallel=2))
    assert str(failed.value) == (f"in condition B, seed 0: boom (finished conditions in {tmp_path} are kept; once "
                                 f"this is fixed, the same command continues the study)")
    assert (tmp_path / "A0" / "where.json").is_file()
    assert not (tmp_path / "A1").exists() and not (tmp_path / "B1").exists()
    out = capsys.readouterr().out
    assert f"== B (seed 0) -> {tmp_path / 'B0'}: failed" in out
    assert f"== A (seed 0) -> {tmp_path / 'A0'}: finished in " in out


@two_cores
@pytest.mark.slow
def test_a_study_side_by_side_gives_the_results_of_its_runs_one_at_a_time_on_one_thread(corpus_file, cache_dir,
                                                                                        tmp_path, capsys):
    argv = ["--seeds", "0", "1"]
    run_study(PILOT, study_args(corpus_file, cache_dir, tmp_path / "seq", 2 * STEP_TOKENS, *argv, "--threads", "1"))
    run_study(PILOT, study_args(corpus_file, cache_dir, tmp_path / "par", 2 * STEP_TOKENS, *argv, "--parallel", "2"))
    seq, par = comparable_results(tmp_path / "seq"), comparable_results(tmp_path / "par")
    assert len(seq) == 4 and seq == par
    assert comparable_index(tmp_path / "seq") == comparable_index(tmp_path / "par")
    assert (tmp_path / "par" / "report.md").is_file()
    assert "parallel: 4 runs in " in capsys.readouterr().out


@two_cores
@pytest.mark.slow
def test_a_killed_study_side_by_side_leaves_no_worker_training_and_the_same_command_continues(corpus_file, cache_dir,
                                                                                             tmp_path, capsys):
    import subprocess
    import sys

    import psutil

    from research import qk_norm_500k_study
    from tests.helpers import REPO, train_rows
    from utils.testhook import DIR_ENV, ENV
    out, hooks = tmp_path / "par", tmp_path / "hook"
    hooks.mkdir()
    command = study_args(corpus_file, cache_dir, out, 4 * STEP_TOKENS, "--seed", "0", "--ckpt_every", "1",
                         "--parallel", "2")
    env = {**os.environ, ENV: "pause:step:2", DIR_ENV: str(hooks), "PYTHONPATH": str(REPO)}
    log = tmp_path / "driver.log"  # a file, not a pipe: the workers inherit it and outlive the driver killed
    driver = subprocess.Popen([sys.executable, str(REPO / "research" / "qk_norm_500k_study.py"), *command], env=env,
                              cwd=REPO, text=True, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while not (hooks / "paused").exists():  # a worker's run paused after its 2nd step (checkpoint 1 written)
            assert driver.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        workers = psutil.Process(driver.pid).children()
        assert int((hooks / "paused").read_text()) in {w.pid for w in workers}
        driver.kill()
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    from research.studies.pinned import _ORPHAN_EXIT_S  # a worker Ctrl-C does not stop ends by then
    _, alive = psutil.wait_procs(workers, timeout=_ORPHAN_EXIT_S + 30)  # each interrupts its run, driver gone
    assert alive == []
    assert not (out / "study.json").exists()
    capsys.readouterr()
    qk_norm_500k_study.main(command)  # the same command: the runs resume from their checkpoints
    for cond in ("qk_norm", "no_qk_norm"):
        assert [row[0] for row in train_rows(out / cond)] == [1, 2, 3, 4]  # every step once
    assert (out / "report.md").is_file()


def test_a_ray_tasks_cores_are_its_own_while_it_runs(user_cache):
    """research.studies.cores: two claims on one node get different cores, one that cannot have as many as it asks
    runs unpinned, a fraction of a core is never pinned, and the process's cores are put back after."""
    import multiprocessing

    from research.studies.cores import own_cores
    from utils.runtime import usable_core_ids
    before = usable_core_ids()
    with own_cores(1) as mine:
        assert len(mine) == 1 and usable_core_ids() == list(mine)
        # another process on the node (a second task's worker) gets another core, or none where there is no other
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            theirs = pool.apply(_claimed_elsewhere, (1, before))
        assert theirs == (before[1:2] if len(before) > 1 else [])
        with own_cores(len(before) + 1) as too_many:
            assert too_many == ()
    with own_cores(0.5) as fraction:
        assert fraction == () and usable_core_ids() == before
    assert usable_core_ids() == before


def _claimed_elsewhere(n: int, cores: list[int]) -> list[int]:
    """In another process, with the node's cores: the cores own_cores gives it."""
    from research.studies.cores import own_cores
    os.sched_setaffinity(0, cores)
    with own_cores(n) as claimed:
        return list(claimed)
