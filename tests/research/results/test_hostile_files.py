"""Damaged, edited or foreign files the project reads: each kind has one check, used by every reader of it, whose
one-line message names the file, the field and the fix (never a traceback, never a silently wrong analysis)."""
from __future__ import annotations

import copy
import json
import math

import pytest

from configs import ConfigError
from research.analysis.rules import check_margin
from research.results import ResultsError, load_results, save_results
from research.results.layout import (condition_results, load_study, read_study_index, runs_from_combined,
                                     write_study_index)
from research.results.pretrained import SCHEMA as PRETRAINED_SCHEMA
from research.results.pretrained import load_pretrained_keys
from research.results.trajectory import SCHEMA as TRAJECTORY_SCHEMA
from research.results.trajectory import load_trajectory
from research.results.vocabulary import STUDY_KINDS
from tests.helpers import REFERENCE, stops
from tests.research.synthetic import make_results, qk_run

INDEX_FIX = "fix: rerun the study or correct/delete study.json"


def _study(folder, kind="qk_norm", **fields) -> dict:
    """A study folder of write-ups-style runs (seeds 0, 1) and its study.json as the runner writes it (fields
    override it)."""
    paths = {}
    for cond in ("QK", "QK_frozen", "NoQK"):
        for s in (0, 1):
            rel = f"{cond}/seed_{s}/results.json"
            save_results(folder / rel, qk_run(cond, s, 40.0, 3.6))
            paths.setdefault(cond, []).append(rel)
    meta = {"study": "qk_norm_50m_study", "kind": kind, "seeds": [0, 1], "preset": "tiny", "margin": 0.03,
            "loss_margin": 0.005, "conditions": paths, **fields}
    (folder / "study.json").write_text(json.dumps(meta))
    return meta


def _refused(folder, field: str) -> str:
    """load_study's message, which must start '<study.json>: <field>' and end with the fix."""
    with pytest.raises(ResultsError) as err:
        load_study(folder)
    msg = str(err.value)
    assert msg.startswith(f"{folder / 'study.json'}: {field}"), msg
    assert "\n" not in msg and msg.endswith(INDEX_FIX), msg
    return msg


# ----------------------------------------------------------------------------- study.json

INDEX_DAMAGE = [  # (field, damaged value, words of the message)
    ("conditions", [["QK/seed_0/results.json"]], "expected an object mapping each condition"),
    ("conditions", {}, "expected an object mapping each condition"),
    ("conditions", {"QK": "QK/seed_0/results.json"}, "conditions.QK: expected a non-empty list of results files"),
    ("conditions", {"QK": []}, "conditions.QK: expected a non-empty list"),
    ("conditions", {"QK": [1]}, "conditions.QK[0]: expected a path (text), found 1"),
    ("conditions", {"QK": [None]}, "conditions.QK[0]: expected a path (text), found None"),
    ("kind", ["qk_norm"], "kind: expected one of qk_norm, pilot, keys, heads, lr, finetune, conditions, spikes, "
     "found a list"),
    ("kind", "qk-norm", "kind: expected one of"),
    ("kind", None, "kind: expected one of"),
    ("margin", "0.03", "margin: margin '0.03' must be a share of the mean between 0 and 1"),
    ("margin", 5, "margin: margin 5 must be a share of the mean between 0 and 1"),
    ("margin", None, "margin: margin None must be"),
    ("loss_margin", 0, "loss_margin: loss_margin 0 must be a share"),
    ("loss_margin", True, "loss_margin: loss_margin True must be a share"),
    ("seeds", [0, 0], "seeds: expected each seed once, found seed(s) 0 more than once"),
    ("seeds", "0 1", "seeds: expected a non-empty list of integers, found '0 1'"),
    ("seeds", [0, 1.5], "seeds: expected a non-empty list of integers"),
    ("seeds", [], "seeds: expected a non-empty list of integers"),
    ("study", ["qk_norm_50m_study"], "study: expected a name (text), found a list"),
    ("preset", 3, "preset: expected a name (text), found 3"),
]


