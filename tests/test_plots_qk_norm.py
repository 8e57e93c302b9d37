"""research/plots/qk_norm.py: figures and report of the QK-norm study, from results dicts alone."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from research.plots import qk_norm
from research.results import load_results, validate

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "qk_norm_50m_study"
ROOT = Path(__file__).resolve().parents[1]


def _table_rows(report: str) -> dict[str, list[str]]:
    """condition tag -> cells of its row in the 'Final values' table."""
    rows = {}
    for line in report.splitlines():
        m = re.match(r"\| .*\((\w+)\) \|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def _claim(report: str, letter: str) -> str:
    line = next(l for l in report.splitlines() if l.startswith(f"- ({letter})"))
    return re.search(r"\*\*(.+?)\*\*", line).group(1)


# ---------------------------------------------------------------------------------------------------------
# The write-ups' own results


@pytest.mark.skipif(not REFERENCE.is_dir(), reason=f"write-ups' reference results not found at {REFERENCE}")
def test_reference_results_render_and_report(tmp_path):
    folder = tmp_path / "qk_norm_50m_study"
    shutil.copytree(REFERENCE, folder)
    for png in folder.glob("*.png"):  # the write-ups' own figures: ours must be written, not found
        png.chmod(0o644)
        png.unlink()
    runs = {c: [load_results(folder / c / "results.json")] for c in qk_norm.CONDITIONS}
    paths = qk_norm.render(folder, runs)
    assert [p.name for p in paths] == list(qk_norm.FIGURES)
    for p in paths:
        assert p.is_file() and p.stat().st_size > 20_000, p
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = qk_norm.write_report(folder, runs).read_text()
    rows = _table_rows(report)
    assert [rows[c][0] for c in qk_norm.CONDITIONS] == ["65.7", "59.6", "63.3"]      # final PR
    assert [rows[c][1] for c in qk_norm.CONDITIONS] == ["3.618", "3.614", "3.683"]   # final train loss
    assert [rows[c][2] for c in qk_norm.CONDITIONS] == ["3.440", "3.439", "3.505"]   # final val loss
    assert "single-run observations" in report
    assert "write-up results (no provenance recorded)" in report
    assert "both gain and normalization" in report      # 65.7 / 59.6 / 63.3: every pair differs by > 3%
    assert _claim(report, "c") == "holds"               # all three fall to ~51-55 and recover
    assert _claim(report, "d") == "does not hold"       # frozen 3.614 < no QK-norm 3.683
    s = qk_norm.summary(runs)
    assert s["QK"]["final_pr"] == pytest.approx(65.70, abs=0.01)
    assert s["NoQK"]["final_loss_per_seed"] == [pytest.approx(3.6832, abs=1e-4)]
    assert s["QK"]["final_pr_ci95"] is None


# ---------------------------------------------------------------------------------------------------------
# Synthetic runs with known answers


def _run(tag, seed, final_pr, final_loss, *, shape="u", layers=4, probes=8, learned=None):
    """A results dict with only the write-ups' fields (+ seed): mean_pr ends exactly at final_pr + seed noise."""
    noise = (seed - 1) * 0.2                      # seeds 0, 1, 2 -> -0.2, 0, +0.2: mean is exact
    t = np.linspace(0, 1, probes)
    if shape == "u":   # 80 -> dip to 0.6 * final at 30% of training -> final
        pr = np.where(t < 0.3, 80 + (0.6 * final_pr - 80) * t / 0.3, 0.6 * final_pr + 0.4 * final_pr * (t - 0.3) / 0.7)
    else:              # monotone fall to final
        pr = 80 + (final_pr - 80) * t
    pr = pr + noise
    loss = [None] + list(final_loss + 2.0 * (1 - t[1:]) + noise / 100)
    val = [None] + list(final_loss - 0.1 + 2.0 * (1 - t[1:]) + noise / 100)
    qk = tag != "NoQK" if learned is None else learned
    res = {"tag": tag, "tokens": [int(x) for x in t * 1_000_000], "loss": loss, "val_loss": val,
           "mean_pr": list(pr), "layer_pr": {str(i): list(pr + (i - layers / 2)) for i in range(layers)},
           "gamma_cv": ({str(i): list((0.0 if tag == "QK_frozen" else 0.1) * t) for i in range(layers)}
                        if qk else {}),
           "seed": seed}
    return validate(res)


def _runs(prs, losses, seeds=3, shape="u"):
    return {c: [_run(c, s, pr, lo, shape=shape) for s in range(seeds)]
            for c, pr, lo in zip(qk_norm.CONDITIONS, prs, losses)}


def test_verdict_gain_drives_rank(tmp_path):
    runs = _runs((50, 40, 40), (3.60, 3.60, 3.60))
    tri = qk_norm.triangulate(runs)
    assert tri["key"] == "gain"
    report = qk_norm.write_report(tmp_path, runs).read_text()
    assert "gain drives rank" in report
    assert _claim(report, "a") == "holds"
    assert "Welch p" in report and "threshold and Welch test" in report


def test_verdict_normalization_and_both():
    assert qk_norm.triangulate(_runs((50, 50, 40), (3.6, 3.6, 3.6)))["key"] == "normalization"
    tri = qk_norm.triangulate(_runs((60, 50, 40), (3.6, 3.6, 3.6)))
    assert tri["key"] == "both" and "all differ" in tri["verdict"]
    assert qk_norm.triangulate(_runs((50, 50, 50), (3.6, 3.6, 3.6)))["key"] == "neither"


