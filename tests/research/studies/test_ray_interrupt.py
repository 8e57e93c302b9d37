"""--ray: Ctrl-C on the driver cancels the runs' tasks, keeps their checkpoints, and the same command continues the
study to the results of an uninterrupted one. The driver is a real process (its own local Ray)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from research import qk_norm_500k_study
from research.studies import PILOT
from research.studies.runner import run_study
from tests.helpers import REPO, STEP_TOKENS, comparable_results
from tests.research.studies.test_runner import study_args
from utils.testhook import DIR_ENV, ENV

ray = pytest.importorskip("ray")


@pytest.mark.slow
def test_ctrl_c_on_the_driver_keeps_the_checkpoints_and_the_same_command_continues(corpus_file, cache_dir, tmp_path,
                                                                                    capsys):
    argv = ["--seed", "0", "--ckpt_every", "1"]
    run_study(PILOT, study_args(corpus_file, cache_dir, tmp_path / "seq", 4 * STEP_TOKENS, *argv))
    out, hooks = tmp_path / "ray", tmp_path / "hook"
    hooks.mkdir()
    command = study_args(corpus_file, cache_dir, out, 4 * STEP_TOKENS, *argv, "--ray")
    env = {**os.environ, ENV: "pause:step:2", DIR_ENV: str(hooks), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # Ctrl-C reaches it even where this test runs with SIGINT ignored (a shell's background job): Python only
    # turns SIGINT into KeyboardInterrupt where it was not ignored when the process started
    driver = subprocess.Popen([sys.executable, str(REPO / "research" / "qk_norm_500k_study.py"), *command], env=env,
                              cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 300
        while not (hooks / "paused").exists():  # a run paused after its 2nd step (its checkpoint of step 1 written)
            assert driver.poll() is None and time.time() < deadline, driver.communicate()[1][-3000:]
            time.sleep(0.2)
        driver.send_signal(signal.SIGINT)
        stdout, stderr = driver.communicate(timeout=180)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.rstrip("\n").rsplit("\n", 1)[-1]
    assert last.startswith("interrupted: the ") and last.endswith(
        f" unfinished run(s) on Ray were cancelled; their checkpoints and the finished conditions in {out} are kept: "
        f"run the same command again to continue the study"), last
    assert ": started on " in stdout, stdout
    kept = sorted(p.parent.parent.name for p in out.glob("*/checkpoints/step-*/model.safetensors"))
    assert kept, list(out.rglob("*"))  # the paused run's checkpoint of step 1 at least
    assert not (out / "study.json").exists()
    capsys.readouterr()
    auth_mode = os.environ.get("RAY_AUTH_MODE")
    qk_norm_500k_study.main(command)  # the same command, here: the cancelled runs resume from their checkpoints
    assert comparable_results(tmp_path / "seq") == comparable_results(out)
    assert os.environ.get("RAY_AUTH_MODE") == auth_mode  # the study's own Ray left this process's environment as it was
    assert (out / "report.md").is_file()