@pytest.mark.parametrize("field,value,words", INDEX_DAMAGE, ids=[f"{f}={v!r}" for f, v, _ in INDEX_DAMAGE])
def test_study_index_fields_are_checked_on_every_read(tmp_path, field, value, words):
    _study(tmp_path, **{field: value})
    assert words in _refused(tmp_path, field.split(".")[0])
    with pytest.raises(ResultsError, match="study.json: "):  # a read of study.json alone: the same check
        read_study_index(tmp_path)


def test_study_index_is_typed_and_absent_fields_are_none(tmp_path):
    assert read_study_index(tmp_path) == {} and read_study_index(tmp_path / "missing") == {}
    meta = _study(tmp_path, margin=0.05)
    del meta["loss_margin"], meta["seeds"]
    (tmp_path / "study.json").write_text(json.dumps(meta))
    index = read_study_index(tmp_path)
    assert index["margin"] == 0.05 and index["loss_margin"] is None and index["seeds"] is None
    assert index["kind"] == "qk_norm" and index["study"] == "qk_norm_50m_study"
    assert index["conditions"]["NoQK"] == [tmp_path / "NoQK/seed_0/results.json", tmp_path / "NoQK/seed_1/results.json"]


def test_a_margin_the_command_line_refuses_is_refused_in_study_json(tmp_path):
    """margin 5 turned 'both the gain and the normalization drive key PR' into 'neither'."""
    from research.studies.render import load_and_analyze
    _study(tmp_path, margin=5)
    with pytest.raises(ResultsError, match=r"study.json: margin: margin 5 must be a share of the mean"):
        load_and_analyze(tmp_path)
    with pytest.raises(ConfigError, match="^loss_margin 5 must be a share"):
        load_and_analyze(tmp_path, margin=0.03, loss_margin=5)


@pytest.mark.parametrize("value", [5, 0, 1, -0.01, math.nan, math.inf, "0.03", None, True, [0.03]])
def test_check_margin_is_the_one_margin_rule(value):
    with pytest.raises(ValueError, match=r"^--margin .* must be a share of the mean between 0 and 1 \(e.g. 0.03\)$"):
        check_margin("--margin", value)
    assert check_margin("margin", 0.03) == 0.03 and isinstance(check_margin("m", 1 / 2), float)


def test_study_index_cannot_name_files_outside_the_study(tmp_path):
    outside = tmp_path / "elsewhere"
    save_results(outside / "results.json", qk_run("QK", 0, 40.0, 3.6))
    study = tmp_path / "study"
    for entry in (str(outside / "results.json"), "../elsewhere/results.json", "QK/../../elsewhere/results.json"):
        _study(study, conditions={"QK": [entry]})
        assert "leads outside the study folder" in _refused(study, "conditions.QK[0]")
    (study / "QK" / "linked").symlink_to(outside, target_is_directory=True)
    _study(study, conditions={"QK": ["QK/linked/results.json"]})
    assert "'QK/linked/results.json' leads outside" in _refused(study, "conditions.QK[0]")
    (study / "QK" / "loop").symlink_to("loop")
    _study(study, conditions={"QK": ["QK/loop/results.json"]})
    assert "'QK/loop/results.json' leads outside" in _refused(study, "conditions.QK[0]")
    # without study.json: a condition folder, or the pilot's file, that is a link leading outside
    folders = tmp_path / "folders"
    folders.mkdir()
    (folders / "QK").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ResultsError, match=r"QK/results.json: leads outside the study folder .* through a link"):
        load_study(folders)
    (folders / "combined_results.json").symlink_to(outside / "results.json")
    with pytest.raises(ResultsError, match=r"combined_results.json: leads outside the study folder"):
        load_study(folders)


def test_study_index_entries_must_sit_in_their_condition_and_appear_once(tmp_path):
    meta = _study(tmp_path)
    _study(tmp_path, conditions={"QK": meta["conditions"]["NoQK"][:1], "NoQK": meta["conditions"]["NoQK"][1:]})
    assert "is not in the condition's folder QK/" in _refused(tmp_path, "conditions.QK[0]")
    _study(tmp_path, conditions={**meta["conditions"], "QK": ["QK/seed_0/results.json", "QK/./seed_0/results.json"]})
    assert "listed twice" in _refused(tmp_path, "conditions.QK[1]")
    _study(tmp_path, conditions={**meta["conditions"], "QK": ["QK/seed_9/results.json"]})
    assert "does not exist" in _refused(tmp_path, "conditions.QK")


