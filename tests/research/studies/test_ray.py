"""--ray: a study's runs as tasks on a real local Ray cluster on CPU (one per module: Ray takes seconds to start)."""
import contextlib
import json
import os
import subprocess
import sys

import pytest

from research import qk_norm_500k_study
from research.studies import PILOT
from research.studies.ray_execution import _restore_env, start_local_ray
from research.studies.runner import run_study
from tests.helpers import REPO, STEP_TOKENS, comparable_index, comparable_results, stops
from tests.research.studies.test_runner import study_args

ray = pytest.importorskip("ray")


@contextlib.contextmanager
def local_ray(**workers_env):
    """A local Ray of 2 CPUs whose workers inherit this environment plus `workers_env`; on leaving, this process's
    environment as it was (ray.init leaves RAY_AUTH_MODE=token in it)."""
    auth_mode = os.environ.get("RAY_AUTH_MODE")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in workers_env.items():
            mp.setenv(key, value)
        start_local_ray(2)  # as --ray starts one: never one running here, tolerant health checks
    try:
        yield
    finally:
        ray.shutdown()
        _restore_env("RAY_AUTH_MODE", auth_mode)


@pytest.fixture(scope="module")
def cluster(user_cache):
    """A local Ray, started after the session's environment is set (its workers inherit it); a study run with --ray
    in this process uses it rather than starting its own."""
    with local_ray():
        yield


@pytest.mark.slow
def test_a_study_on_ray_gives_the_sequential_results(corpus_file, cache_dir, tmp_path, cluster, capsys):
    argv = ["--seeds", "0", "1"]
    run_study(PILOT, study_args(corpus_file, cache_dir, tmp_path / "seq", 2 * STEP_TOKENS, *argv))
    capsys.readouterr()
    run_study(PILOT, study_args(corpus_file, cache_dir, tmp_path / "ray", 2 * STEP_TOKENS, *argv, "--ray"))
    out = capsys.readouterr().out
    seq, on_ray = comparable_results(tmp_path / "seq"), comparable_results(tmp_path / "ray")
    assert len(seq) == 4 and seq == on_ray
    assert comparable_index(tmp_path / "seq") == comparable_index(tmp_path / "ray")
    assert (tmp_path / "ray" / "report.md").is_file()
    for cond in ("qk_norm", "no_qk_norm"):
        for seed in (0, 1):
            line = f"== {cond} (seed {seed}) -> {tmp_path / 'ray' / cond / f'seed_{seed}'}"
            assert f"{line}: started on " in out and f"{line}: finished on " in out, out
    assert "ray: 4 runs in " in out and " s wall time; each run: qk_norm seed 0 " in out


@pytest.mark.slow
def test_a_study_until_decided_hands_each_round_to_ray_together(corpus_file, cache_dir, tmp_path, cluster, capsys):
    # margins too narrow to settle at two seeds: the first round's 4 runs, then the second round's 2, each as tasks
    run_study(PILOT, study_args(corpus_file, cache_dir, tmp_path / "ray", 2 * STEP_TOKENS, "--seeds", "0", "1",
                                "--margin", "1e-6", "--loss_margin", "1e-6", "--until_decided", "3", "--round", "1",
                                "--ray"))
    out = capsys.readouterr().out
    assert "ray: 4 runs as tasks" in out and "ray: 2 runs as tasks" in out  # the second round's new runs alone
    assert [look["seeds"] for look in json.loads((tmp_path / "ray" / "study.json").read_text())["looks"]] == \
        [[0, 1], [0, 1, 2]]


