"""The declared formats as JSON Schema (python -m research.results.schema --json_schema DIR): the files shipped in
docs/schema/ are what the declarations generate today, one per kind of file the project writes (combined.json one
per study kind, picked by the folder's owner); every JSON and JSON-lines file of every stored folder validates with
jsonschema and with the project's own checker; a file the project's checker refuses fails jsonschema at the field
the checker names; the tool writes only into a folder of its own."""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import tarfile

import pytest

from research.results.layout import check_study_index
from research.results.published import JSON_SCHEMAS, check_file, json_schemas, schema_for
from research.results.schema import ResultsError, main, validate
from utils import file_specs
from utils.formats import FormatError
from utils.lock import LOCK_NAME, FolderLock
from utils.owners import OWNERS, REDRAW, SCHEMA_FILES, STUDY_INDEX, redraw_record
from tests.helpers import REPO

jsonschema = pytest.importorskip("jsonschema")

SHIPPED = REPO / "docs" / "schema"
STORED = REPO / "tests" / "research" / "studies" / "stored"
FIXTURES = REPO / "tests" / "fixtures"
# the files written below research/results (utils.file_specs): a checkpoint's, the caches', a folder's lock
BELOW_RESULTS = (file_specs.STATE_FILE, file_specs.BLOCKS_META, file_specs.DATA_TOKENIZER, file_specs.GGUF_SOURCE,
                 LOCK_NAME)


def _validator(name: str):
    schema = json.loads(json_schemas()[name])
    jsonschema.Draft202012Validator.check_schema(schema)  # a valid draft 2020-12 schema
    return jsonschema.Draft202012Validator(schema)


def _loaded(schema: str, text: str):
    """A file's value as its schema reads it: a JSON-lines file as its list of lines."""
    return [json.loads(ln) for ln in text.splitlines() if ln.strip()] if JSON_SCHEMAS[schema].lines \
        else json.loads(text)


def _stored_files(tmp_path) -> list[tuple[str, str | None, object]]:
    """(where, its schema, loaded) of every .json and .jsonl file of every stored folder: the fixtures, and each
    stored study archive unpacked (its expected/ outputs are its study folder's, told by that folder's owner)."""
    out = []
    for archive in sorted(STORED.glob("*.tar.gz")):
        root = tmp_path / archive.name
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
    for base, root in [(FIXTURES, FIXTURES), *((tmp_path, p) for p in sorted(tmp_path.iterdir()))]:
        for path in sorted(p for p in root.rglob("*") if p.suffix in (".json", ".jsonl")):
            folder = path.parent.parent / "study" if path.parent.name == "expected" else path.parent
            schema = schema_for(folder, path.name)
            out.append((str(path.relative_to(base)), schema, schema and _loaded(schema, path.read_text())))
    return out


def test_the_shipped_schema_files_are_what_the_declarations_generate():
    """docs/schema/ is current: after a change to a declaration, `python -m research.results.schema --json_schema
    docs/schema` writes it again; the schema tool's owner record names its files."""
    assert sorted(p.name for p in SHIPPED.glob("*.json")) == sorted(JSON_SCHEMAS) == sorted(SCHEMA_FILES)
    assert OWNERS["schema"].marks == SCHEMA_FILES
    for name, text in json_schemas().items():
        assert (SHIPPED / name).read_text() == text, \
            f"docs/schema/{name} is stale: python -m research.results.schema --json_schema docs/schema"