def test_conditions_must_fit_the_kind(tmp_path):
    _study(tmp_path, kind="lr")  # a learning-rate study names its runs condition@multiplier
    assert "expected a run of the learning-rate grid" in _refused(tmp_path, "conditions.QK")
    for name in ("QK@0", "QK@-1", "QK@nan", "QK@x", "@4"):
        index = {"kind": "lr", "conditions": {name: ["QK/seed_0/results.json"]}}
        (tmp_path / "study.json").write_text(json.dumps(index))
        _refused(tmp_path, f"conditions.{name}")
    (tmp_path / "study.json").write_text(json.dumps({"kind": "lr", "conditions": {
        "QK@4": ["QK/lr_4/seed_0/results.json"], "QK@4.0": ["QK/lr_4/seed_1/results.json"]}}))
    assert "the same run as conditions.QK@4" in _refused(tmp_path, "conditions.QK@4.0")
    (tmp_path / "study.json").write_text(json.dumps({"kind": "qk_norm", "conditions": {"QK@4": ["QK/lr_4/r.json"]}}))
    assert "without '@'" in _refused(tmp_path, "conditions.QK@4")
    for name in ("", ".", "..", "QK/x", "../QK"):
        (tmp_path / "study.json").write_text(json.dumps({"kind": "qk_norm", "conditions": {name: ["QK/r.json"]}}))
        assert "a condition name, which is also its folder's" in _refused(tmp_path, f"conditions.{name}")


def test_write_study_index_refuses_what_a_read_would_refuse(tmp_path):
    with pytest.raises(ResultsError, match="study.json: margin: margin 5 must be"):
        write_study_index(tmp_path, name="x", kind="qk_norm", seeds=[0], preset="tiny",
                          conditions={"QK": ["QK/results.json"]}, margin=5, loss_margin=0.005)
    with pytest.raises(ResultsError, match="study.json: seeds: expected each seed once"):
        write_study_index(tmp_path, name="x", kind="qk_norm", seeds=[0, 0], preset="tiny",
                          conditions={"QK": ["QK/seed_0/results.json"]}, margin=0.03, loss_margin=0.005)
    assert not (tmp_path / "study.json").exists()


def test_study_kinds_are_the_registrys_kinds_a_study_json_names():
    from research.studies.kinds import KINDS
    assert tuple(name for name, kind in KINDS.items() if kind.found_by is None) == STUDY_KINDS


# ----------------------------------------------------------------------------- results.json

