"""Figures and reports of the pilot, key-dynamics and head-specialization studies, on
hand-built results dicts whose answers are known. No torch anywhere."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from research.plots import heads, keys, pilot
from research.results import save_results, validate

ROOT = Path(__file__).resolve().parents[1]
L, D, P = 6, 64, 5
TOKENS = [0, 250_000, 500_000, 750_000, 1_000_000]
FINAL_LAYER_NORM = [9.0, 9.0, 8.0, 8.0, 7.0, 7.0]  # layers 0,1 end above sqrt(64) = 8, 4,5 below, 2,3 at it
SINK, GATHERER = (4, 0), (1, 1)  # (layer, KV head)


def _final_head(layer: int, n_kv: int) -> list[tuple[float, float]]:
    """(norm, entropy) of each KV head at the last probe; the layer mean stays FINAL_LAYER_NORM[layer]."""
    m = FINAL_LAYER_NORM[layer]
    out = [(m, 2.0)] * n_kv
    if n_kv == 2 and layer == SINK[0]:
        out = [(12.0, 0.5), (2 * m - 12.0, 2.0)]       # sink: high norm, low entropy
    if n_kv == 2 and layer == GATHERER[0]:
        out = [(2 * m - 5.0, 2.0), (5.0, 3.0)]         # gatherer: low norm, high entropy
    return out


def make_results(tag="QK", *, n_kv=2, n_q=2, qk_norm="learned", seed=0, norm_offset=0.0, pr_drop=None,
                 with_config=True) -> dict:
    """A results dict like research/results.py writes: 6 layers, D = 64, 5 probes.

    Key norms go linearly from 8 to their final values; entropies from 3.5 to their final values.
    pr_drop[layer] is subtracted from the final layer PR (30 for every layer otherwise).
    """
    group = n_q // n_kv
    pr_drop = pr_drop or [0.0] * L
    res = {"tag": tag, "tokens": list(TOKENS), "loss": [None], "val_loss": [None], "mean_pr": [], "layer_pr": {},
           "gamma_cv": {}, "gamma_final": {}, "schema": "qk-keys/results", "schema_version": 1, "seed": seed,
           "config": {"model": {"n_layers": L, "d_model": D * n_q, "n_heads": n_q, "n_kv_heads": n_kv,
                                "qk_norm": qk_norm}} if with_config else None,
           "steps": list(range(P)), "probes": []}
    for p in range(P):
        f = p / (P - 1)
        if p:
            res["loss"].append(8.0 - 2 * f)
            res["val_loss"].append(8.1 - 2 * f)
        layers = []
        for i in range(L):
            fin = _final_head(i, n_kv)
            norm = [8.0 + f * (n - 8.0) + norm_offset for n, _ in fin]
            ent_kv = [3.5 + f * (e - 3.5) for _, e in fin]
            pr = 50.0 - f * (20.0 + pr_drop[i])
            km = {"norm_mean": norm, "norm_std": [0.1] * n_kv, "max_abs": [3.0 + f * (1 + i)] * n_kv,
                  "mean_max_abs": [2.0] * n_kv, "peak_frac": [0.1 + 0.01 * i * f] * n_kv, "std": [1.0] * n_kv,
                  "cos_mean": [0.02 + f * 0.05 * i] * n_kv, "pr_sv": [pr] * n_kv, "pr_var": [5.0] * n_kv,
                  "erank": [56.0 - f * 2 * (i + 1)] * n_kv, "pr_vec": [20.0] * n_kv}
            # query heads of KV head k: entropies e - 0.5 and e + 0.5 when there are two (mean = e)
            spread = [(-0.5 + j / max(group - 1, 1)) if group > 1 else 0.0 for j in range(group)]
            attn = {"entropy": [e + s for e in ent_kv for s in spread], "sink_mass": [0.1] * n_q,
                    "qk_ratio": [1.0] * n_q}
            gains = (1.0 + f * 0.1 * np.sin(np.arange(D) + i)).tolist()
            gamma = None if qk_norm == "none" else {
                "mean": float(np.mean(gains)), "std": float(np.std(gains)),
                "cv": float(np.std(gains) / abs(np.mean(gains))), "min": min(gains), "max": max(gains),
                "values": gains}
            means = {f"k_norm.{k}": float(np.mean(v)) for k, v in km.items()}
            means.update({f"k_rope.{k}": float(np.mean(v)) for k, v in km.items()})
            means.update({f"attn.{k}": float(np.mean(v)) for k, v in attn.items()})
            layers.append({"layer": i, "k_norm": km, "k_rope": km, "attn": attn, "gamma_k": gamma,
                           "gamma_q": gamma, "means": means})
            res["layer_pr"].setdefault(str(i), []).append(means["k_norm.pr_sv"])
            if gamma:
                res["gamma_cv"].setdefault(str(i), []).append(gamma["cv"])
                res["gamma_final"][str(i)] = gamma["values"]
        res["mean_pr"].append(float(np.mean([r["means"]["k_norm.pr_sv"] for r in layers])))
        res["probes"].append({"step": p, "tokens": TOKENS[p], "layers": layers,
                              "mean_pr": res["mean_pr"][-1], "probe_time_s": 0.1})
    return validate(res)


def writeups_only(res: dict) -> dict:
    """The same run as the write-ups' schema holds it: top-level fields only, no probes."""
    return validate({k: res[k] for k in ("tag", "tokens", "loss", "val_loss", "mean_pr", "layer_pr",
                                         "gamma_cv", "gamma_final")})


