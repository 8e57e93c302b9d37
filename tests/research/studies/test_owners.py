"""One rule for which tool owns a folder (utils.owners): every writer refuses a folder holding another
tool's results file, naming the owner, the file and the fix; nothing is written and no folder is left."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from research import split_panels
from research.results.vocabulary import GRID_KINDS, INSPECT_FILE, STUDY_KINDS
from research.studies import STUDIES
from research.studies.kinds import KINDS
from tests.helpers import stops
from tests.research.studies.stored import unpack
from utils.owners import OWNERS, owners_of, refuse_foreign

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


def test_every_kind_points_to_its_entry_in_the_owner_table_and_is_found_by_the_file_it_names():
    for kind in KINDS.values():
        assert kind.owner is OWNERS[kind.name]
        if kind.found_by:
            assert kind.owner.marks == (kind.found_by,)
    assert {"run", "inspect", "export", "redraw", "pretrained_keys", "checkpoint_keys"} <= set(OWNERS)


def test_the_registry_and_the_lists_of_kinds_are_the_table_of_kinds():
    """One record per study kind in the table, one registry entry per record and no other; the lists of kinds and
    the catalog's learning-rate grids agree with the table."""
    assert [k for k, o in OWNERS.items() if o.found_by] == ["pretrained_keys", "checkpoint_keys", "qk_norm", "pilot",
                                                            "keys", "heads", "lr", "finetune", "conditions", "spikes"]
    assert sorted(KINDS) == sorted(k for k, o in OWNERS.items() if o.found_by)
    assert STUDY_KINDS == ("qk_norm", "pilot", "keys", "heads", "lr", "finetune", "conditions", "spikes")
    assert GRID_KINDS == ("lr", "spikes")
    assert {study.kind: bool(study.lr_multipliers) for study in STUDIES.values()} == {
        study.kind: study.kind in GRID_KINDS for study in STUDIES.values()}


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
                   f"writes only into a folder of its own ({source}, a redraw of {folders[source].resolve()}) or a new "
                   f"one, never over another tool's results and report; {FIX}")
    assert snapshot(folders[target]) == before


def test_split_panels_redraws_its_own_kind_and_refuses_a_mixed_folder(folders, tmp_path, capsys):
    source = folders["pretrained_keys"]
    split_panels.main([str(source)])  # its own folder, which is not marked a redraw
    assert not (source / "redraw.json").exists()
    split_panels.main([str(source), "--out", str(tmp_path / "copy")])  # a new one, twice: the redraw of one folder
    split_panels.main([str(source), "--out", str(tmp_path / "copy")])
    assert json.loads((tmp_path / "copy" / "redraw.json").read_text()) == {"redraw_of": str(source.resolve()),
                                                                            "kind": "pretrained_keys"}
    other = tmp_path / "other"  # the same results in another folder: another study, whose redraw is another's
    shutil.copytree(source, other)
    before = snapshot(tmp_path / "copy")
    err = stops(capsys, split_panels.main, [str(other), "--out", str(tmp_path / "copy")])
    assert err == (f"error: {tmp_path / 'copy'} belongs to a redraw of {source.resolve()} (a pretrained_keys study, "
                   f"drawn by split_panels.py --out), by its redraw.json: the drawing of a pretrained_keys study "
                   f"(split_panels.py) writes only into a folder of its own (pretrained_keys, a redraw of "
                   f"{other.resolve()}) or a new one, never over another tool's results and report; {FIX}")
    assert snapshot(tmp_path / "copy") == before
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
    (tmp_path / "config.json").write_text("{}")  # a model folder's config.json: no run's, and no other tool's
    assert [(h.kind, h.files) for h in owners_of(tmp_path)] == [("model", ("config.json",))]
    with pytest.raises(Exception, match=r"belongs to a model folder or another program's files \(its config.json is "
                                        r"no run's config\), by its config.json: tool writes only"):
        refuse_foreign(tmp_path, "keys", "tool")
    refuse_foreign(tmp_path, "export", "tool", accept=("model",))  # the export may replace a model folder's files
    (tmp_path / "config.json").write_text('{"model": {}, "train": {}, "data": {}}')  # a run's
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


# ------------------------------------------------------------------ one owner for runs, redraws and study files

def training_refusal(folder: Path, owner: str) -> str:
    return (f"error: {folder} belongs to {owner}: a training run writes only into a folder of its own (run) or a new "
            f"one, never over another tool's results and report; {FIX}")


@pytest.fixture(scope="module")
def redrawn(tmp_path_factory) -> tuple[Path, Path]:
    """(a stored QK-norm study, its redraw by split_panels --out): the redraw writes combined.json, the file that
    marks the QK-norm study's folder, beside its redraw.json."""
    root = tmp_path_factory.mktemp("redrawn")
    source, _ = unpack("qk_norm", root / "qk_norm")
    split_panels.main([str(source), "--out", str(root / "redraw")])
    return source, root / "redraw"


def test_train_llm_onto_a_study_folder_is_refused_and_nothing_is_written(redrawn, corpus_file, cache_dir, capsys):
    """It used to exit 0 with a run in the study's root, after which the study could be neither redrawn nor
    continued (its folder then held a run's files)."""
    import train_llm
    from tests.helpers import cli_args
    study, _ = redrawn
    before = snapshot(study)
    err = stops(capsys, train_llm.main, cli_args(corpus_file, cache_dir, study, 2))
    assert err == training_refusal(study, "the study 'qk_norm_50m_study' (kind qk_norm), by its study.json")
    assert snapshot(study) == before and not (study / ".lock").exists()