def _results_file(tmp_path, damage) -> str:
    res = json.loads(json.dumps(make_results()))
    res["config"]["train"] = {"seed": 0, "adamw_lr": 0.006, "wd_on_gains": True}
    damage(res)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    with pytest.raises(ResultsError) as err:
        load_results(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg, msg
    return msg


def _put(path: str, value):
    def damage(res):
        *parents, last = path.split(".")
        node = res
        for k in parents:
            node = node[k]
        node[last] = value
    return damage


RESULTS_DAMAGE = [  # (field path, damaged value, words of the message)
    ("config", [1], "config should be an object, found list"),
    ("config", "tiny", "config should be an object, found str"),
    ("config.model", [], "config.model should be an object, found list"),
    ("config.train", 3, "config.train should be an object, found int"),
    ("config.data", "english", "config.data should be an object, found str"),
    ("config.model.n_heads", "2", "config.model.n_heads should be a positive integer or null, found '2'"),
    ("config.model.d_model", 0, "config.model.d_model should be a positive integer or null, found 0"),
    ("config.train.seed", "0", "config.train.seed should be an integer or null, found '0'"),
    ("config.train.adamw_lr", None, "config.train.adamw_lr should be a number (config.train.wd_on_gains is set)"),
    ("config.preset", 1, "config.preset should be a preset name (text) or null, found 1"),
    ("seed", "0", "seed should be an integer or null, found '0'"),
    ("seed", 1.5, "seed should be an integer or null, found 1.5"),
    ("seed", True, "seed should be an integer or null, found True"),
    ("seed", [0], "seed should be an integer or null, found a list"),
    ("preset", 3, "preset should be a preset name (text) or null, found 3"),
    ("preset", {"name": "tiny"}, "preset should be a preset name (text) or null, found an object"),
    ("schema_version", "1", "schema_version should be a version (an integer) or null, found '1'"),
    ("provenance", [], "provenance should be an object, found list"),
    ("data", "x", "data should be an object, found str"),
    ("diverged", 5, "diverged should be an object, found int"),
    ("diverged", {"step": "5"}, "diverged.step should be a step (an integer) or null, found '5'"),
    ("init_val_loss", "8.3", "init_val_loss should be a number or null, found '8.3'"),
    ("wall_time_s", None, "wall_time_s should be a list of numbers or null, found NoneType"),
    ("probe_time_s", [0.1], "probe_time_s should have 5 values"),
    ("tag", ["QK"], "tag should be a condition name (text), found a list"),
    ("layer_pr", {"a": [1.0] * 5}, "layer_pr should be keyed by layer index ('0', '1', ...), found the key 'a'"),
    ("gamma_cv", {"01": [1.0] * 5}, "gamma_cv should be keyed by layer index"),
    ("gain_ablation", {"step": None, "learned": {"val_loss": 1.0, "mean_pr": 1.0},
                       "k_ones": {"val_loss": 1.0, "mean_pr": 1.0}}, "gain_ablation.step should be a step"),
    ("gain_ablation", {"learned": {}, "k_ones": {"val_loss": 1.0, "mean_pr": 1.0}},
     "gain_ablation.learned should hold val_loss"),
    ("n_seeds", None, "n_seeds should be a positive integer, found None"),
    ("seeds", [0, 0], "seeds [0, 0] names a seed more than once"),
]


@pytest.mark.parametrize("where,value,words", RESULTS_DAMAGE, ids=[f"{w}={v!r:.20}" for w, v, _ in RESULTS_DAMAGE])
def test_every_field_a_reader_indexes_is_type_checked(tmp_path, where, value, words):
    msg = _results_file(tmp_path, _put(where, value))
    assert words in msg and msg.endswith("restore it from a copy, or train that condition again"), msg


def test_a_newer_schema_version_is_refused_and_older_ones_are_read(tmp_path):
    msg = _results_file(tmp_path, _put("schema_version", 99))
    assert "schema_version: written by a newer version of this project (schema_version 99 > 1" in msg
    assert msg.endswith("update the code (git pull) to read it")
    for version in (0, 1, None):
        res = make_results()
        res["schema_version"] = version
        save_results(tmp_path / "ok.json", res)
        assert load_results(tmp_path / "ok.json")["schema_version"] == version
    res.pop("schema_version")
    save_results(tmp_path / "ok.json", res)
    assert "schema_version" not in load_results(tmp_path / "ok.json")


def test_nan_and_infinity_in_a_file_read_as_null(tmp_path):
    """Python's json writes NaN, which is not JSON: read as the project writes a missing value (null)."""
    path = tmp_path / "results.json"
    path.write_text('{"tag": "QK", "tokens": [0, 1], "loss": [NaN, 1.0], "val_loss": [Infinity, -Infinity], '
                    '"mean_pr": [2.0, 1.0], "layer_pr": {}}')
    res = load_results(path)
    assert res["loss"] == [None, 1.0] and res["val_loss"] == [None, None]
    path.write_text(path.read_text().replace('"tokens": [0, 1]', '"tokens": [0, NaN]'))
    with pytest.raises(ResultsError, match=r"tokens\[1\] should be a number, found None"):
        load_results(path)


# ----------------------------------------------------------------------------- the runs of a study

def test_a_file_tagged_as_another_condition_is_refused(tmp_path):
    save_results(tmp_path / "QK" / "results.json", qk_run("NoQK", 0, 40.0, 3.6))
    save_results(tmp_path / "NoQK" / "results.json", qk_run("NoQK", 0, 40.0, 3.6))
    with pytest.raises(ResultsError) as err:
        load_study(tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'QK' / 'results.json'}: tag: the file is tagged 'NoQK' but sits in the "
                          f"folder of condition 'QK' (QK/)") and "fix: " in msg
    # learning-rate runs are tagged condition@multiplier and live in <condition>/lr_<m>/
    study = tmp_path / "lr"
    for tag, seed in (("NoQK@4", 0), ("NoQK", 1)):  # a tag without its multiplier names the condition alone
        save_results(study / "NoQK" / "lr_4" / f"seed_{seed}" / "results.json", {**qk_run("NoQK", seed, 40, 3.6),
                                                                                 "tag": tag})
    meta = {"kind": "lr", "conditions": {"NoQK@4": ["NoQK/lr_4/seed_0/results.json", "NoQK/lr_4/seed_1/results.json"]}}
    (study / "study.json").write_text(json.dumps(meta))
    assert load_study(study)[1]["NoQK@4"][0]["tag"] == "NoQK@4"
    save_results(study / "NoQK" / "lr_4" / "seed_1" / "results.json", {**qk_run("NoQK", 1, 40, 3.6), "tag": "NoQK@16"})
    with pytest.raises(ResultsError, match=r"seed_1/results.json: tag: the file is tagged 'NoQK@16' but sits in the "
                                           r"folder of condition 'NoQK@4' \(NoQK/lr_4/\)"):
        load_study(study)


