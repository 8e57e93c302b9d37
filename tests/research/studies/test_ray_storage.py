"""--ray with --storage: a study on a real local Ray cluster of two nodes (ray.cluster_utils.Cluster, a raylet each)
whose nodes have data caches and work folders of their own (each node's QK_KEYS_CACHE), with the runs kept in a
file:// storage that neither node uses as --out; and the one-line refusals of a storage that cannot be used."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from research import qk_norm_500k_study
from research.studies import HEAD_SPECIALIZATION, PILOT
from research.studies import storage as storage_module
from research.studies.ray_execution import LOCAL_HEALTH_CHECKS
from research.studies.runner import run_study
from tests.helpers import REPO, STEP_TOKENS, comparable_index, comparable_results, stops
from tests.research.studies.test_runner import study_args
from utils.testhook import ENV

ray = pytest.importorskip("ray")


def node_args(corpus_file, out, tokens, *extra):
    """A study's arguments with the data cache "auto": on each node, that node's own user cache."""
    return study_args(corpus_file, "auto", out, tokens, *extra)


@pytest.fixture(scope="module")
def cluster(user_cache, tmp_path_factory):
    """A head and a worker node of 1 CPU each, each with its own user cache (data cache and work folders): the
    environment a node's processes inherit is the one it was started in."""
    from ray.cluster_utils import Cluster
    root = tmp_path_factory.mktemp("nodes")
    with pytest.MonkeyPatch.context() as session:
        # without token authentication, nodes and driver alike, whatever a Ray started earlier in this process left
        session.setenv("RAY_AUTH_MODE", "disabled")
        cluster = Cluster()
        try:
            for name, extra in (("head", {"_system_config": LOCAL_HEALTH_CHECKS}), ("worker", {})):
                with pytest.MonkeyPatch.context() as mp:
                    mp.setenv("QK_KEYS_CACHE", str(root / name))
                    # a worker SIGKILLs itself after its 3rd optimizer step: a run of 2 steps never gets there
                    mp.setenv(ENV, "kill:step:3")
                    cluster.add_node(num_cpus=1, include_dashboard=False, **extra)
            cluster.wait_for_nodes()
            yield cluster, root
        finally:
            cluster.shutdown()