def test_every_json_file_a_tool_marks_its_folder_with_is_published():
    """Each owner's JSON and JSON-lines files (utils.owners), the run's, the indexes and the storage manifest (the
    schema tool's own files are JSON Schemas: the metaschema checks them)."""
    from research.studies.storage import STORED as MANIFEST
    from utils.run_names import ATOMIC_FILES
    from utils.owners import AUDIT_FILE, DECIDE_FILE  # qk-audit's and qk-decide's --json: where the user names
    written = {n for o in OWNERS.values() for n in (*o.marks, *o.writes)} | {*ATOMIC_FILES, STUDY_INDEX, REDRAW,
                                                                              MANIFEST, *BELOW_RESULTS, AUDIT_FILE,
                                                                              DECIDE_FILE}
    assert {n for n in written if n.endswith((".json", ".jsonl")) or n == LOCK_NAME} - set(SCHEMA_FILES) == \
        {p.file for p in JSON_SCHEMAS.values()}


def test_the_command_writes_every_schema_file(tmp_path, capsys):
    main(["--json_schema", str(tmp_path / "schemas")])
    assert {p.name: p.read_text() for p in (tmp_path / "schemas").iterdir()} == json_schemas()
    assert capsys.readouterr().out.split() == [str(tmp_path / "schemas" / name) for name in SCHEMA_FILES]
    schema = json.loads((tmp_path / "schemas" / "results.schema.json").read_text())
    assert schema["required"] == ["tag", "tokens", "loss", "val_loss", "mean_pr", "layer_pr"]
    assert schema["properties"]["layer_pr"]["propertyNames"] == {"pattern": "^(?:0|[1-9][0-9]*)$"}
    main(["--json_schema", str(tmp_path / "schemas")])  # its own folder: written again
    assert capsys.readouterr().out.count("\n") == len(SCHEMA_FILES)