def test_the_writeups_reference_study_loads_with_its_tags():
    kind, runs = load_study(REFERENCE)
    assert kind == "qk_norm" and {c: [r["tag"] for r in rs] for c, rs in runs.items()} == {
        "QK": ["QK"], "QK_frozen": ["QK_frozen"], "NoQK": ["NoQK"]}
    assert not (REFERENCE / "study.json").exists()  # found by its condition folders
    bad = copy.deepcopy(runs["QK"][0])
    bad["tag"] = "NoQK"
    from research.results.layout import check_condition
    with pytest.raises(ResultsError, match="tagged 'NoQK'"):
        check_condition("QK", [REFERENCE / "QK" / "results.json"], [bad])


def test_a_seed_counted_twice_in_a_condition_is_refused(tmp_path):
    meta = _study(tmp_path)
    save_results(tmp_path / "QK" / "again" / "results.json", qk_run("QK", 0, 40.0, 3.6))
    (tmp_path / "study.json").write_text(json.dumps({**meta, "conditions": {
        **meta["conditions"], "QK": [*meta["conditions"]["QK"], "QK/again/results.json"]}}))
    with pytest.raises(ResultsError, match=r"QK/again/results.json: seed: seed 0 again \(.*QK/seed_0/results.json is "
                                           r"seed 0 of QK too\).*fix: "):
        load_study(tmp_path)
    # without study.json: a file whose seed is not its folder's
    folders = tmp_path / "folders"
    for folder_seed, seed in ((0, 0), (1, 0)):
        save_results(folders / "QK" / f"seed_{folder_seed}" / "results.json", qk_run("QK", seed, 40.0, 3.6))
    with pytest.raises(ResultsError, match=r"seed_1/results.json: seed: the file says seed 0 but sits in seed_1/"):
        load_study(folders)


def test_the_seeds_of_a_condition_must_be_one_model(tmp_path):
    """Runs of one condition with different numbers of layers crashed the key and head analyses."""
    six = make_results("QK", seed=0)
    four = make_results("QK", seed=1)
    for p in four["probes"]:
        p["layers"] = p["layers"][:4]
    for k in ("layer_pr", "gamma_cv", "gamma_final"):
        four[k] = {l: v for l, v in four[k].items() if int(l) < 4}
    for s, res in enumerate((six, four)):
        save_results(tmp_path / "QK" / f"seed_{s}" / "results.json", res)
    (tmp_path / "study.json").write_text(json.dumps({"kind": "keys", "conditions": {
        "QK": ["QK/seed_0/results.json", "QK/seed_1/results.json"]}}))
    with pytest.raises(ResultsError, match=r"seed_1/results.json: probes: 4 layers per probe record, but .*seed_0/"
                                           r"results.json \(also QK\) has 6"):
        load_study(tmp_path)


