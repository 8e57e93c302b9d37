"""Real processes: kill -9 at chosen points, then --resume; two processes on one folder.

The killed or paused process is train_llm.py in a subprocess, stopped by the test-only hook
(utils/testhook.py); the resume runs in this process. Every case must end exactly like the
uninterrupted run (conftest.straight_run) with nothing left behind.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import train_llm
from tests.helpers import REPO, assert_same_run, cli_args, hidden_files, stops
from utils.testhook import DIR_ENV, ENV


def start(argv, hook: str, hook_dir=None) -> subprocess.Popen:
    env = {**os.environ, ENV: hook, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    if hook_dir is not None:
        env[DIR_ENV] = str(hook_dir)
    return subprocess.Popen([sys.executable, str(REPO / "train_llm.py"), *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# point -> (hook, what the kill leaves behind, where the resume starts)
KILLS = {
    "before the first checkpoint": ("step:1", None, "no checkpoint yet"),
    "while writing a checkpoint": ("checkpoint_write:2", "checkpoints/.tmp-step-000004-", "step-000002 (step 2)"),
    "while pruning a checkpoint": ("prune:1", "checkpoints/.pruning-step-000002-", "step-000004 (step 4)"),
    "while replacing results.json": ("replace:results.json:3", ".results.json.", "step-000002 (step 2)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(KILLS))
def test_killed_anywhere_resumes_to_the_same_run(point, corpus_file, cache_dir, tmp_path, straight_run, capsys):
    hook, leftover, resumed_from = KILLS[point]
    out = tmp_path / "run"
    argv = cli_args(corpus_file, cache_dir, out, 6, "--keep_last", "1")
    proc = start(argv, f"kill:{hook}")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    left = hidden_files(out)
    assert (leftover is None and left == []) or any(h.startswith(leftover) for h in left), left
    train_llm.main(argv + ["--resume"])
    log = capsys.readouterr().out
    assert resumed_from in log
    assert_same_run(straight_run, out, 6)
    assert hidden_files(out) == []  # the leftovers were removed


@pytest.mark.slow
def test_a_second_run_on_the_same_folder_stops_and_names_the_first(corpus_file, cache_dir, tmp_path, straight_run,
                                                                  capsys):
    out, hook_dir = tmp_path / "run", tmp_path / "hook"
    hook_dir.mkdir()
    argv = cli_args(corpus_file, cache_dir, out, 6)
    first = start(argv, "pause:step:1", hook_dir)
    try:
        deadline = time.time() + 300
        while not (hook_dir / "paused").exists():
            assert first.poll() is None and time.time() < deadline, first.communicate()[1][-2000:]
            time.sleep(0.1)
        for extra in ([], ["--resume"]):
            msg = stops(capsys, train_llm.main, argv + extra)
            assert msg.startswith(f"error: {out} is in use by pid {first.pid} on ") and "train_llm.py" in msg
            assert "Nothing was written" in msg and "choose another --out" in msg
    finally:
        (hook_dir / "go").touch()
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    assert_same_run(straight_run, out, 6)  # the first run's files alone, whole