def drive(script: str, script_args: list[str]) -> str:
    """The study's driver in a process of its own on the cluster (this one may have been connected to other Rays,
    whose state a second driver here trips on); its stdout."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([sys.executable, str(REPO / "research" / script), *script_args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_a_study_through_storage_on_two_nodes_gives_the_sequential_results(corpus_file, tmp_path, cluster):
    cluster, nodes = cluster
    storage = tmp_path / "storage"
    run_study(PILOT, node_args(corpus_file, tmp_path / "seq", 2 * STEP_TOKENS, "--seed", "0"))
    out = drive("qk_norm_500k_study.py", node_args(corpus_file, tmp_path / "ray", 2 * STEP_TOKENS, "--seed", "0",
                                                   "--ray", cluster.address, "--storage", storage.as_uri()))
    seq, on_ray = comparable_results(tmp_path / "seq"), comparable_results(tmp_path / "ray")
    assert len(seq) == 2 and seq == on_ray
    assert comparable_index(tmp_path / "seq") == comparable_index(tmp_path / "ray")
    assert (tmp_path / "ray" / "report.md").is_file()
    assert len(set(re.findall(r": started on \S+ \(node ([0-9a-f]{8})", out))) == 2, out  # one run on each node
    for cond in ("qk_norm", "no_qk_norm"):
        run = tmp_path / "ray" / cond
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002"]
        for name in ("config.json", "metrics.jsonl", "summary.json", "tokenizer"):
            assert (run / name).exists(), name
        stored = json.loads((storage / cond / "stored.json").read_text())
        assert stored["checkpoints"] == ["step-000002"] and "results.json" in stored["files"]
    for node in ("head", "worker"):  # each node prepared its own data cache; its work folders are gone
        assert list((nodes / node / "data").rglob("train.npy")), node
        assert list((nodes / node / "runs").iterdir()) == [], node


@pytest.mark.slow
def test_a_killed_task_resumes_from_the_stored_checkpoint(corpus_file, tmp_path, cluster):
    """Each worker SIGKILLs itself after its 3rd optimizer step (the nodes' test hook): a try from step 0 never
    finishes, a try resumed from the stored checkpoint of step 2 never gets there, so the study ends only by that
    resume, in a work folder of its own (on either node) filled from the storage."""
    cluster, _ = cluster
    storage = tmp_path / "storage"
    argv = ["--seed", "0", "--ckpt_every", "2"]
    run_study(HEAD_SPECIALIZATION, node_args(corpus_file, tmp_path / "seq", 4 * STEP_TOKENS, *argv))
    out = drive("head_specialization_study.py", node_args(corpus_file, tmp_path / "ray", 4 * STEP_TOKENS, *argv,
                                                          "--ray", cluster.address, "--storage", storage.as_uri()))
    assert ": started again (try 2: its worker was lost, resuming from its newest checkpoint) on " in out, out
    assert ": started again (try 3" not in out and ": finished on " in out, out
    seq, on_ray = comparable_results(tmp_path / "seq"), comparable_results(tmp_path / "ray")
    assert len(seq) == 1 and seq == on_ray
    assert json.loads((storage / "QK" / "stored.json").read_text())["checkpoints"][-1] == "step-000004"


def test_a_storage_that_cannot_be_used_is_one_line_before_anything_starts(corpus_file, cache_dir, tmp_path, capsys):
    out = tmp_path / "study"
    blocked = tmp_path / "a_file"
    blocked.write_text("not a folder\n")
    forms = "give file:///ABSOLUTE/PATH, s3://BUCKET/PATH or gs://BUCKET/PATH (nothing was started)"
    for argv, message in (
            (["--storage", (tmp_path / "s").as_uri()],
             "error: --storage keeps the runs of Ray tasks on a cluster without a shared folder: add --ray, or leave "
             "--storage out to train the runs one after another in this process"),
            (["--ray", "--storage", "bucket/runs"], f"error: --storage bucket/runs: not a URI: {forms}"),
            (["--ray", "--storage", str(tmp_path)], f"error: --storage {tmp_path}: not a URI: {forms}"),
            (["--ray", "--storage", "foo://bar/x"], "error: --storage foo://bar/x: pyarrow cannot read this URI "
                                                    f"(Unrecognized filesystem type in URI: foo://bar/x): {forms}"),
            (["--ray", "--storage", (tmp_path / "a b").as_uri().replace("%20", " ")],
             f"error: --storage {tmp_path.as_uri()}/a b: a URI writes a space or a letter outside ASCII "
             f"percent-encoded: give {(tmp_path / 'a b').as_uri()} (nothing was started)"),
            (["--ray", "--storage", "s3://bucket/r\u00e9sultats"],
             "error: --storage s3://bucket/r\u00e9sultats: a URI writes a space or a letter outside ASCII "
             "percent-encoded: give s3://bucket/r%C3%A9sultats (nothing was started)"),
            (["--ray", "--storage", "file://relative/x"],
             "error: --storage file://relative/x: pyarrow cannot read this URI (Unsupported hostname in non-Windows "
             f"local URI: 'file://relative/x'): {forms}")):
        assert stops(capsys, qk_norm_500k_study.main, study_args(corpus_file, cache_dir, out, STEP_TOKENS,
                                                                 *argv)) == message
        assert not out.exists()
    # a folder that cannot be made (a file where it would go): the write check fails, in one line
    line = stops(capsys, qk_norm_500k_study.main, study_args(corpus_file, cache_dir, out, STEP_TOKENS, "--ray",
                                                             "--storage", (blocked / "runs").as_uri()))
    assert line.startswith(f"error: --storage {(blocked / 'runs').as_uri()}: cannot write there (") and line.endswith(
        "): check that the path is a folder or can be made one, that you may write there and that its disk has room "
        "(nothing was started)"), line  # a local folder's fix: no cloud credentials (issue 65)
    assert not out.exists() and blocked.read_text() == "not a folder\n"


def test_the_write_check_leaves_no_file_and_a_storage_that_does_not_answer_is_one_line(tmp_path, monkeypatch):
    storage_module.check_storage(storage_module.Storage.of((tmp_path / "s").as_uri(), "pilot", "pilot",
                                                           tmp_path / "out"))
    assert list((tmp_path / "s").iterdir()) == []  # the marker written and deleted

    class Hanging:  # a filesystem that never answers (an unreachable endpoint)
        def __getattr__(self, name):
            def hang(*args, **kwargs):
                import time
                time.sleep(5)
            return hang
    monkeypatch.setattr(storage_module, "open_storage", lambda uri: (Hanging(), "bucket/runs"))
    with pytest.raises(storage_module.ConfigError) as e:
        storage_module.check_storage(storage_module.Storage.of("s3://bucket/runs", "pilot", "pilot", tmp_path / "out"),
                                     timeout_s=0.2)
    assert str(e.value) == ("--storage s3://bucket/runs: no answer within 0.2 s while writing a test file there: check "
                            "the network and the address (nothing was started)")


def test_an_s3_endpoint_that_never_answers_ends_the_check_at_the_time_it_names(tmp_path, monkeypatch):
    """A local endpoint that accepts and never answers: pyarrow retried it for minutes, and the command exited 203 s
    after saying "no answer within 60 s" (issue 65). The check is over at its deadline, nothing of it left running."""
    import multiprocessing
    import socket
    import time
    pytest.importorskip("pyarrow._s3fs")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # connections are accepted by the kernel and never read
        uri = f"s3://bucket/runs?endpoint_override=127.0.0.1:{silent.getsockname()[1]}&scheme=http"
        start = time.monotonic()
        with pytest.raises(storage_module.ConfigError) as e:
            storage_module.check_storage(storage_module.Storage.of(uri, "pilot", "pilot", tmp_path / "out"),
                                         timeout_s=1)
        took = time.monotonic() - start
    assert str(e.value) == (f"--storage {uri}: no answer within 1 s while writing a test file there: check the network "
                            f"and the address (nothing was started)")
    assert took < 2.5 and multiprocessing.active_children() == []


def test_a_percent_encoded_path_is_the_folder_it_spells(tmp_path):
    folder = tmp_path / "a b \u00e9"
    storage_module.check_storage(storage_module.Storage.of(folder.as_uri(), "pilot", "pilot", tmp_path / "out"))
    # file:///.../a%20b%20%C3%A9: the folder made, the marker written and deleted, storage.json not yet written
    assert folder.is_dir() and list(folder.iterdir()) == []


def _run_folder(folder, steps, metrics):
    """A run folder as the trainer leaves it (the files' contents stand-ins): config, metrics, results, tokenizer,
    checkpoints of `steps`, a lock file and a half-written checkpoint, neither of which is ever stored."""
    (folder / "tokenizer").mkdir(parents=True, exist_ok=True)
    for name, text in (("config.json", "{}"), ("metrics.jsonl", metrics), ("results.json", metrics),
                       ("tokenizer/tokenizer.json", "tok"), (".lock", "")):
        (folder / name).write_text(text)
    for step in steps:
        (folder / "checkpoints" / step).mkdir(parents=True, exist_ok=True)
        for name in ("model.safetensors", "optim.pt", "state.json"):
            (folder / "checkpoints" / step / name).write_text(f"{step}/{name}")
    (folder / "checkpoints" / ".tmp-step-000009-x").mkdir(exist_ok=True)


def test_a_run_copy_mirrors_the_folder_and_a_retry_gets_the_newest_checkpoint(tmp_path):
    from research.studies.storage import RunStore, RunSync, Storage, fetch, run_stores
    storage, local = tmp_path / "storage", tmp_path / "node" / "QK"
    store = RunStore(storage.as_uri(), "QK")
    _run_folder(local, ["step-000002"], "2\n")
    sync = RunSync(store, local)
    first = sync()
    assert first["checkpoints"] == ["step-000002"] and ".lock" not in first["files"]
    assert json.loads((storage / "QK" / "stored.json").read_text()) == first
    _run_folder(local, ["step-000004"], "2\n4\n")
    shutil.rmtree(local / "checkpoints" / "step-000002")  # pruned by the trainer: deleted in the storage too
    second = sync()
    assert sorted(p.name for p in (storage / "QK" / "checkpoints").iterdir()) == ["step-000004"]
    assert (storage / "QK" / "metrics.jsonl").read_text() == "2\n4\n" and not list(storage.rglob("*.part"))
    retry = tmp_path / "other_node" / "QK"
    assert store.download(retry) == len(second["files"])
    assert sorted(p.relative_to(retry).as_posix() for p in retry.rglob("*") if p.is_file()) == sorted(second["files"])
    out = tmp_path / "out"
    fetch(store, second, out / "QK")  # the driver: the study folder gets the run's files
    assert (out / "QK" / "checkpoints" / "step-000004" / "optim.pt").read_text() == "step-000004/optim.pt"
    assert (out / "QK" / "results.json").read_text() == "2\n4\n"
    # a run --out holds further on than its stored copy is uploaded before its task starts; one behind is not
    _run_folder(out / "QK", ["step-000006"], "2\n4\n6\n")
    run = type("Run", (), {"run_dir": out / "QK"})
    study = Storage.of(storage.as_uri(), "qk_norm", "qk_norm", out)
    run_stores(study, [run], out)
    assert json.loads((storage / "storage.json").read_text()) == {"study": "qk_norm", "kind": "qk_norm",
                                                                  "out": str(out.resolve())}
    assert json.loads((storage / "QK" / "stored.json").read_text())["checkpoints"] == ["step-000004", "step-000006"]
    shutil.rmtree(out / "QK" / "checkpoints" / "step-000006")
    (out / "QK" / "metrics.jsonl").write_text("old\n")
    run_stores(study, [run], out)
    assert (storage / "QK" / "metrics.jsonl").read_text() == "2\n4\n6\n"