def test_condition_folders_other_than_seed_numbers_are_not_runs(tmp_path):
    save_results(tmp_path / "QK" / "seed_1" / "results.json", qk_run("QK", 1, 40.0, 3.6))
    save_results(tmp_path / "QK" / "seed_old" / "results.json", qk_run("QK", 0, 40.0, 3.6))
    assert [p.parent.name for p in condition_results(tmp_path, "QK")] == ["seed_1"]


# ----------------------------------------------------------------------------- combined_results.json

def _combined() -> dict:
    entry = {"tag": "qk_norm", "n_seeds": 2, "seeds": [0, 1], "tokens": [0, 100, 200], "train_loss": [None, 5.0, 4.0],
             "val_loss": [None, 5.1, 4.1], "mean_pr": [50.0, 40.0, 30.0], "layer_pr": {"0": [50.0, 40.0, 30.0]},
             "gamma_cv": {"0": [0.0, 0.1, 0.2]}}
    return {"qk_norm": entry, "no_qk_norm": {**copy.deepcopy(entry), "tag": "no_qk_norm", "gamma_cv": {}},
            "config": {"preset": "tiny"}}


COMBINED_DAMAGE = [  # (condition, field, damaged value, words)
    ("qk_norm", "mean_pr", ["50", 40.0, 30.0], "mean_pr[0] should be a number or null, found '50'"),
    ("qk_norm", "tokens", 200, "field 'tokens' should be a list (one value per probe), found int"),
    ("no_qk_norm", "val_loss", [None, 5.0], "val_loss should have 3 values (one per probe"),
    ("qk_norm", "layer_pr", [[50.0, 40.0, 30.0]], "layer_pr should be an object, found list"),
    ("qk_norm", "layer_pr", {"layer0": [50.0, 40.0, 30.0]}, "layer_pr should be keyed by layer index"),
    ("qk_norm", "n_seeds", "2", "n_seeds should be a positive integer, found '2'"),
    ("qk_norm", "seeds", [0, 0], "seeds [0, 0] names a seed more than once"),
    ("qk_norm", "seeds", [0, 1, 2], "seeds lists 3 seeds, n_seeds says 2"),
    ("qk_norm", "tag", 7, "tag should be a condition name (text), found 7"),
]


@pytest.mark.parametrize("cond,field,value,words", COMBINED_DAMAGE, ids=[f"{f}={v!r:.20}" for _, f, v, _ in
                                                                         COMBINED_DAMAGE])
