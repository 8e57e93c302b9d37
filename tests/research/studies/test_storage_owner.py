"""A --storage has an owner and serves one study (research.studies.storage.Storage, utils.owners): another tool's
folder, another study's storage and --out itself are refused in one line before anything is written; and nothing a
storage's stored.json names is written outside its run folder, on a worker (RunStore.download) or on the driver
(fetch)."""
import json
import os

import pytest

from research.results.published import check_file

from research import qk_norm_500k_study
from research.studies.storage import RunStore, RunSync, Storage, StorageError, check_storage, fetch
from tests.helpers import STEP_TOKENS, stops
from tests.research.studies.stored import unpack
from tests.research.studies.test_runner import study_args
from utils.owners import owners_of

pytest.importorskip("ray")  # --storage is checked only with --ray, which is refused without Ray installed
OTHER = "give this study another --storage location"


def snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def pilot(capsys, corpus_file, cache_dir, out, storage) -> str:
    """The pilot's command with --ray --storage, stopped before Ray starts: its one line."""
    return stops(capsys, qk_norm_500k_study.main, study_args(corpus_file, cache_dir, out, STEP_TOKENS, "--ray",
                                                             "--storage", storage.as_uri()))


@pytest.mark.parametrize("where, owner", [("", "the study 'key_dynamics_study' (kind keys), by its study.json"),
                                          ("QK/seed_0", "a training run (train_llm.py, or a study's condition), "
                                                        "by its results.json")])
def test_a_storage_in_another_tools_folder_is_refused_and_that_folder_kept(corpus_file, cache_dir, tmp_path, capsys,
                                                                           where, owner):
    """The issue's data loss: --storage on another study's finished folder (or one of its runs) overwrote its runs."""
    other, _ = unpack("keys", tmp_path / "keys")
    folder = other / where
    before = snapshot(other)
    line = pilot(capsys, corpus_file, cache_dir, tmp_path / "out", folder)
    assert line == (f"error: {folder} belongs to {owner}: --storage {folder.as_uri()} writes only into a folder of its "
                    f"own (storage) or a new one, never over another tool's results and report; {OTHER} (nothing was "
                    f"written)")
    assert snapshot(other) == before and not (tmp_path / "out").exists()


def test_a_storage_of_another_study_or_on_out_is_refused(corpus_file, cache_dir, tmp_path, capsys):
    out, storage = tmp_path / "out", tmp_path / "storage"
    storage.mkdir()
    served = {"study": "keys", "kind": "keys", "out": str(tmp_path / "keys")}
    (storage / "storage.json").write_text(json.dumps(served))
    (storage / "QK").mkdir()
    (storage / "QK" / "stored.json").write_text('{"files": [], "checkpoints": []}')
    before = snapshot(storage)
    assert pilot(capsys, corpus_file, cache_dir, out, storage) == (
        f"error: --storage {storage.as_uri()} serves the study 'keys' (kind keys, --out {tmp_path / 'keys'}: its "
        f"storage.json), not 'qk_norm_500k_study' (kind pilot, --out {out}); nothing was written. Fix: {OTHER}")
    assert snapshot(storage) == before and not out.exists()
    # the same study, asked with another --out: refused the same way
    (storage / "storage.json").write_text(json.dumps({**served, "study": "qk_norm_500k_study", "kind": "pilot"}))
    assert pilot(capsys, corpus_file, cache_dir, out, storage).startswith(
        f"error: --storage {storage.as_uri()} serves the study 'qk_norm_500k_study' (kind pilot, --out "
        f"{tmp_path / 'keys'}: ")
    (storage / "storage.json").write_text("{not json")
    assert pilot(capsys, corpus_file, cache_dir, out, storage).startswith(
        f"error: --storage {storage.as_uri()}: its storage.json, the study it serves, cannot be read (")
    for folder, where in ((out, "is --out itself"), (out / "storage", "is inside --out"), (tmp_path, "holds --out")):
        assert pilot(capsys, corpus_file, cache_dir, out, folder) == (
            f"error: --storage {folder.as_uri()} {where} ({out}): the runs' stored copies and the study's folder must "
            f"be apart; {OTHER}, outside --out (nothing was written)")
        assert not out.exists()


def test_a_storage_is_claimed_by_its_study_which_resumes_on_it(tmp_path):
    """storage.json is written at the first upload (claim), through the runs' API, and marks the folder as a
    storage's for every other tool; the same study checks and claims it again, another is refused and changes
    nothing."""
    uri, out = (tmp_path / "storage").as_uri(), tmp_path / "out"
    study = Storage.of(uri, "pilot", "pilot", out)
    check_storage(study)
    assert not (tmp_path / "storage" / "storage.json").exists()  # the check writes nothing that stays
    study.claim()
    record = (tmp_path / "storage" / "storage.json").read_bytes()
    assert json.loads(record) == {"study": "pilot", "kind": "pilot", "out": str(out.resolve())}
    check_file("storage.schema.json", json.loads(record))  # its published schema (docs/schema) holds it
    assert [(h.kind, h.who) for h in owners_of(tmp_path / "storage")] == [
        ("storage", f"the --storage of the study 'pilot' (kind pilot, --out {out.resolve()})")]
    for again in (study, Storage.of(uri, "pilot", "pilot", tmp_path / "x" / ".." / "out")):  # the same --out
        check_storage(again)
        again.claim()
    for other in (Storage.of(uri, "keys", "keys", out), Storage.of(uri, "pilot", "pilot", tmp_path / "out2")):
        for step in (check_storage, Storage.claim):
            with pytest.raises(StorageError, match=f"serves the study 'pilot' .*; nothing was written. Fix: {OTHER}$"):
                step(other)
    assert (tmp_path / "storage" / "storage.json").read_bytes() == record


