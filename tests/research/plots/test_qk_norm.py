"""research/plots/qk_norm*.py: the data each figure is drawn from, and the facts report.md states."""
from __future__ import annotations

import re

import numpy as np
import pytest

from research.analysis import qk_norm as analysis
from research.plots import qk_norm, qk_norm_report
from research.results.layout import load_study
from tests.helpers import REFERENCE, labelled_lines, md_table
from tests.research.synthetic import qk_run, qk_runs


def test_figures_draw_each_condition_from_its_results():
    runs = qk_runs((50, 40, 42), (3.60, 3.70, 3.65), seeds=1)
    figs = qk_norm.figures(runs, analysis.analyze(runs))
    assert list(figs) == list(qk_norm.FIGURES)
    # 2: one line per condition, its mean_pr; the verdict is printed on the figure
    lines = labelled_lines(figs["2_key_pr_causal.png"].axes[0])
    for c in ("QK", "QK_frozen", "NoQK"):
        np.testing.assert_allclose(lines[qk_norm.name(c)], runs[c][0]["mean_pr"])
    texts = [t.get_text() for t in figs["2_key_pr_causal.png"].texts]
    assert any(t.startswith("Verdict at the last probe: both gain and normalization") for t in texts)
    # 1: train loss per condition, probes 1.. (step 0 has none)
    loss = labelled_lines(figs["1_loss.png"].axes[0])
    np.testing.assert_allclose(loss[qk_norm.name("QK")][1:], runs["QK"][0]["loss"][1:])
    # 3: final PR per layer = layer_pr at the last probe
    per_layer = labelled_lines(figs["3_per_layer.png"].axes[0])
    np.testing.assert_allclose(per_layer[qk_norm.name("NoQK")], [runs["NoQK"][0]["layer_pr"][str(i)][-1]
                                                                 for i in range(4)])
    # 4: bars are the analysis' layer effects: gain A-B = +10, normalization B-C = -2 in every layer
    gain, norm = figs["4_causal_decomposition.png"].axes[0].containers[:2]
    assert [b.get_height() for b in gain] == pytest.approx([10.0] * 4)
    assert [b.get_height() for b in norm] == pytest.approx([-2.0] * 4)
    # 5: the learned gain's CV grows, the frozen one stays 0 and says so in the legend
    legend = [t.get_text() for t in figs["5_gamma_cv.png"].legends[0].get_texts()]
    assert any("QK_frozen" in t and "CV = 0 throughout" in t for t in legend)


def test_seed_bands_and_missing_data():
    runs = qk_runs((50, 40, 42), (3.60, 3.70, 3.65))
    figs = qk_norm.figures(runs, analysis.analyze(runs))
    ax = figs["2_key_pr_causal.png"].axes[0]
    assert len(ax.collections) == 3  # one shaded 95% band per condition
    np.testing.assert_allclose(labelled_lines(ax)[qk_norm.name("QK") + ", n=3"], runs["QK"][1]["mean_pr"])
    no_gain = {"QK": [qk_run("QK", 0, 50, 3.6, learned=False)], "NoQK": [qk_run("NoQK", 0, 40, 3.7)]}
    figs = qk_norm.figures(no_gain, analysis.analyze(no_gain))
    assert "No QK-norm gain" in figs["5_gamma_cv.png"].axes[0].texts[0].get_text()
    (total,) = figs["4_causal_decomposition.png"].axes[0].containers
    assert [b.get_height() for b in total] == pytest.approx([10.0] * 4)  # A-C only


def _report(runs) -> str:
    return qk_norm_report.report(runs, analysis.analyze(runs))


def _claim_status(report: str, letter: str) -> str:
    line = next(ln for ln in report.splitlines() if ln.startswith(f"- ({letter})"))
    return re.search(r"\*\*(.+?)\*\*", line).group(1)


def test_report_states_finals_verdict_and_claims_with_seeds():
    report = _report(qk_runs((50, 40, 42), (3.60, 3.70, 3.65)))
    rows = {r["condition"]: r for r in md_table(report, "condition")}
    qk = rows[qk_norm.name("QK")]
    assert qk["final PR"].startswith("50.0 \u00b1 ") and qk["n"] == "3"
    assert rows[qk_norm.name("QK_frozen")]["final train loss"].startswith("3.700 \u00b1 ")
    pairs = {r["pair"]: r for r in md_table(report, "pair")}
    assert pairs["A \u2212 B"]["\u0394 final PR"].startswith("+10.0 \u00b1 ")
    assert "both gain and normalization" in report.split("## Triangulation verdict")[1].split("\n\n")[1].lower()
    assert [_claim_status(report, k) for k in "abcd"] == ["does not hold", "does not hold", "holds", "holds"]
    assert "seeds 0, 1, 2" in report and "single-run" not in report


def test_report_single_runs_and_missing_conditions():
    runs = {"QK": [qk_run("QK", 0, 50, 3.6, learned=False)], "NoQK": [qk_run("NoQK", 0, 40, 3.7)]}
    report = _report(runs)
    assert [r["condition"] for r in md_table(report, "condition")] == [qk_norm.name("QK"), qk_norm.name("NoQK")]
    assert "single-run observations" in report and "## Pairwise differences" not in report
    assert _claim_status(report, "a") == "cannot be tested" and "cannot be separated" in report
    assert "preset" not in report.split("## Provenance")[1] and "seed 0" in report


@pytest.mark.skipif(not REFERENCE.is_dir(), reason=f"write-ups' reference results not found at {REFERENCE}")
def test_report_of_writeup_results():
    _, runs = load_study(REFERENCE)
    report = _report(runs)
    rows = md_table(report, "condition")
    assert [r["final PR"] for r in rows] == ["65.7", "59.6", "63.3"]
    assert [r["final train loss"] for r in rows] == ["3.618", "3.614", "3.683"]
    assert [r["final val loss"] for r in rows] == ["3.440", "3.439", "3.505"]
    assert "write-up results (no provenance recorded)" in report
