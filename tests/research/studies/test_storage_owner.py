"""A --storage has an owner and serves one study (research.studies.storage.Storage, utils.owners): another tool's
folder, another study's storage and --out itself are refused in one line before anything is written."""
import json

import pytest

from research import qk_norm_500k_study
from research.studies.storage import Storage, StorageError, check_storage
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
        f"storage.json), not 'qk_norm_500k_study' (kind pilot, --out {out}): one storage keeps one study's runs, "
        f"which another study would overwrite or extend; {OTHER} (nothing was written)")
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
    assert [(h.kind, h.who) for h in owners_of(tmp_path / "storage")] == [
        ("storage", f"the --storage of the study 'pilot' (kind pilot, --out {out.resolve()})")]
    for again in (study, Storage.of(uri, "pilot", "pilot", tmp_path / "x" / ".." / "out")):  # the same --out
        check_storage(again)
        again.claim()
    for other in (Storage.of(uri, "keys", "keys", out), Storage.of(uri, "pilot", "pilot", tmp_path / "out2")):
        for step in (check_storage, Storage.claim):
            with pytest.raises(StorageError, match=f"serves the study 'pilot' .*; {OTHER} \\(nothing was written\\)$"):
                step(other)
    assert (tmp_path / "storage" / "storage.json").read_bytes() == record