# stored.json entries that would leave the run folder: (files, checkpoints), the entry named, why
HOSTILE = [
    (["config.json", "../escape.txt"], [], "'../escape.txt', a '..' part"),
    (["config.json", "tokenizer/../../escape.txt"], [], "'tokenizer/../../escape.txt', a '..' part"),
    (["/tmp/escape.txt"], [], "'/tmp/escape.txt', an absolute path"),
    (["C:/escape.txt"], [], "'C:/escape.txt', a Windows path (a backslash or a drive letter)"),
    (["..\\escape.txt"], [], "'..\\\\escape.txt', a Windows path (a backslash or a drive letter)"),
    (["tokenizer//x"], [], "'tokenizer//x', an empty or '.' part"),
    ([".lock"], [], "'.lock', a hidden name, which no run stores"),
    (["config.json"], [".."], "'..' (a checkpoint), a '..' part"),
    (["config.json"], ["step-000002/../.."], "'step-000002/../..' (a checkpoint), a '..' part"),
    (["config.json"], ["a/b"], "'a/b' (a checkpoint), not one folder name"),
]


def _hostile_storage(tmp_path, files, checkpoints):
    """A storage whose run QK lists `files`, each stored where the naive join of its path finds it."""
    storage = tmp_path / "storage"
    for rel in files:
        path = storage / "QK" / rel.replace("\\", "/").lstrip("/")
        if path.resolve().is_relative_to(storage.resolve()):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("hostile\n")
    (storage / "QK").mkdir(parents=True, exist_ok=True)
    (storage / "QK" / "stored.json").write_text(json.dumps({"files": files, "checkpoints": checkpoints}))
    return RunStore(storage.as_uri(), "QK")


def _error(store, entry):
    return (f"--storage {store.uri}: the run QK's stored.json lists {entry}: it would be written outside the run "
            f"folder; correct or delete that stored.json in the storage, or {OTHER} (nothing was downloaded)")


@pytest.mark.parametrize("files, checkpoints, entry", HOSTILE)
def test_a_stored_path_outside_the_run_folder_is_refused_before_any_download(tmp_path, files, checkpoints, entry):
    """The worker (download, RunSync), and the driver (fetch, given the task's list): one line, nothing written."""
    store = _hostile_storage(tmp_path, files, checkpoints)
    before = snapshot(tmp_path)
    node, out = tmp_path / "node" / "QK", tmp_path / "out" / "QK"
    with pytest.raises(StorageError) as e:
        store.download(node)
    assert str(e.value) == _error(store, entry)
    with pytest.raises(StorageError) as e:
        RunSync(store, node)  # a retry's sync reads the same list: no checkpoint deleted through it
    assert str(e.value) == _error(store, entry)
    with pytest.raises(StorageError) as e:
        fetch(store, {"files": files, "checkpoints": checkpoints}, out)
    assert str(e.value) == _error(store, entry)
    assert snapshot(tmp_path) == before and not node.exists() and not out.exists()
    assert not (tmp_path / "node" / "escape.txt").exists() and not (tmp_path / "out" / "escape.txt").exists()


def test_the_driver_refuses_a_path_that_leaves_the_run_folder_through_a_link(tmp_path):
    store = _hostile_storage(tmp_path, ["config.json", "tokenizer/tokenizer.json"], [])
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out" / "QK"
    elsewhere.mkdir()
    out.mkdir(parents=True)
    os.symlink(elsewhere, out / "tokenizer")
    with pytest.raises(StorageError) as e:
        fetch(store, store.manifest(), out)
    assert str(e.value) == _error(store, "'tokenizer/tokenizer.json', a path that leads out through a link in the "
                                         "run folder")
    assert list(elsewhere.iterdir()) == [] and not (out / "config.json").exists()


def test_a_stored_json_that_is_no_file_list_is_one_line(tmp_path):
    store = _hostile_storage(tmp_path, [], [])
    stored = tmp_path / "storage" / "QK" / "stored.json"
    stored.write_text('{"files": "config.json", "checkpoints": []}')
    with pytest.raises(StorageError, match=r"^--storage \S+: the run QK's stored.json is not a list of stored files "
                                           r"\(.*files.*\): correct or delete"):
        store.download(tmp_path / "node")
    stored.write_text("{not json")
    with pytest.raises(StorageError, match=r"^--storage \S+: the run QK's stored.json cannot be read \("):
        store.download(tmp_path / "node")
    assert not (tmp_path / "node").exists()