def test_combined_results_go_through_the_results_check(tmp_path, cond, field, value, words):
    d = _combined()
    d[cond][field] = value
    path = tmp_path / "combined_results.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ResultsError) as err:
        load_study(tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: condition {cond!r}: ") and words in msg and "\n" not in msg, msg
    assert msg.endswith("run the pilot again (python research/qk_norm_500k_study.py)")


def test_combined_results_top_level_is_checked(tmp_path):
    path = tmp_path / "combined_results.json"
    for top, words in (([_combined()["qk_norm"]], "expected a JSON object of conditions, found a list"),
                       ({"config": {}}, "no condition in it"), ("{", "corrupted combined file: not valid JSON")):
        path.write_text(top if isinstance(top, str) else json.dumps(top))
        with pytest.raises(ResultsError, match=f"^{path}: {words}"):
            load_study(tmp_path)
    path.write_text(json.dumps(_combined()))
    runs = load_study(tmp_path)[1]
    assert list(runs) == ["qk_norm", "no_qk_norm"] and runs["qk_norm"][0]["loss"] == [None, 5.0, 4.0]
    assert runs_from_combined(_combined())["no_qk_norm"][0]["n_seeds"] == 2


# ----------------------------------------------------------------------------- split_panels

@pytest.mark.parametrize("field,value", [("margin", "0.03"), ("conditions", [1]), ("kind", ["qk_norm"])])
def test_split_panels_says_one_line_and_exits_non_zero(tmp_path, field, value, capsys):
    from research import split_panels
    _study(tmp_path, **{field: value})
    message = stops(capsys, split_panels.main, [str(tmp_path), "--out", str(tmp_path / "out")])
    assert message.startswith(f"error: {tmp_path / 'study.json'}: {field}")
    assert message.endswith(INDEX_FIX) and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- drawing what validation lets through

@pytest.mark.filterwarnings("ignore:Mean of empty slice")
def test_plots_draw_files_without_the_optional_values():
    """A learning-rate run without logit_max (every logit NaN) and a learned-gain ablation whose loss is null
    crashed the figures (log axes without a positive value; a sum over None)."""
    from research.analysis import lr as lr_analysis
    from research.analysis import qk_norm as qk_analysis
    from research.plots import lr as lr_plots
    from research.plots import qk_norm_report
    runs = {"QK@1": [make_results("QK@1", seed=s) for s in (0, 1)]}
    assert set(lr_plots.figures(lr_analysis.analyze(runs))) >= {"lr_keys.png", "lr_max_logit.png"}
    qk = {c: [make_results(c, qk_norm=q, seed=s) for s in (0, 1)]
          for c, q in (("QK", "learned"), ("QK_frozen", "frozen"), ("NoQK", "none"))}
    for s, r in enumerate(qk["QK"]):
        r["gain_ablation"] = {"learned": {"val_loss": None, "mean_pr": 30.0}, "k_ones": {"val_loss": 6.0 + s,
                                                                                         "mean_pr": 31.0}}
    assert "nan nats" in qk_norm_report.report(qk_analysis.analyze(qk))


# ----------------------------------------------------------------------------- pretrained_keys.json

def _pretrained_record():
    L, HQ, HKV = 2, 4, 2
    grid = [[1.0] * HKV] * L
    keys = {"k_norm": {"norm_mean": grid, "pr_sv": grid, "pr_var": grid, "erank": grid}}
    attn = {m: [[0.1] * HQ] * L for m in ("entropy", "sink_mass", "sink_mass_excl_q0")}
    return {"n_layers": L, "n_heads": HQ, "n_kv_heads": HKV, "head_dim": 4,
            "batches": [{"loss": 3.0 + b, "keys": copy.deepcopy(keys), "init_keys": copy.deepcopy(keys), "attn": attn}
                        for b in range(2)],
            "gains": {"k_norm": [[1.0, 2.0, 1.0, 1.0]] * L, "q_norm": None}}


PRETRAINED_DAMAGE = [  # (damage, words)
    (lambda r: r.update(params="135M"), "models.m.params should be a positive integer or null, found '135M'"),
    (lambda r: r.update(text=["x"]), "models.m.text should be an object or null, found a list"),
    (lambda r: r.update(text={"sha256": 7}), "models.m.text.sha256 should be text or null, found 7"),
    (lambda r: r.update(wall_s="3"), "models.m.wall_s should be a number of seconds or null"),
    (lambda r: r.update(family=["gemma3"]), "models.m.family should be text or null"),
    (lambda r: r.update(gguf={"gguf_file": "x.gguf"}), "models.m.gguf.gguf_sha256 should be text"),
    (lambda r: r["gains"].update(k_norm=[[1.0, 2.0], [1.0]]), "models.m.gains.k_norm[1] should hold 2 gains"),
    (lambda r: r.update(n_heads=3), "models.m: n_heads 3 should be a multiple of n_kv_heads 2"),
    (lambda r: r["batches"][1].pop("keys"), "models.m.batches[1].keys should map sites to metrics"),
    (lambda r: r["batches"][1].pop("init_keys"), "models.m.batches[1] should hold init_keys, as batch 0 does"),
    (lambda r: r["batches"][0]["keys"].update(k_proj=r["batches"][0]["keys"].pop("k_norm")),
     "models.m.batches[0].init_keys.k_proj should hold pr_sv, pr_var, erank"),
    (lambda r: [b["keys"].update(q=b["keys"].pop("k_norm")) for b in r["batches"]],
     "models.m.batches[0].keys should hold the site k_norm or k_proj"),
]


@pytest.mark.parametrize("damage,words", PRETRAINED_DAMAGE, ids=[w[:30] for _, w in PRETRAINED_DAMAGE])
def test_pretrained_keys_fields_the_report_shows_are_checked(tmp_path, damage, words):
    from research.results.pretrained import SCHEMA, VERSION, load_pretrained_keys
    rec = _pretrained_record()
    damage(rec)
    path = tmp_path / "pretrained_keys.json"
    path.write_text(json.dumps({"schema": SCHEMA, "version": VERSION, "models": {"m": rec}}))
    with pytest.raises(ResultsError) as err:
        load_pretrained_keys(path)
    assert str(err.value).startswith(f"{path}: {words}"), str(err.value)


def test_the_margin_a_pretrained_keys_file_redraws_with_is_checked(tmp_path):
    """split_panels redraws a pretrained-keys folder at the margin its file holds: a margin that is no share of the
    mean is refused, naming the field, before anything is drawn."""
    from research.results.pretrained import SCHEMA, VERSION, load_pretrained_keys
    path = tmp_path / "pretrained_keys.json"
    path.write_text(json.dumps({"schema": SCHEMA, "version": VERSION, "models": {"m": _pretrained_record()},
                                "margin": 5}))
    with pytest.raises(ResultsError, match=r"pretrained_keys.json: margin should be a share between 0 and 1"):
        load_pretrained_keys(path)


def test_pretrained_report_of_a_file_without_the_description(tmp_path):
    from research.analysis.pretrained import analyze_file
    from research.plots import pretrained_report as figures
    from research.results.pretrained import SCHEMA, VERSION, load_pretrained_keys
    path = tmp_path / "pretrained_keys.json"
    path.write_text(json.dumps({"schema": SCHEMA, "version": VERSION, "models": {"m": _pretrained_record()},
                                "wall_s": NaN_TEXT}).replace(f'"{NaN_TEXT}"', "NaN"))
    res = load_pretrained_keys(path)
    assert res["wall_s"] is None
    report = figures.report(analyze_file(res))
    assert "## m" in report and "| m | ? (?) | ? | 2 (early 0, 1; middle 0, 1; final 0, 1) |" in report
    assert "n/a s." in report and "? s | ? |" in report and "Text: 2 batches of ? windows of ? tokens of ?" in report
    assert "Depth: not compared (middle and early, final and middle, final and early are the same layers)." in report


NaN_TEXT = "__nan__"


# ----------------------------------------------------------------------------- combined.json of the QK-norm study

def test_the_qk_norm_combined_file_fits_its_declaration():
    """combined.json is read back by no tool; its declaration says what it holds, and a rendered one fits it."""
    from research.analysis import qk_norm as qk_analysis
    from research.results.study_formats import QK_COMBINED_FORMAT
    from research.results.vocabulary import QK_COMBINED
    from research.studies.kinds import KINDS
    from utils.formats import FormatError, check
    runs = {c: [qk_run(c, s, 40.0 - 5 * i, 3.6) for s in (0, 1, 2)] for i, c in enumerate(("QK", "QK_frozen", "NoQK"))}
    combined = json.loads(json.dumps(KINDS["qk_norm"].combined(qk_analysis.analyze(runs, 0.03, 0.005))[QK_COMBINED]))
    check(QK_COMBINED_FORMAT, combined)
    combined["summary"]["QK"]["final_pr_per_seed"] = "40"
    with pytest.raises(FormatError, match=r"^summary.QK.final_pr_per_seed should be a list of numbers or null"):
        check(QK_COMBINED_FORMAT, combined)


@pytest.mark.parametrize("load, schema, name", [(load_pretrained_keys, PRETRAINED_SCHEMA, "pretrained_keys.json"),
                                                (load_trajectory, TRAJECTORY_SCHEMA, "checkpoint_keys.json")])
def test_every_versioned_file_of_a_newer_version_asks_for_newer_code(tmp_path, load, schema, name):
    """A study's file from a newer version is answered as results.json is: update the code, never 'run again' (which
    would overwrite it); an older one is still told to run again."""
    path = tmp_path / name
    path.write_text(json.dumps({"schema": schema, "version": 7}))
    with pytest.raises(ResultsError) as err:
        load(path)
    assert str(err.value) == (f"{path}: version: written by a newer version of this project (version 7 > 1, the "
                              f"newest this code reads): update the code (git pull) to read it")
    path.write_text(json.dumps({"schema": schema, "version": 0}))
    with pytest.raises(ResultsError, match="version 0, this code reads version 1: run research/"):
        load(path)