def test_a_run_into_a_redraw_folder_is_refused_naming_the_redraw(redrawn, corpus_file, cache_dir, capsys):
    import train_llm
    from tests.helpers import cli_args
    source, redraw = redrawn
    assert json.loads((redraw / "redraw.json").read_text()) == {"redraw_of": str(source.resolve()), "kind": "qk_norm"}
    before = snapshot(redraw)
    err = stops(capsys, train_llm.main, cli_args(corpus_file, cache_dir, redraw, 2))
    assert err == training_refusal(redraw, f"a redraw of {source.resolve()} (a qk_norm study, drawn by split_panels.py "
                                           f"--out), by its redraw.json")
    assert snapshot(redraw) == before


STUDY_FILE = "name: mine\nseeds: [0]\npreset: debug\ntokens: 4096\nconditions:\n  QK: {}\n  NoQK: {qk_norm: none}\n"


@pytest.mark.parametrize("which", ["a study file", "the QK-norm study"])
def test_a_study_refused_in_a_redraw_folder_names_the_redraw(redrawn, tmp_path, capsys, which):
    """A study file's (kind conditions) was told the QK-norm study owns the folder, by the redraw's combined.json; the
    QK-norm study itself (the redraw's kind) was let in, mixing its runs into a redraw."""
    from research import qk_norm_25m_study, study
    source, redraw = redrawn
    if which == "a study file":
        path = tmp_path / "s.yaml"
        path.write_text(STUDY_FILE)
        main, argv, writer = study.main, [str(path), "--out", str(redraw)], ("the study mine", "conditions")
    else:
        main, argv = qk_norm_25m_study.main, ["--preset", "debug", "--out", str(redraw)]
        writer = ("the study qk_norm_50m_study", "qk_norm")
    before = snapshot(redraw)
    err = stops(capsys, main, argv)
    assert err == (f"error: {redraw} belongs to a redraw of {source.resolve()} (a qk_norm study, drawn by "
                   f"split_panels.py --out), by its redraw.json: {writer[0]} writes only into a folder of its own "
                   f"({writer[1]}) or a new one, never over another tool's results and report; {FIX}")
    assert snapshot(redraw) == before


@pytest.mark.parametrize("name", ["checkpoints", "tokenizer", "Checkpoints", "wandb", "trackio"])
def test_a_condition_named_as_a_runs_own_folder_is_refused_when_the_study_file_is_read(tmp_path, capsys, name):
    """Its folder <study>/<name> made the study's folder a run's: every run trained, then the drawing refused the
    study's own folder. Lower case too: on macOS and Windows 'Checkpoints' is the folder checkpoints."""
    from research import study
    path = tmp_path / "s.yaml"
    path.write_text(STUDY_FILE.replace("  NoQK:", f"  {name}:"))
    err = stops(capsys, study.main, [str(path), "--out", str(tmp_path / "out")])
    assert err == (f"error: {path}: condition {name!r} is named as a file or folder of a training run (train_llm.py, "
                   f"or a study's condition), which would make the study's folder read as that owner's. Fix: rename "
                   f"the condition (none of checkpoints, tokenizer, tensorboard, wandb, trackio)")
    assert not (tmp_path / "out").exists()


def test_an_export_folder_is_the_exports_and_an_export_never_lands_in_a_study(folders, tmp_path):
    from research.export.hf import check_out_dir
    from utils.owners import OwnerError
    export = tmp_path / "export"
    export.mkdir()
    (export / "export.json").write_text("{}")
    (export / "config.json").write_text('{"model_type": "qwen3"}')  # a Hugging Face config: the export's, no run's
    assert [(h.kind, h.files) for h in owners_of(export)] == [("export", ("export.json",))]
    with pytest.raises(OwnerError, match="belongs to research/export_hf.py, by its export.json: a training run"):
        refuse_foreign(export, "run", "a training run")
    check_out_dir(export, tmp_path / "run", force=True)  # an export over its own kind, with --force
    before = snapshot(folders["finetune"])
    with pytest.raises(OwnerError, match=r"belongs to the study 'finetune_keys_study' \(kind finetune\), by its "
                                         r"study.json: export_hf.py .* choose another output folder \(nothing"):
        check_out_dir(folders["finetune"], tmp_path / "run", force=True)  # --force reaches no other owner's folder
    assert snapshot(folders["finetune"]) == before


def test_an_unreadable_redraw_json_belongs_to_no_writer(tmp_path):
    (tmp_path / "redraw.json").write_text('{"kind": "keys"}')  # no redraw_of
    (tmp_path / "combined.json").write_text("{}")  # a redraw's: not the QK-norm study's
    assert [(h.kind, h.who, h.files) for h in owners_of(tmp_path)] == [
        (None, "a redraw whose redraw.json cannot be read", ("redraw.json",))]
    for kind in ("run", "keys", "qk_norm"):
        with pytest.raises(Exception, match="a redraw whose redraw.json cannot be read, by its redraw.json"):
            refuse_foreign(tmp_path, kind, "tool")
