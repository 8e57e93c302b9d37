"""--ray ADDRESS: a study's runs on a Ray cluster started apart from the study (`ray start --head`), as a multi-node
cluster is used. Its own module: test_ray.py's fixture connects this process to a Ray of its own."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from research.studies import PILOT
from research.studies.runner import run_study
from tests.helpers import REPO, STEP_TOKENS, comparable_results
from tests.research.studies.test_runner import study_args

ray = pytest.importorskip("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head(user_cache, tmp_path_factory):
    """A Ray head of 2 CPUs on a free port, in the foreground (--block) of a process of ours: stopping that process
    stops its cluster, and no other Ray on this machine (`ray stop` would stop every one)."""
    port = _free_port()
    # without token authentication (ray start's default since Ray 2.5x: a driver given an address would need
    # RAY_AUTH_MODE=token and the token, docs/studies.md), so that this test leaves ~/.ray as it found it
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
    log = tmp_path_factory.mktemp("ray_head") / "head.log"
    with open(log, "w") as sink:
        # the ray of this interpreter, not the first on PATH (a venv's Python run without activating the venv)
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}", "--num-cpus=2",
                   "--include-dashboard=false", "--disable-usage-stats", "--block"]
        proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    address = f"127.0.0.1:{port}"
    deadline = time.time() + 120
    while "Ray runtime started" not in log.read_text():
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    yield address
    os.killpg(proc.pid, signal.SIGTERM)  # the group of the process started here: the head and its workers
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_a_study_on_a_running_cluster_gives_the_sequential_results(corpus_file, cache_dir, tmp_path, head):
    run_study(PILOT, study_args(corpus_file, cache_dir, tmp_path / "seq", 2 * STEP_TOKENS, "--seed", "0"))
    argv = [a for a in study_args(corpus_file, cache_dir, tmp_path / "ray", 2 * STEP_TOKENS, "--seed", "0", "--ray",
                                  head) if a != "--no_progress"]  # the driver's bar over the runs
    # the driver in a process of its own, as a user starts it (this one may have been connected to other Rays)
    # (without token authentication, as the head: an earlier ray.init in this process may have set RAY_AUTH_MODE)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([sys.executable, str(REPO / "research" / "qk_norm_500k_study.py"), *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ray: 2 runs as tasks of 1 CPU core(s) and 0 GPU(s) each, on 1 node(s)" in done.stdout, done.stdout
    assert done.stdout.count(": finished on ") == 2, done.stdout
    assert "runs: 100%" in done.stderr and "2/2 [" in done.stderr, done.stderr[-2000:]
    seq, on_ray = comparable_results(tmp_path / "seq"), comparable_results(tmp_path / "ray")
    assert len(seq) == 2 and seq == on_ray
    assert (tmp_path / "ray" / "report.md").is_file()


def test_an_address_where_no_cluster_answers_is_one_line(corpus_file, cache_dir, tmp_path, capsys):
    from research import qk_norm_500k_study
    from tests.helpers import stops
    port = _free_port()
    out = tmp_path / "study"
    line = stops(capsys, qk_norm_500k_study.main,
                 study_args(corpus_file, cache_dir, out, 2 * STEP_TOKENS, "--ray", f"127.0.0.1:{port}"))
    assert line.startswith(f"error: --ray 127.0.0.1:{port}: no Ray cluster answers there ("), line
    assert line.endswith("). Fix: `ray start --head` and pass the address it prints (with its token: docs/studies.md, "
                         "On Ray), or --ray alone to start one here"), line