def assert_png(path: Path) -> None:
    assert path.is_file() and path.suffix == ".png", path
    assert path.stat().st_size > 5000, f"{path} is suspiciously small"
    img = imread(path)
    assert img.shape[0] > 300 and img.shape[1] > 400
    assert float(img[..., :3].std()) > 0.01, f"{path} is blank"


def test_modules_import_without_torch():
    code = ("import sys; import research.plots.pilot, research.plots.keys, research.plots.heads; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# ----------------------------------------------------------------------------- keys

def test_keys_figures_and_report(tmp_path):
    runs = {"QK": [make_results()]}
    paths = keys.render(tmp_path, runs)
    assert [p.name for p in paths] == ["key_analysis_report.png", "key_norm_evolution.png"]
    for p in paths:
        assert_png(p)
    text = keys.write_report(tmp_path, runs).read_text()
    assert "Ended above sqrt(d_head): layers 0, 1\n" in text
    assert "Ended below sqrt(d_head): layers 4, 5\n" in text
    assert "(within ±1%): layers 2, 3\n" in text
    assert "d_head = 64 (config d_model / n_heads)" in text
    assert "| 0 | early | 8.000 | 9.000 | 1.000 | above |" in text
    assert "| 5 | final | 8.000 | 7.000 | -1.000 | below |" in text
    assert "| middle | 2, 3 | 8.000 | 8.000 |" in text


def test_keys_groups_and_d_head_fallbacks():
    assert keys.layer_groups(6) == {"early": [0, 1], "middle": [2, 3], "final": [4, 5]}
    assert keys.layer_groups(22) == {"early": [0, 1], "middle": [10, 11], "final": [20, 21]}
    assert keys.layer_groups(1) == {"early": [0], "middle": [0], "final": [0]}
    res = make_results(with_config=False)
    d, src = keys.d_head_of(res)
    assert d == 64 and "gain" in src
    d, src = keys.d_head_of(make_results(with_config=False, qk_norm="none"))
    assert d == keys.DEFAULT_D_HEAD and "assumed" in src


def test_keys_mean_over_seeds_and_several_conditions(tmp_path):
    runs = {"QK": [make_results(seed=0, norm_offset=-0.5), make_results(seed=1, norm_offset=0.5)],
            "NoQK": [make_results("NoQK", qk_norm="none")]}
    data = keys.condition_data(runs["QK"])
    np.testing.assert_allclose(data["series"]["norm_mean"][-1], FINAL_LAYER_NORM)
    paths = keys.render(tmp_path, runs)
    assert sorted(p.name for p in paths) == sorted(["key_analysis_report_QK.png", "key_norm_evolution_QK.png",
                                                    "key_analysis_report_NoQK.png", "key_norm_evolution_NoQK.png"])
    text = keys.write_report(tmp_path, runs).read_text()
    assert "mean over 2 seeds" in text and text.count("Ended above sqrt(d_head): layers 0, 1") == 2


def test_keys_without_probe_records(tmp_path):
    runs = {"QK": [writeups_only(make_results())]}
    for p in keys.render(tmp_path, runs):
        assert p.is_file()
    assert "No per-probe key records" in keys.write_report(tmp_path, runs).read_text()


# ----------------------------------------------------------------------------- heads

def test_heads_taxonomy_and_figures(tmp_path):
    runs = {"QK": [make_results()]}
    paths = heads.render(tmp_path, runs)
    assert [p.name for p in paths] == ["norm_divergence.png", "entropy_norm_scatter.png", "effective_rank.png",
                                       "gamma_heatmap.png"]
    for p in paths:
        assert_png(p)
    h = heads.head_arrays(runs["QK"][0])
    assert heads.choose_layer(h)[0] == 4  # KV-head norms 12 vs 2: the widest spread
    cls = heads.classify(h["series"]["norm_mean"][-1], h["series"]["entropy"][-1])
    assert cls["median_norm"] == pytest.approx(8.0) and cls["median_entropy"] == pytest.approx(2.0)
    assert cls["classes"][SINK] == "sink" and cls["classes"][GATHERER] == "gatherer"
    assert (cls["classes"] == "neither").sum() == L * 2 - 2
    text = heads.write_report(tmp_path, runs).read_text()
    assert "- Sinks (1): layer 4 KV head 0\n" in text
    assert "- Gatherers (1): layer 1 KV head 1\n" in text
    assert "norm > 8.800 and entropy < 1.800" in text and "norm < 7.200 and entropy > 2.200" in text
    assert "margin m = 0.1" in text
    assert "| 4 | 0 | 12.000 |" in text and "| sink |" in text and "| gatherer |" in text


def test_heads_chosen_layer_and_no_gains(tmp_path):
    runs = {"NoQK": [make_results("NoQK", qk_norm="none")]}
    paths = heads.render(tmp_path, runs, layer=2)
    assert len(paths) == 4 and all(p.is_file() for p in paths)
    with pytest.raises(ValueError, match="layer 9"):
        heads.render(tmp_path, runs, layer=9)


def test_heads_query_heads_grouped_onto_kv_heads(tmp_path):
    res = make_results(n_kv=1, n_q=2)  # one KV head per layer, two query heads with entropies e -/+ 0.5
    h = heads.head_arrays(res)
    assert h["n_kv"] == 1 and h["group"] == 2
    np.testing.assert_allclose(h["series"]["entropy"][-1, :, 0], 2.0)  # mean of 1.5 and 2.5
    layer, why = heads.choose_layer(h)
    assert "one KV head" in why
    for p in heads.render(tmp_path, {"QK": [res]}):
        assert_png(p)


def test_heads_without_probe_records(tmp_path):
    runs = {"QK": [writeups_only(make_results())]}
    assert len(heads.render(tmp_path, runs)) == 4
    assert "No per-probe head records" in heads.write_report(tmp_path, runs).read_text()


# ----------------------------------------------------------------------------- pilot

def pilot_runs():
    return {"qk_norm": [make_results("qk_norm")],
            "no_qk_norm": [make_results("no_qk_norm", qk_norm="none", pr_drop=[0, 0, 1, 2, 5, 10])]}


def test_pilot_figures_and_report(tmp_path):
    runs = pilot_runs()
    paths = pilot.render(tmp_path, runs)
    assert [p.name for p in paths] == list(pilot.FIGURES)
    for p in paths:
        assert_png(p)
    text = pilot.write_report(tmp_path, runs).read_text()
    assert "| QK-norm, learned gain (`qk_norm`) | 1 | 1,000,000 | 30.00 | 6.000 | 6.100 |" in text
    assert "Layers that differ most (largest |Δ final PR|): layer 5 (+10.00), layer 4 (+5.00), layer 3 (+2.00)" \
        in text
    assert "Final mean PR: +3.00" in text


def test_pilot_combined_round_trip(tmp_path):
    runs = pilot_runs()
    comb = pilot.combined_from_runs(runs)
    assert set(comb) == {"qk_norm", "no_qk_norm"}
    assert comb["qk_norm"]["train_loss"] == runs["qk_norm"][0]["loss"]
    back = pilot.runs_from_combined(comb)
    for cond, (res,) in runs.items():
        (b,) = back[cond]
        for k in ("tokens", "loss", "val_loss", "mean_pr", "layer_pr", "gamma_cv"):
            assert b[k] == res[k], (cond, k)
        assert b["tag"] == cond and b["gamma_final"] == {}
    # through the file, and the figures and report from the combined file alone
    path = pilot.write_combined(tmp_path, runs)
    assert path.name == "combined_results.json" and json.loads(path.read_text())["qk_norm"]["tokens"] == TOKENS
    from_file = pilot.runs_from_combined(path)
    assert pilot.write_report(tmp_path / "a", from_file).read_text() == \
        pilot.write_report(tmp_path / "b", runs).read_text()
    assert len(pilot.render(tmp_path / "a", from_file)) == 5


def test_pilot_seed_mean_and_single_condition(tmp_path):
    a, b = make_results("qk_norm", seed=0), make_results("qk_norm", seed=1, pr_drop=[2.0] * L)
    comb = pilot.combined_from_runs({"qk_norm": [a, b]})
    assert comb["qk_norm"]["n_seeds"] == 2
    assert comb["qk_norm"]["layer_pr"]["0"][-1] == pytest.approx(29.0)  # (30 + 28) / 2
    again = pilot.combined_from_runs(pilot.runs_from_combined(comb))  # a redraw keeps the seed count
    assert again["qk_norm"]["n_seeds"] == 2 and again["qk_norm"]["seeds"] == [0, 1]
    runs = {"qk_norm": [a, b]}
    for p in pilot.render(tmp_path, runs):
        assert_png(p)
    assert "needs both" in pilot.write_report(tmp_path, runs).read_text()


def test_pilot_reads_writeup_files(tmp_path):
    """Files with only the write-ups' fields (as saved and loaded) are enough."""
    for cond, (res,) in pilot_runs().items():
        save_results(tmp_path / f"{cond}.json", writeups_only(res))
    from research.results import load_results
    runs = {c: [load_results(tmp_path / f"{c}.json")] for c in ("qk_norm", "no_qk_norm")}
    assert len(pilot.render(tmp_path / "out", runs)) == 5
