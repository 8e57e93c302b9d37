"""The one rule for links (utils.io.check_links): no tool reads or writes through a link in a run, study or cache
folder that leads outside it; links within the folder are allowed; the lock file is never written through."""
from __future__ import annotations

import errno
import shutil

import pytest

from tests.helpers import REFERENCE, cli_args, stops
from utils.io import LinkError, append_line, check_links, escaping_links
from utils.lock import FolderLock, LockError


def test_links_leading_outside_are_found_and_links_inside_are_allowed(tmp_path):
    root, outside = tmp_path / "run", tmp_path / "outside"
    (root / "checkpoints").mkdir(parents=True)
    outside.mkdir()
    (root / "config.json").write_text("{}")
    (root / "copy.json").symlink_to("config.json")  # inside: allowed
    (root / "checkpoints" / "up.json").symlink_to("../config.json")  # inside, through a parent: allowed
    check_links(root)
    (root / "tokenizer").symlink_to(outside)  # a folder outside
    (root / "checkpoints" / "secret").symlink_to(tmp_path / "secret.txt")  # dangling: leads nowhere inside
    (root / "loop").symlink_to("loop")
    found = sorted(str(p.relative_to(root)) for p, _ in escaping_links(root))
    assert found == ["checkpoints/secret", "loop", "tokenizer"]
    with pytest.raises(LinkError, match=r"holds 3 links leading outside it .*Remove them .*or pick another"):
        check_links(root, fix="pick another")


def test_a_planted_lock_link_is_refused_and_its_target_never_written(tmp_path):
    (tmp_path / "victim.txt").write_text("precious")
    study = tmp_path / "study"
    study.mkdir()
    (study / ".lock").symlink_to("../victim.txt")
    with pytest.raises(LockError, match=r"\.lock -> \.\./victim.txt.*choose another --out"):
        FolderLock(study, hint="choose another --out").acquire()
    (study / ".lock").unlink()
    (study / ".lock").symlink_to("notes.txt")  # even a link inside the folder is not written through
    (study / "notes.txt").write_text("mine")
    with pytest.raises(LockError, match=r"\.lock is a link"):
        FolderLock(study).acquire()
    assert (tmp_path / "victim.txt").read_text() == "precious" and (study / "notes.txt").read_text() == "mine"


def test_split_panels_refuses_a_study_folder_with_an_escaping_lock_link(tmp_path, capsys):
    from research import split_panels
    study = tmp_path / "study"
    shutil.copytree(REFERENCE, study)
    (tmp_path / "victim.txt").write_text("precious")
    (study / ".lock").symlink_to("../victim.txt")
    assert "victim.txt" in stops(capsys, split_panels.main, [str(study)])
    assert (tmp_path / "victim.txt").read_text() == "precious"


def test_the_data_cache_lock_checks_links_as_well(tmp_path):
    """prepare_data takes the cache's lock with read_only_ok=True: the link rule applies there too."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tokenizers").symlink_to(tmp_path)
    with pytest.raises(LockError, match="tokenizers ->"):
        FolderLock(tmp_path / "cache", hint="choose another --cache_dir").acquire(read_only_ok=True)


def test_appending_never_writes_through_a_link(tmp_path):
    (tmp_path / "victim.txt").write_text("precious\n")
    (tmp_path / "metrics.jsonl").symlink_to(tmp_path / "victim.txt")
    with pytest.raises(OSError) as err:
        append_line(tmp_path / "metrics.jsonl", '{"step": 1}')
    assert err.value.errno == errno.ELOOP and (tmp_path / "victim.txt").read_text() == "precious\n"


def test_training_refuses_a_run_folder_whose_checkpoints_lead_outside(corpus_file, cache_dir, tmp_path, capsys):
    import train_llm
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "checkpoints").symlink_to(elsewhere)
    err = stops(capsys, train_llm.main, cli_args(corpus_file, cache_dir, run, 2))
    assert "checkpoints ->" in err and "choose another --out" in err
    assert not any(elsewhere.iterdir()) and sorted(p.name for p in run.iterdir()) == ["checkpoints"]


def test_inspection_and_the_model_cache_refuse_links_leading_outside(tmp_path):
    from configs import get_preset
    from configs.files import save_run_config
    from research.access.adapters import InspectError
    from research.access.loading import load_model
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    save_run_config(get_preset("debug"), run / "config.json")
    (run / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(InspectError, match=r"checkpoints -> .*elsewhere.*inspect another run"):
        load_model(str(run))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "gguf").symlink_to(elsewhere)
    with pytest.raises(InspectError, match=r"gguf -> .*pass another --cache_dir"):
        load_model("smollm2-135m", cache_dir=cache)
