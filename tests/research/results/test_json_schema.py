"""The declared formats as JSON Schema (python -m research.results.schema --json_schema DIR): the files shipped in
docs/schema/ are what the declarations generate today; every stored results.json, study.json and QK-norm
combined.json validates with jsonschema; a file the project's checker refuses fails jsonschema at the field the
checker names."""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import tarfile

import pytest

from research.results.layout import check_study_index
from research.results.schema import JSON_SCHEMAS, ResultsError, json_schemas, main, validate
from tests.helpers import REFERENCE, REPO

jsonschema = pytest.importorskip("jsonschema")

SHIPPED = REPO / "docs" / "schema"
STORED = REPO / "tests" / "research" / "studies" / "stored"
FILES = {"results.json": "results.schema.json", "study.json": "study.schema.json",
         "combined.json": "combined.schema.json"}


def _validator(name: str):
    schema = json.loads(json_schemas()[name])
    jsonschema.Draft202012Validator.check_schema(schema)  # a valid draft 2020-12 schema
    return jsonschema.Draft202012Validator(schema)


def _stored_files() -> list[tuple[str, str, dict]]:
    """(where, file name, loaded) of every results.json, study.json and combined.json the repository stores: the
    reference study's results, and each stored study's inputs and its QK-norm combined.json."""
    out = [(str(p.relative_to(REPO)), "results.json", json.loads(p.read_text()))
           for p in sorted(REFERENCE.glob("*/results.json"))]
    for archive in sorted(STORED.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            for m in tar.getmembers():
                name = m.name.rsplit("/", 1)[-1]
                if name in FILES and (m.name.startswith("study/") or archive.name == "qk_norm.tar.gz"):
                    out.append((f"{archive.name}:{m.name}", name, json.load(tar.extractfile(m))))
    return out


def test_the_shipped_schema_files_are_what_the_declarations_generate():
    """docs/schema/ is current: after a change to a declaration, `python -m research.results.schema --json_schema
    docs/schema` writes it again."""
    assert sorted(p.name for p in SHIPPED.glob("*.json")) == sorted(JSON_SCHEMAS) == sorted(FILES.values())
    for name, text in json_schemas().items():
        assert (SHIPPED / name).read_text() == text, \
            f"docs/schema/{name} is stale: python -m research.results.schema --json_schema docs/schema"


def test_the_command_writes_the_three_files(tmp_path, capsys):
    main(["--json_schema", str(tmp_path / "schemas")])
    assert {p.name: p.read_text() for p in (tmp_path / "schemas").iterdir()} == json_schemas()
    assert capsys.readouterr().out.split() == [str(tmp_path / "schemas" / name) for name in FILES.values()]
    schema = json.loads((tmp_path / "schemas" / "results.schema.json").read_text())
    assert schema["required"] == ["tag", "tokens", "loss", "val_loss", "mean_pr", "layer_pr"]
    assert schema["properties"]["layer_pr"]["propertyNames"] == {"pattern": "^(?:0|[1-9][0-9]*)$"}


def test_python_m_runs_the_command_without_a_warning(tmp_path):
    """The package imports schema only when asked for a name, so runpy runs the module once, as __main__."""
    done = subprocess.run([sys.executable, "-m", "research.results.schema", "--json_schema", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES.values())


def test_every_stored_file_validates():
    validators = {name: _validator(schema) for name, schema in FILES.items()}
    counts: dict[str, int] = {}
    for where, name, loaded in _stored_files():
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validators[name].iter_errors(loaded)]
        assert not errors, f"{where}: {errors[:3]}"
        counts[name] = counts.get(name, 0) + 1
    # 3 reference results and 46 stored ones; a study.json in each of the 8 stored studies that have one
    assert counts == {"results.json": 49, "study.json": 8, "combined.json": 1}


@pytest.mark.slow
def test_a_results_file_written_today_validates(straight_run):
    errors = list(_validator("results.schema.json").iter_errors(json.loads((straight_run / "results.json")
                                                                           .read_text())))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


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