def test_equality_rule_needs_small_difference_and_no_significance():
    # 2% apart with seed noise of +-10: below the 3% threshold and not significant -> equal
    noisy = {c: [_run(c, s, pr + (s - 1) * 10, 3.6) for s in range(3)]
             for c, pr in zip(qk_norm.CONDITIONS, (51, 50, 50))}
    assert qk_norm.triangulate(noisy)["pairs"][("QK", "QK_frozen")]["equal"]
    # 2% apart with seed noise of +-0.2: below the threshold but significant -> different (both conditions needed)
    cmp_ = qk_norm.triangulate(_runs((51, 50, 50), (3.6, 3.6, 3.6)))["pairs"][("QK", "QK_frozen")]
    assert cmp_["close"] and cmp_["p"] < 0.05 and not cmp_["equal"]
    # 10% apart with huge noise: not significant but above the threshold -> different, flagged as inconclusive
    noisy = {c: [_run(c, s, pr + (s - 1) * 20, 3.6) for s in range(3)]
             for c, pr in zip(qk_norm.CONDITIONS, (55, 50, 50))}
    cmp_ = qk_norm.triangulate(noisy)["pairs"][("QK", "QK_frozen")]
    assert cmp_["tested"] and cmp_["p"] > 0.05 and not cmp_["close"] and not cmp_["equal"]
    tri = qk_norm.triangulate(noisy)
    assert tri["key"] == "gain" and tri["tentative"] and "not significant" in tri["verdict"]
    assert qk_norm.claims(noisy)["a"]["status"] == "holds (tentative)"
    with_one_seed = {c: [r[0]] for c, r in noisy.items()}
    assert not qk_norm.triangulate(with_one_seed)["pairs"][("QK", "QK_frozen")]["tested"]


def test_report_with_seeds_has_ci_pvalues_and_claims(tmp_path):
    runs = _runs((50, 40, 42), (3.60, 3.70, 3.65))
    report = qk_norm.write_report(tmp_path, runs).read_text()
    rows = _table_rows(report)
    assert rows["QK"][0].startswith("50.0 \u00b1 ") and rows["QK"][3] == "3"
    assert rows["QK_frozen"][1].startswith("3.700 \u00b1 ")
    assert "## Pairwise differences (Welch t-test)" in report
    assert re.search(r"\| A \u2212 B \| \+10\.0 \u00b1 [\d.]+ \| [\d.e-]+ \|", report)
    assert "single-run" not in report
    assert _claim(report, "c") == "holds"           # U-shaped trajectories
    assert "(U-shaped in 3 of 3 seeds)" in report
    assert _claim(report, "d") == "holds"           # frozen 3.70 > none 3.65
    assert _claim(report, "b") == "does not hold"   # PR order A > C > B == loss order A < C < B
    assert "seeds 0, 1, 2" in report


def test_monotone_trajectory_is_not_u_shaped(tmp_path):
    runs = _runs((50, 40, 40), (3.6, 3.6, 3.6), shape="mono")
    report = qk_norm.write_report(tmp_path, runs).read_text()
    assert _claim(report, "c") == "does not hold"
    assert "minimum at the end" in report
    assert qk_norm.u_shape([80, 60, 40, 45, 50])["u"]
    assert not qk_norm.u_shape([80, 60, 40, 40.5])["u"]   # recovers by less than 5% of the minimum


def test_render_with_seeds_and_summary(tmp_path):
    runs = _runs((50, 40, 42), (3.60, 3.70, 3.65))
    paths = qk_norm.render(tmp_path, runs)
    assert all(p.is_file() and p.stat().st_size > 10_000 for p in paths)
    s = qk_norm.summary(runs)
    assert s["QK"]["n"] == 3 and s["QK"]["seeds"] == [0, 1, 2]
    assert s["QK"]["final_pr"] == pytest.approx(50.0)
    assert s["QK"]["final_pr_per_seed"] == pytest.approx([49.8, 50.0, 50.2])
    assert s["QK"]["final_pr_ci95"] == pytest.approx(4.3027 * 0.2 / np.sqrt(3), abs=1e-3)
    assert set(s["QK"]) >= {"final_pr", "final_loss", "final_val_loss"}


def test_missing_conditions_and_no_gain(tmp_path):
    runs = {"QK": [_run("QK", 0, 50, 3.6, learned=False)], "NoQK": [_run("NoQK", 0, 40, 3.7)]}
    paths = qk_norm.render(tmp_path, runs)   # no gamma_cv anywhere: 5_gamma_cv.png still written
    assert all(p.is_file() and p.stat().st_size > 5_000 for p in paths)
    report = qk_norm.write_report(tmp_path, runs).read_text()
    assert "cannot be separated" in report
    assert _claim(report, "a") == "cannot be tested" and _claim(report, "d") == "cannot be tested"
    assert set(_table_rows(report)) == {"QK", "NoQK"}
    assert "preset" not in report.split("## Provenance")[1] and "seed 0" in report


def test_module_does_not_import_torch():
    code = ("import sys, research.plots.qk_norm, research.stats; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