def test_python_m_runs_the_command_without_a_warning(tmp_path):
    """The package imports schema only when asked for a name, so runpy runs the module once, as __main__."""
    done = subprocess.run([sys.executable, "-m", "research.results.schema", "--json_schema", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(SCHEMA_FILES)


def _refused(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as refused:
        main(list(argv))
    err = capsys.readouterr().err
    assert refused.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_an_empty_folder_name_is_refused_not_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = _refused(capsys, "--json_schema", "")
    assert "--json_schema '': an empty folder name would write into the current folder" in err
    assert "--json_schema docs/schema" in err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("owner", ["study", "run"])
def test_a_studys_or_a_runs_folder_is_refused_before_anything_is_written(owner, tmp_path, capsys):
    if owner == "study":
        (tmp_path / "study.json").write_text(json.dumps({"kind": "conditions", "study": "mine"}))
    else:
        (tmp_path / "results.json").write_text("{}")
    before = sorted(p.name for p in tmp_path.iterdir())
    err = _refused(capsys, "--json_schema", str(tmp_path))
    assert ("the study 'mine' (kind conditions)" if owner == "study" else "a training run") in err
    assert "nothing was written" in err and sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_file_that_cannot_be_written_is_named_never_its_temporary_file(tmp_path, capsys):
    (tmp_path / "study.schema.json").mkdir()  # os.replace of the temporary file onto a folder fails
    err = _refused(capsys, "--json_schema", str(tmp_path))
    assert f"cannot write {tmp_path / 'study.schema.json'}: " in err and ".tmp" not in err
    assert ".study.schema.json." not in err


def _study(folder, kind: str):
    folder.mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps({"kind": kind}))
    return folder


def test_combined_json_has_one_schema_per_kind_picked_by_the_folders_owner(tmp_path, capsys):
    qk, cond = _study(tmp_path / "qk", "qk_norm"), _study(tmp_path / "cond", "conditions")
    redraw = tmp_path / "redraw"
    redraw.mkdir()
    (redraw / REDRAW).write_text(json.dumps(redraw_record(cond, "conditions")))
    assert schema_for(qk, "combined.json") == "combined.qk_norm.schema.json"
    assert schema_for(cond, "combined.json") == schema_for(redraw, "combined.json") == \
        "combined.conditions.schema.json"
    assert schema_for(tmp_path, "combined.json") is None and schema_for(qk, "results.json") == "results.schema.json"
    main(["--schema_of", str(cond / "combined.json")])
    assert capsys.readouterr().out == "combined.conditions.schema.json\n"
    assert "no published schema" in _refused(capsys, "--schema_of", str(tmp_path / "combined.json"))


def test_each_kinds_combined_json_fails_the_other_kinds_schema(tmp_path):
    """The issue's finding: the QK-norm study's schema refused a study file's combined.json; each has its own."""
    files = {}
    for kind in ("qk_norm", "conditions"):
        with tarfile.open(STORED / f"{kind}.tar.gz") as tar:
            files[kind] = json.load(tar.extractfile("expected/combined.json"))
    assert not list(_validator("combined.conditions.schema.json").iter_errors(files["conditions"]))
    assert list(_validator("combined.qk_norm.schema.json").iter_errors(files["conditions"]))
    assert list(_validator("combined.conditions.schema.json").iter_errors(files["qk_norm"]))


def test_every_stored_file_validates(tmp_path):
    validators = {name: _validator(name) for name in JSON_SCHEMAS}
    counts: dict[str, int] = {}
    for where, schema, loaded in _stored_files(tmp_path):
        assert schema is not None, f"{where}: no published schema"
        lines = loaded if JSON_SCHEMAS[schema].lines else [loaded]
        for value in lines:
            errors = [f"{list(e.absolute_path)}: {e.message}" for e in validators[schema].iter_errors(value)]
            assert not errors, f"{where}: {errors[:3]}"
        check_file(schema, loaded)  # the project's own checker agrees
        counts[schema] = counts.get(schema, 0) + 1
    # 3 reference results and 46 stored ones; a study.json in each of the 8 stored studies that have one; each
    # study kind's combined file; the measured models' files; the spike study's per-step logs
    assert counts == {"results.schema.json": 49, "study.schema.json": 8, "combined.qk_norm.schema.json": 1,
                      "combined.conditions.schema.json": 1, "combined_results.schema.json": 1,
                      "pretrained_keys.schema.json": 1, "checkpoint_keys.schema.json": 1, "metrics.schema.json": 4}


def test_files_written_today_validate(tmp_path):
    """What the writers write that no stored folder holds: a redraw's mark and a storage's manifest."""
    for schema, value in (("redraw.schema.json", redraw_record(tmp_path, "qk_norm")),
                          ("stored.schema.json", {"files": ["config.json", "checkpoints/step_00000004/state.json"],
                                                  "checkpoints": ["step_00000004"]})):
        assert not list(_validator(schema).iter_errors(value))
        check_file(schema, value)


def _valid(schema: str, value) -> None:
    """`value` (a JSON-lines file: its list of lines) validates with jsonschema and with the project's checker."""
    for item in value if JSON_SCHEMAS[schema].lines else [value]:
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in _validator(schema).iter_errors(item)]
        assert not errors, f"{schema}: {errors[:3]}"
    check_file(schema, value)


def test_a_lock_written_today_validates(tmp_path):
    with FolderLock(tmp_path / "folder"):
        text = (tmp_path / "folder" / LOCK_NAME).read_text()
    assert schema_for(tmp_path / "folder", LOCK_NAME) == "lock.schema.json" and text.endswith("}\n")
    _valid("lock.schema.json", json.loads(text))


def test_a_lock_whose_record_does_not_fit_names_no_holder(tmp_path):
    """The reader of a .lock (who holds the folder) checks it: a record that does not fit is not read."""
    from utils.lock import _holder_text
    path = tmp_path / LOCK_NAME
    path.write_text(json.dumps({"pid": "12", "host": "h", "started": "now", "command": "x"}))
    assert list(_validator("lock.schema.json").iter_errors(json.loads(path.read_text())))
    with open(path) as f:
        assert _holder_text(f.fileno()) == "another process (its details are not readable)"


def test_a_gguf_source_record_written_today_validates(tmp_path):
    """gguf_source.json as the conversion writes it (research.access.gguf.source_record) from a real GGUF file's
    header; the reader (read_meta) takes it, and takes no record that does not fit."""
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    from research.access.gguf import _gguf_summary, read_meta, source_record
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.attention.head_count", 2)
    w.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    record = source_record(path, "ab" * 32, _gguf_summary(path), "llama", 1.25, 97, 3.5)
    assert record["tensor_types"] == {"F32": 8} and "settings" not in record
    _valid("gguf_source.schema.json", record)
    (tmp_path / file_specs.GGUF_SOURCE).write_text(json.dumps(record))
    assert read_meta(tmp_path) == record
    (tmp_path / file_specs.GGUF_SOURCE).write_text(json.dumps({**record, "gguf_sha256": "ab"}))
    assert read_meta(tmp_path) is None


def test_a_checkpoint_state_that_does_not_fit_fails_where_the_checker_says():
    """The spec moved to utils.file_specs: training.checkpoint checks it; jsonschema names the same field."""
    from training.checkpoint import STATE, check_state
    assert STATE is file_specs.CHECKPOINT_STATE
    state = {"step": 4, "tokens": 256, "loader": {}, "callbacks": {"probe": 3}}
    with pytest.raises(FormatError) as refused:
        check_state(copy.deepcopy(state))
    assert _path(refused.value.where) == ["callbacks", "probe"]
    assert [list(e.absolute_path) for e in _validator("state.schema.json").iter_errors(state)] == \
        [["callbacks", "probe"]]


def _written(folder) -> list:
    """Every file the project may have written in `folder` (JSON, JSON lines, .lock), with its schema or None."""
    return [(p, schema_for(p.parent, p.name)) for p in sorted(folder.rglob("*"))
            if p.suffix in (".json", ".jsonl") or p.name == LOCK_NAME]


@pytest.mark.slow
def test_every_file_of_a_run_and_of_its_data_cache_validates(straight_run, cache_dir):
    """A real run (train_llm.py, 6 steps of the debug preset) and the data cache it prepared: its config, metrics,
    summary, results, each checkpoint's state.json, its folder's .lock, the token blocks' meta.json and the
    tokenizer's data_tokenizer.json. What the tokenizers library writes into a tokenizer folder is not ours."""
    seen, theirs = {}, set()
    for path, schema in _written(straight_run) + _written(cache_dir):
        if schema is None:
            theirs.add(path.name)
            continue
        text = path.read_text()
        _valid(schema, [json.loads(ln) for ln in text.splitlines() if ln.strip()] if JSON_SCHEMAS[schema].lines
               else json.loads(text))
        seen[schema] = seen.get(schema, 0) + 1
    assert {"config.schema.json", "metrics.schema.json", "summary.schema.json", "results.schema.json",
            "state.schema.json", "lock.schema.json", "meta.schema.json", "data_tokenizer.schema.json"} <= set(seen)
    assert theirs <= {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}, theirs


def _path(where: str) -> list:
    """The checker's field path ("probes[1].layers[0].layer", "gamma_final['1'][1]", "conditions.QK") as JSON
    Schema's (["probes", 1, "layers", 0, "layer"])."""
    parts = re.findall(r"\[(\d+)\]|\['([^']*)'\]|([^.\[\]]+)", where)
    return [int(i) if i else key or name for i, key, name in parts]


def test_the_path_reader_reads_the_checkers_paths():
    assert _path("probes[1].layers[0].layer") == ["probes", 1, "layers", 0, "layer"]
    assert _path("gamma_final['1'][1]") == ["gamma_final", "1", 1]
    assert _path("") == []


def _stored(member: str) -> dict:
    with tarfile.open(STORED / "keys.tar.gz") as tar:
        return json.load(tar.extractfile(member))


def _set(d: dict, path: list, value) -> dict:
    d = copy.deepcopy(d)
    target = d
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return d


def _drop(d: dict, path: list) -> dict:
    d = copy.deepcopy(d)
    target = d
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return d


RESULTS_MUTATIONS = {  # name -> (mutation of a stored results.json, the field the checker names)
    "a layer index as text": (lambda r: _set(r, ["probes", 1, "layers", 0, "layer"], "0"),
                              "probes[1].layers[0].layer"),
    "a head count that is no integer": (lambda r: _set(r, ["config", "model", "n_heads"], 2.5), "config.model.n_heads"),
    "a loss as text": (lambda r: _set(r, ["val_loss", 2], "low"), "val_loss[2]"),
    "an ablation without its val_loss": (lambda r: _drop(r, ["gain_ablation", "learned", "val_loss"]),
                                         "gain_ablation.learned"),
    "a layer key that is no index": (lambda r: _set(r, ["layer_pr", "01"], r["layer_pr"]["0"]), "layer_pr"),
    "a gain statistic as text": (lambda r: _set(r, ["probes", 0, "layers", 1, "gamma_k", "note"], "hi"),
                                 "probes[0].layers[1].gamma_k.note"),
    "a site that is no map": (lambda r: _set(r, ["probes", 2, "layers", 0, "extra"], 3), "probes[2].layers[0].extra"),
    # the fields that decide which runs a study compares (research.analysis.identity)
    "a host kind that is no text": (lambda r: _set(r, ["provenance", "host_kind"], 3), "provenance.host_kind"),
    "a bf16 path of no CPU": (lambda r: _set(r, ["provenance", "cpu_bf16"], "AVX2"), "provenance.cpu_bf16"),
    "a precision no run trains in": (lambda r: _set(r, ["provenance", "train_precision"], "fp16"),
                                     "provenance.train_precision"),
    "native bf16 as text": (lambda r: _set(r, ["provenance", "cpu_native_bf16"], "yes"),
                            "provenance.cpu_native_bf16"),
}


@pytest.mark.parametrize("case", sorted(RESULTS_MUTATIONS))
def test_a_mutated_results_file_fails_where_the_checker_says(case):
    mutate, field = RESULTS_MUTATIONS[case]
    res = mutate(_stored("study/QK/seed_0/results.json"))
    with pytest.raises(ResultsError) as refused:
        validate(copy.deepcopy(res), "results.json")
    assert refused.value.__cause__.where == field
    assert str(refused.value).startswith(f"results.json: {field}")
    errors = list(_validator("results.schema.json").iter_errors(res))
    assert [list(e.absolute_path) for e in errors] == [_path(field)], [e.message for e in errors]


STUDY_MUTATIONS = {
    "a margin past 1": (lambda s: _set(s, ["margin"], 1.5), "margin"),
    "a condition's files as text": (lambda s: _set(s, ["conditions", "QK"], "QK/seed_0/results.json"), "conditions.QK"),
    "a kind of no study": (lambda s: _set(s, ["kind"], "keys2"), "kind"),
    # the checker tells a list of seeds whole (utils.formats.ListOf whole=True); jsonschema names the item in it
    "a seed as text": (lambda s: _set(s, ["seeds"], [0, "1"]), "seeds", ["seeds", 1]),
}


@pytest.mark.parametrize("case", sorted(STUDY_MUTATIONS))
def test_a_mutated_study_index_fails_where_the_checker_says(case, tmp_path):
    mutate, field, *inside = STUDY_MUTATIONS[case]
    meta = mutate(_stored("study/study.json"))
    with pytest.raises(ResultsError) as refused:
        check_study_index(copy.deepcopy(meta), tmp_path / "study.json", tmp_path)
    assert refused.value.__cause__.where == field
    assert str(refused.value).startswith(f"{tmp_path / 'study.json'}: {field}: ")
    errors = list(_validator("study.schema.json").iter_errors(meta))
    at = inside[0] if inside else _path(field)
    assert at[:len(_path(field))] == _path(field)
    assert [list(e.absolute_path) for e in errors] == [at], [e.message for e in errors]
