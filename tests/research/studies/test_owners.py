"""One rule for which tool owns a folder (research.results.owners): every writer refuses a folder holding another
tool's results file, naming the owner, the file and the fix; nothing is written and no folder is left."""
from __future__ import annotations

from pathlib import Path

import pytest

from research import split_panels
from research.results.owners import OWNERS, owners_of, refuse_foreign
from research.results.vocabulary import INSPECT_FILE
from research.studies.kinds import KINDS
from tests.helpers import stops
from tests.research.studies.stored import unpack

FIX = "pass another --out (nothing was written)"


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def folders(tmp_path) -> dict[str, Path]:
    """A stored study folder of each kind needed, unpacked and drawn, and an inspection folder."""
    out = {}
    for kind in ("pretrained_keys", "checkpoint_keys", "finetune"):
        out[kind], _ = unpack(kind, tmp_path / kind)
    out["inspect"] = tmp_path / "inspect"
    out["inspect"].mkdir()
    (out["inspect"] / INSPECT_FILE).write_text("{}")
    (out["inspect"] / "report.md").write_text("# inspection\n")
    return out


def test_every_kind_of_one_file_is_found_by_the_file_its_owner_names():
    for kind in KINDS.values():
        if kind.found_by:
            assert OWNERS[kind.name].files == (kind.found_by,)
    assert {"run", "inspect", "pretrained_keys", "checkpoint_keys"} <= set(OWNERS)


@pytest.mark.parametrize("source, target, owner", [
    ("pretrained_keys", "checkpoint_keys", "research/checkpoint_keys_study.py, by its checkpoint_keys.json"),
    ("checkpoint_keys", "inspect", "research/inspect_pretrained.py, by its inspect.json"),
    ("pretrained_keys", "finetune", "the study 'finetune_keys_study' (kind finetune), by its study.json"),
    ("finetune", "pretrained_keys", "research/pretrained_keys_study.py, by its pretrained_keys.json"),
])
def test_split_panels_never_draws_one_kind_over_another(folders, capsys, source, target, owner):
    before = snapshot(folders[target])
    err = stops(capsys, split_panels.main, [str(folders[source]), "--out", str(folders[target])])
    assert err == (f"error: {folders[target]} belongs to {owner}: the drawing of a {source} study (split_panels.py) "
                   f"writes only into a folder of its own ({source}) or a new one, never over another tool's results "
                   f"and report; {FIX}")
    assert snapshot(folders[target]) == before


def test_split_panels_redraws_its_own_kind_and_refuses_a_mixed_folder(folders, tmp_path, capsys):
    split_panels.main([str(folders["pretrained_keys"])])  # its own folder
    split_panels.main([str(folders["pretrained_keys"]), "--out", str(tmp_path / "copy")])  # a new one, twice
    split_panels.main([str(folders["pretrained_keys"]), "--out", str(tmp_path / "copy")])
    mixed = folders["pretrained_keys"]
    (mixed / "checkpoint_keys.json").write_bytes((folders["checkpoint_keys"] / "checkpoint_keys.json").read_bytes())
    before = snapshot(mixed)
    err = stops(capsys, split_panels.main, [str(mixed)])  # the default: into the study folder itself
    assert "belongs to research/checkpoint_keys_study.py, by its checkpoint_keys.json" in err and FIX in err
    assert snapshot(mixed) == before


def test_the_measuring_studies_and_the_inspection_refuse_another_tools_folder(folders, capsys):
    from research import finetune_keys_study, inspect_pretrained, pretrained_keys_study
    cases = [
        (pretrained_keys_study.main, ["--out", str(folders["checkpoint_keys"])], "checkpoint_keys",
         "research/checkpoint_keys_study.py, by its checkpoint_keys.json: pretrained_keys_study.py writes only into "
         "a folder of its own (pretrained_keys)"),
        (finetune_keys_study.main, ["--out", str(folders["inspect"])], "inspect",
         "research/inspect_pretrained.py, by its inspect.json: finetune_keys_study.py writes only into a folder of "
         "its own (finetune)"),
        (inspect_pretrained.main, ["--model", "smollm2-135m", "--out", str(folders["finetune"])], "finetune",
         "the study 'finetune_keys_study' (kind finetune), by its study.json: inspect_pretrained.py"),
        (finetune_keys_study.main, ["--out", str(folders["pretrained_keys"])], "pretrained_keys",
         "research/pretrained_keys_study.py, by its pretrained_keys.json: finetune_keys_study.py"),
    ]
    for main, argv, target, words in cases:
        before = snapshot(folders[target])
        err = stops(capsys, main, argv)
        assert words in err and err.endswith(FIX), err
        assert snapshot(folders[target]) == before  # no .lock either


def test_a_catalog_study_refuses_another_kinds_folder(folders, capsys):
    from research import qk_norm_25m_study
    before = snapshot(folders["pretrained_keys"])
    err = stops(capsys, qk_norm_25m_study.main, ["--preset", "debug", "--out", str(folders["pretrained_keys"])])
    assert "belongs to research/pretrained_keys_study.py, by its pretrained_keys.json: the study qk_norm_50m_study " \
           "writes only into a folder of its own (qk_norm)" in err and err.endswith(FIX)
    assert snapshot(folders["pretrained_keys"]) == before


def test_owners_of_names_every_owner_and_an_unreadable_study_json(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pretrained_keys.json").write_text("{}")
    (tmp_path / "study.json").write_text("{not json")
    held = owners_of(tmp_path)
    assert [(h.kind, h.files) for h in held] == [("run", ("config.json",)), ("pretrained_keys", (
        "pretrained_keys.json",)), (None, ("study.json",))]
    with pytest.raises(Exception, match="a study whose study.json cannot be read, by its study.json"):
        refuse_foreign(tmp_path, "pretrained_keys", "tool")
    refuse_foreign(tmp_path / "new", "inspect", "tool")  # a new folder: nobody's


def test_a_refused_command_leaves_no_new_folder(tmp_path, capsys):
    """A refusal after the folder was locked (a model that cannot be loaded) leaves no folder holding only .lock."""
    from research import finetune_keys_study
    out = tmp_path / "new" / "study"
    err = stops(capsys, finetune_keys_study.main, ["--model", str(tmp_path / "no_such_model"), "--out", str(out)])
    assert "no_such_model" in err
    assert not (tmp_path / "new").exists()