def test_a_user_error_in_a_task_reaches_the_driver_as_one_line_and_is_not_retried(corpus_file, cache_dir, tmp_path,
                                                                                  cluster, capsys):
    out = tmp_path / "study"
    (out / "no_qk_norm").mkdir(parents=True)
    # a run's file and nothing to continue from: refused inside the task (an unreadable config.json would be
    # refused by the driver, before any task: research.studies.recorded.check_recorded_runs)
    (out / "no_qk_norm" / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        qk_norm_500k_study.main(study_args(corpus_file, cache_dir, out, 2 * STEP_TOKENS, "--seed", "0", "--ray"))
    captured = capsys.readouterr()
    assert stop.value.code == 2 and "Traceback" not in captured.err, captured.err[-2000:]
    line = captured.err.rstrip("\n").rsplit("\n", 1)[-1]
    assert line.startswith("error: in condition no_qk_norm, seed 0: ") and "config.json" in line, line
    assert line.endswith(f"(finished conditions in {out} are kept; once this is fixed, the same command continues "
                         f"the study)"), line
    assert captured.out.count("no_qk_norm (seed 0) -> ") == 2, captured.out  # started once (not retried), failed
    assert f"{out / 'no_qk_norm'}: failed" in captured.out
    assert (out / "no_qk_norm" / "metrics.jsonl").read_text() == '{"step": 1, "loss": 5.0}\n'
    assert not (out / "study.json").exists()


def test_ray_options_are_checked_before_anything_is_written(corpus_file, cache_dir, tmp_path, capsys):
    out = tmp_path / "study"
    for extra, message in (
            (["--gpus_per_run", "0.5"], "error: --gpus_per_run sets the resources of each run's Ray task: add --ray, "
                                        "or leave --gpus_per_run out to train the runs one after another in this "
                                        "process"),
            (["--ray", "--cpus_per_run", "0"], "error: --cpus_per_run 0: give a positive number of CPU cores per "
                                               "run, e.g. 1"),
            (["--ray", "--gpus_per_run", "1.5"], "error: --gpus_per_run 1.5: give a fraction up to 1 (runs sharing "
                                                 "a GPU, e.g. 0.25), a whole number of GPUs, or 0"),
            # NaN passed every comparison and reached Ray, which started before refusing it (issue 50)
            (["--ray", "--cpus_per_run", "nan"], "error: --cpus_per_run nan: give a finite number of CPUs per run, "
                                                 "e.g. 1 (nothing was started)"),
            (["--ray", "--gpus_per_run", "inf"], "error: --gpus_per_run inf: give a finite number of GPUs per run, "
                                                 "e.g. 1 (nothing was started)")):
        assert stops(capsys, qk_norm_500k_study.main, study_args(corpus_file, cache_dir, out, 2 * STEP_TOKENS,
                                                                 *extra)) == message
        assert not out.exists()


@pytest.mark.parametrize("address", ["http://::::", "foo", "127.0.0.1:99999", ":6379", "ray://head:10001", ""])
def test_an_address_ray_cannot_read_is_one_line_before_ray_starts(corpus_file, cache_dir, tmp_path, capsys, address):
    """`--ray 'http://::::'` printed Ray's ValueError of several lines (issue 50); every address that is not HOST:PORT
    (port 1-65535), auto or none is refused in one line, before Ray is imported or anything is written."""
    out = tmp_path / "study"
    line = stops(capsys, qk_norm_500k_study.main, study_args(corpus_file, cache_dir, out, 2 * STEP_TOKENS, "--ray",
                                                             address))
    assert line == (f"error: --ray {address}: not the address of a Ray cluster: give HOST:PORT (the address `ray start "
                    f"--head` prints, e.g. 10.0.0.5:6379), auto (the cluster of the node this runs on), or --ray alone "
                    f"for a Ray started here (nothing was started)"), line
    assert not out.exists()


def test_a_local_ray_takes_its_node_for_dead_only_after_100_s_of_missed_health_checks(cluster):
    """The local Ray (--ray alone, and this module's, started the same way) checks its node every 5 s, gives each
    check 30 s and takes the node for dead after 20 misses in a row: at least 100 s, where Ray's defaults (3 s,
    10 s, 5) took a busy 2-core host's own node for dead (issue 50)."""
    from ray._raylet import Config  # the settings this process's Ray runs with
    assert (Config.health_check_period_ms(), Config.health_check_timeout_ms(),
            Config.health_check_failure_threshold()) == (5_000, 30_000, 20)


def test_a_ray_system_error_is_one_line_saying_the_same_command_continues(tmp_path, cluster, capsys, monkeypatch):
    """ActorDiedError (an actor on a node taken for dead: the driver's own in the review's run) and any other error
    of Ray's own end a study in one line: what failed, that the checkpoints and finished conditions are kept and that
    the same command continues (issue 50). Raised in a real task, and where the driver meets it."""
    import functools

    from configs import get_preset
    from research.studies import ray_execution
    from research.studies.study_runs import StudyRun
    from utils.cli import command

    def fail(kind: str, run, runtime):  # a run's task failing as Ray's system errors reach it (by value: a closure)
        if kind == "actor":
            @ray.remote(num_cpus=0)
            class Doomed:
                def die(self):
                    os._exit(1)  # the actor's process ends, as on a node taken for dead

                def ping(self):
                    return 1
            doomed = Doomed.remote()
            doomed.die.remote()
            ray.get(doomed.ping.remote())  # ActorDiedError
        raise ray.exceptions.RaySystemError("the raylet of this node missed its health checks")

    def study(kind: str) -> str:
        main = command(lambda: ray_execution.train_on_ray(
            [StudyRun("A", 0, get_preset("debug"), tmp_path / "A")], tmp_path, "local",
            train=functools.partial(fail, kind), on_cpu=True, gpus_per_run=0, cpus_per_run=1))
        return stops(capsys, lambda argv: main(), [])
    kept = (f"; the finished conditions and every run's checkpoints in {tmp_path} are kept: the same command "
            f"continues the study (with --ray or without; a node taken for dead on a busy machine is one cause: fewer "
            f"runs at once, with a larger --cpus_per_run, load it less)")
    line = study("actor")
    assert line.startswith("error: Ray failed (ActorDiedError: ") and line.endswith(kept), line
    assert study("system") == f"error: Ray failed (RaySystemError: System error: the raylet of this node missed its " \
                              f"health checks){kept}"

    def lost(*args):  # where the driver itself meets it (its actor of events, ray.nodes)
        raise ray.exceptions.NodeDiedError("node 1a2b missed 20 health checks\nand more lines of Ray's")
    monkeypatch.setattr(ray_execution, "_resources", lost)
    assert study("none") == f"error: Ray failed (NodeDiedError: node 1a2b missed 20 health checks){kept}"


def test_a_task_larger_than_every_node_is_refused(corpus_file, cache_dir, tmp_path, cluster, capsys):
    out = tmp_path / "study"
    line = stops(capsys, qk_norm_500k_study.main,
                 study_args(corpus_file, cache_dir, out, 2 * STEP_TOKENS, "--ray", "--cpus_per_run", "64"))
    assert line == ("error: no node of the Ray cluster has 64 CPU core(s) and 0 GPU(s) for one run (its nodes: 2 CPU "
                    "/ 0 GPU): give a smaller --cpus_per_run or --gpus_per_run (nothing was trained)")
    assert not out.exists()


def test_a_sequential_study_never_imports_ray(corpus_file, cache_dir, tmp_path):
    code = ("import sys; from research.studies import PILOT; from research.studies.runner import run_study; "
            f"run_study(PILOT, {study_args(corpus_file, cache_dir, tmp_path / 'seq', STEP_TOKENS, '--seed', '0')!r})"
            "; assert 'ray' not in sys.modules, 'ray was imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_the_finetuning_study_on_ray_gives_the_sequential_results(tmp_path, cluster, capsys):
    from research import finetune_keys_study
    from tests.research.inspection.builders import make_hf_model
    model = make_hf_model("qwen3", tmp_path / "qwen3")
    argv = ["--model", str(model), "--tokens", "256", "--batch_size", "2", "--seq_len", "16", "--seeds", "0", "1",
            "--no_progress"]
    assert finetune_keys_study.main([*argv, "--out", str(tmp_path / "seq")]) == 0
    capsys.readouterr()
    assert finetune_keys_study.main([*argv, "--out", str(tmp_path / "ray"), "--ray"]) == 0
    out = capsys.readouterr().out
    assert out.count(": finished on ") == 4 and "ray: 4 runs in " in out, out
    seq, on_ray = comparable_results(tmp_path / "seq"), comparable_results(tmp_path / "ray")
    assert len(seq) == 4 and seq == on_ray
    assert (tmp_path / "ray" / "report.md").is_file()
