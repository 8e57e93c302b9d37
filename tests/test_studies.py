import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from research.results import load_results
from research.studies import run_study

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO.parent / "shared" / "reference" / "qk_norm_50m_study"
STEP_TOKENS = 8 * 32


def study_args(corpus_file, cache_dir, out, tokens=4 * STEP_TOKENS, *extra):
    return ["--preset", "debug", "--source", "files", "--paths", str(corpus_file), "--cache_dir", str(cache_dir),
            "--precision", "fp32", "--tokens", str(tokens), "--probe-every", "2", "--eval_batches", "2",
            "--no-progress", "--out", str(out), *extra]


def test_qk_norm_study_end_to_end_and_resume(corpus_file, cache_dir, tmp_path, capsys):
    from research.qk_norm_25m_study import STUDY
    out = tmp_path / "study"
    run_study(STUDY, study_args(corpus_file, cache_dir, out))
    assert "preset debug on cpu" in capsys.readouterr().out
    for name in ("1_loss.png", "2_key_pr_causal.png", "3_per_layer.png", "4_causal_decomposition.png",
                 "5_gamma_cv.png", "report.md", "combined.json", "study.json"):
        assert (out / name).is_file(), name
    runs = {c: load_results(out / c / "results.json") for c in ("QK", "QK_frozen", "NoQK")}
    assert [r["tag"] for r in runs.values()] == ["QK", "QK_frozen", "NoQK"]
    assert [r["config"]["model"]["qk_norm"] for r in runs.values()] == ["learned", "frozen", "none"]
    # Same seed and data order: identical initial weights give identical step-0 probes for QK and QK_frozen.
    assert runs["QK"]["mean_pr"][0] == runs["QK_frozen"]["mean_pr"][0]
    assert runs["QK_frozen"]["gamma_cv"]["0"] == [0.0] * 3 and runs["NoQK"]["gamma_cv"] == {}

    # Interrupt: NoQK loses its last checkpoint and results beyond step 2, QK is finished and must be kept.
    qk_before = (out / "QK" / "results.json").read_text()
    shutil.rmtree(out / "NoQK" / "checkpoints" / "step-000004")
    noqk_full = runs["NoQK"]
    run_study(STUDY, study_args(corpus_file, cache_dir, out))
    assert (out / "QK" / "results.json").read_text() == qk_before
    noqk = load_results(out / "NoQK" / "results.json")
    assert noqk["steps"] == noqk_full["steps"] and noqk["loss"] == noqk_full["loss"]


def test_seeds_give_one_folder_per_seed(corpus_file, cache_dir, tmp_path):
    from research.qk_norm_500k_study import STUDY
    out = tmp_path / "pilot"
    run_study(STUDY, study_args(corpus_file, cache_dir, out, 2 * STEP_TOKENS, "--seeds", "0", "1"))
    a = load_results(out / "qk_norm" / "seed_0" / "results.json")
    b = load_results(out / "qk_norm" / "seed_1" / "results.json")
    assert (a["seed"], b["seed"]) == (0, 1) and a["mean_pr"][0] != b["mean_pr"][0]
    combined = json.loads((out / "combined_results.json").read_text())
    assert set(combined) == {"qk_norm", "no_qk_norm"}
    for name in ("panel_a_loss.png", "panel_b_pr_trajectory.png", "panel_c_per_layer.png", "panel_d_delta.png",
                 "layer_pr_heatmap_500k.png", "report.md"):
        assert (out / name).is_file(), name


@pytest.mark.parametrize("module,files", [
    ("research.key_dynamics_study", ["key_analysis_report.png", "key_norm_evolution.png", "report.md"]),
    ("research.head_specialization_study", ["norm_divergence.png", "entropy_norm_scatter.png",
                                            "effective_rank.png", "gamma_heatmap.png", "report.md"]),
])
def test_single_condition_studies(module, files, corpus_file, cache_dir, tmp_path):
    import importlib
    study = importlib.import_module(module).STUDY
    out = tmp_path / study.name
    run_study(study, study_args(corpus_file, cache_dir, out, 6 * STEP_TOKENS, "--n_layers", "6"))
    for name in files:
        assert (out / name).is_file(), name


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="../shared/reference is not beside the clone")
def test_split_panels_on_writeup_results_without_torch(tmp_path):
    src, folder = tmp_path / "ref", tmp_path / "figures"
    shutil.copytree(REFERENCE, src)
    before = sorted(p.name for p in src.rglob("*"))
    script = REPO / "research" / "split_panels.py"
    code = (f"import runpy, sys; sys.argv = ['split_panels.py', {str(src)!r}, '--out', {str(folder)!r}]; "
            f"runpy.run_path({str(script)!r}, run_name='__main__'); "
            "assert 'torch' not in sys.modules, 'split_panels imported torch'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("1_loss.png", "2_key_pr_causal.png", "3_per_layer.png", "4_causal_decomposition.png",
                 "5_gamma_cv.png", "report.md"):
        assert (folder / name).stat().st_size > 1000, name
    assert sorted(p.name for p in src.rglob("*")) == before  # --out leaves the study folder untouched
    report = (folder / "report.md").read_text()
    for value in ("65.7", "59.6", "63.3", "3.618", "3.614", "3.683"):
        assert value in report, value


def test_split_panels_names_the_problem(tmp_path, capsys):
    from research.split_panels import main
    with pytest.raises(SystemExit, match="no study found"):
        main([str(tmp_path)])
    (tmp_path / "QK").mkdir()
    (tmp_path / "QK" / "results.json").write_text("{ not json")
    with pytest.raises(SystemExit, match=r"QK/results.json: not valid JSON"):
        main([str(tmp_path)])
