"""research/results: the schema, reading, null <-> NaN, the study layout, and the torch-free boundary."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from research.results import ResultsError, add_probe, load_results, new_results, save_results, truncate
from research.results.layout import condition_dir, condition_results, load_study, read_study_index, write_study_index
from research.results.read import d_head_of, last, layer_keys, seed_of
from research.results.values import as_array, json_safe, present
from tests.helpers import REFERENCE, REPO
from tests.research.synthetic import make_results, writeups_only


def test_load_errors_name_file_and_problem(tmp_path):
    bad = tmp_path / "results.json"
    bad.write_text('{"tag": "QK", "tokens": [0, 1')
    with pytest.raises(ResultsError, match=r"results.json: not valid JSON .*cut off"):
        load_results(bad)
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ResultsError, match="missing field.*tag"):
        load_results(bad)
    bad.write_text(json.dumps({"tag": "QK", "tokens": [0, 1], "loss": [None], "val_loss": [None, 1.0],
                               "mean_pr": [1.0, 2.0], "layer_pr": {}}))
    with pytest.raises(ResultsError, match=r"loss should have 2 values \(one per probe"):
        load_results(bad)
    with pytest.raises(ResultsError, match="no such results file"):
        load_results(tmp_path / "missing.json")


def test_writeup_results_load():
    qk = load_results(REFERENCE / "QK" / "results.json")
    assert qk["mean_pr"][-1] == pytest.approx(65.6977965310216) and len(qk["gamma_final"]) == 32
    noqk = load_results(REFERENCE / "NoQK" / "results.json")
    assert noqk["gamma_cv"] == {} and noqk["gamma_final"] == {} and noqk["probes"] == []
    assert d_head_of(qk) == (128, "length of gamma_final (no model config in the file)")
    assert d_head_of(noqk) == (None, "not recorded in the file") and seed_of(noqk) is None


def _record(pr: float, gain: list[float] | None) -> dict:
    gamma = None if gain is None else {"cv": float(np.std(gain) / np.mean(gain)), "values": gain}
    return {"mean_pr": pr, "probe_time_s": 0.1,
            "layers": [{"layer": 0, "means": {"k_norm.pr_sv": pr}, "gamma_k": gamma}]}


def test_add_probe_truncate_and_save_round_trip(tmp_path):
    res = new_results("QK", seed=3)
    for step, (pr, gain) in enumerate([(40.0, [1.0, 1.0]), (30.0, [0.5, 1.5]), (20.0, [0.0, 2.0])]):
        add_probe(res, _record(pr, gain), step=step, tokens=100 * step, loss=None if step == 0 else 5.0 - step,
                  val_loss=math.nan if step == 0 else 5.5 - step, wall_time_s=float(step), qk_norm="learned")
    assert res["mean_pr"] == res["layer_pr"]["0"] == [40.0, 30.0, 20.0]
    assert res["gamma_cv"]["0"] == pytest.approx([0.0, 0.5, 1.0]) and res["gamma_final"]["0"] == [0.0, 2.0]
    cut = truncate(res, 1)
    assert cut["steps"] == [0, 1] and cut["layer_pr"]["0"] == [40.0, 30.0] and cut["gamma_final"]["0"] == [0.5, 1.5]
    save_results(tmp_path / "r.json", res)
    back = load_results(tmp_path / "r.json")
    assert back["val_loss"] == [None, 4.5, 3.5] and back["loss"] == [None, 4.0, 3.0]  # NaN written as null
    assert seed_of(back) == 3 and last(back, "mean_pr") == 20.0 and math.isnan(last(back, "no_such_field"))


def test_null_and_nan_conversions():
    np.testing.assert_array_equal(as_array([1, None, 2.5]), [1.0, np.nan, 2.5])
    assert as_array(None).size == 0
    np.testing.assert_array_equal(present([None, 1.0, math.nan, math.inf]), [1.0, math.inf])
    assert json_safe({"a": [1.0, math.nan, (math.inf, 2)], "b": "x"}) == {"a": [1.0, None, [None, 2]], "b": "x"}


def test_d_head_and_layers_read_from_what_the_file_has():
    assert d_head_of(make_results()) == (64, "config d_model / n_heads")
    assert d_head_of(make_results(with_config=False))[0] == 64  # from the gains in the probe records
    assert d_head_of(writeups_only(make_results(with_config=False)))[0] == 64  # from gamma_final
    assert layer_keys([{"layer_pr": {"10": [], "2": []}}, {"layer_pr": {"1": []}}]) == ["1", "2", "10"]


def test_study_layout_and_recognition(tmp_path):
    one = condition_dir(tmp_path, "QK", 0, several_seeds=False)
    assert one == tmp_path / "QK" and condition_dir(tmp_path, "QK", 2, True) == tmp_path / "QK" / "seed_2"
    for seed in (10, 2):
        save_results(condition_dir(tmp_path, "NoQK", seed, True) / "results.json",
                     make_results("NoQK", qk_norm="none", seed=seed))
    assert [p.parent.name for p in condition_results(tmp_path, "NoQK")] == ["seed_2", "seed_10"]
    kind, runs = load_study(tmp_path)  # condition folders: the three-condition study
    assert kind == "qk_norm" and [r["seed"] for r in runs["NoQK"]] == [2, 10]
    write_study_index(tmp_path, name="x", kind="keys", seeds=[2], preset="debug",
                      conditions={"NoQK": ["NoQK/seed_2/results.json"]}, margin=0.05, loss_margin=0.01)
    kind, runs = load_study(tmp_path)
    assert kind == "keys" and [r["seed"] for r in runs["NoQK"]] == [2]
    assert (read_study_index(tmp_path)["margin"], read_study_index(tmp_path)["loss_margin"]) == (0.05, 0.01)
    (tmp_path / "study.json").write_text("{")
    with pytest.raises(ResultsError, match="corrupted study index"):
        load_study(tmp_path)
    with pytest.raises(ResultsError, match="no study found"):
        load_study(tmp_path / "NoQK")
    with pytest.raises(ResultsError, match="no such folder"):
        load_study(tmp_path / "missing")


def test_results_analysis_and_plots_never_import_torch_or_training():
    """The torch-free boundary: reading, deciding and drawing import none of torch, models, training,
    data or probing, so figures can be redrawn anywhere."""
    code = ("import sys; import research.results.layout, research.results.read, research.analysis.qk_norm, "
            "research.analysis.pilot, research.analysis.keys, research.analysis.heads, research.plots.qk_norm, "
            "research.plots.qk_norm_report, research.plots.pilot, research.plots.keys, research.plots.heads, "
            "research.plots.inspection, research.studies.render, research.studies.catalog; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'models', 'training', 'data') "
            "or m.startswith('research.probing')); assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _set(res: dict, path: str, value) -> None:
    """res[...][...] = value along a dotted path ('probes.2.layers.0.layer'): list indices, dict keys."""
    *parents, last = path.split(".")
    node = res
    for k in parents:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[int(last) if isinstance(node, list) else last] = value


WRONG_TYPES = [  # (what is damaged, the message's words)
    ("loss.1", "3.2", "loss[1] should be a number or null, found '3.2'"),
    ("tokens.0", None, "tokens[0] should be a number, found None"),
    ("mean_pr.0", True, "mean_pr[0] should be a number or null, found True"),
    ("layer_pr", [1, 2], "layer_pr should be an object, found list"),
    ("layer_pr.0", [1.0, 2.0], "layer_pr['0'] should have 5 values (one per probe"),
    ("gamma_final.1", [1.0, "x"], "gamma_final['1'][1] should be a number or null, found 'x'"),
    ("probes.2.layers.0.layer", 9, "probes[2].layers[0].layer should be a layer index in [0, 6), found 9"),
    ("probes.1.layers.3.k_norm.norm_mean", [1.0], "probes[1].layers[3].k_norm.norm_mean should have 2 values"),
    ("probes.4.layers.0.gamma_k.values", "1,2", "probes[4].layers[0].gamma_k.values should be a list of numbers"),
]


@pytest.mark.parametrize("where,value,words", WRONG_TYPES, ids=[w[0] for w in WRONG_TYPES])
def test_wrong_types_and_lengths_are_named(where, value, words, tmp_path):
    res = json.loads(json.dumps(make_results()))
    _set(res, where, value)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    with pytest.raises(ResultsError) as err:
        load_results(path)
    assert str(err.value).startswith(f"{path}: {words}") and "restore it from a copy" in str(err.value)


def test_gain_ablations_are_checked_and_older_names_read_as_the_k_gain(tmp_path):
    res = json.loads(json.dumps(make_results()))
    entry = {"val_loss": 3.5, "mean_pr": 20.0}
    res["gain_ablation"] = {"step": 4, "precision": "fp32", "learned": entry, "ones": {**entry, "val_loss": 3.6},
                            "mean": {**entry, "val_loss": 3.55}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(res))
    got = load_results(path)["gain_ablation"]  # written before q gains were ablated: k only, as it was
    assert got["k_ones"]["val_loss"] == 3.6 and got["k_mean"]["val_loss"] == 3.55 and "ones" not in got
    for damaged, words in (({"learned": entry}, "gain_ablation should hold 'learned' and at least one of k_ones"),
                           ({"learned": entry, "q_ones": {"val_loss": "x"}},
                            "gain_ablation.q_ones.val_loss should be a number or null, found 'x'")):
        path.write_text(json.dumps({**res, "gain_ablation": damaged}))
        with pytest.raises(ResultsError, match=words):
            load_results(path)
