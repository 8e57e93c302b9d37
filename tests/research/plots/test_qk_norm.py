"""research/plots/qk_norm*.py: the data each figure is drawn from, and the facts report.md states."""
from __future__ import annotations

import re

import numpy as np
import pytest

from research.analysis import qk_norm as analysis
from research.plots import qk_norm, qk_norm_report
from research.results.layout import load_study
from tests.helpers import REFERENCE, labelled_lines, md_table
from tests.research.synthetic import qk_run, qk_runs, with_final_probe


def test_figures_draw_each_condition_from_its_results():
    runs = qk_runs((50, 40, 42), (3.60, 3.70, 3.65), seeds=1)
    figs = qk_norm.figures(analysis.analyze(runs))
    assert list(figs) == list(qk_norm.FIGURES)
    # 2: one line per condition, its mean_pr; the verdict is printed on the figure
    lines = labelled_lines(figs["2_key_pr_causal.png"].axes[0])
    for c in ("QK", "QK_frozen", "NoQK"):
        np.testing.assert_allclose(lines[qk_norm.name(c)], runs[c][0]["mean_pr"])
    texts = [t.get_text() for t in figs["2_key_pr_causal.png"].texts]
    assert texts == ["Rule: one seed per condition, described only: no test, no verdict."]  # the verdict: report.md
    # 1: train loss per condition, probes 1.. (step 0 has none)
    loss = labelled_lines(figs["1_loss.png"].axes[0])
    np.testing.assert_allclose(loss[qk_norm.name("QK")][1:], runs["QK"][0]["loss"][1:])
    # 3: final PR per layer = layer_pr at the last probe
    per_layer = labelled_lines(figs["3_per_layer.png"].axes[0])
    np.testing.assert_allclose(per_layer[qk_norm.name("NoQK")], [runs["NoQK"][0]["layer_pr"][str(i)][-1]
                                                                 for i in range(4)])
    # 4: bars are the analysis' layer effects, on log ratios as layer PR is decided: A/B - 1 and B/C - 1 in %, with
    # A - B = +10 and B - C = -2 in every layer
    gain, norm = figs["4_causal_decomposition.png"].axes[0].containers[:2]
    layer = {c: np.array([runs[c][0]["layer_pr"][str(i)][-1] for i in range(4)]) for c in runs}
    assert layer["QK"] - layer["QK_frozen"] == pytest.approx([10.0] * 4)
    assert [b.get_height() for b in gain] == pytest.approx(100 * (layer["QK"] / layer["QK_frozen"] - 1))
    assert [b.get_height() for b in norm] == pytest.approx(100 * (layer["QK_frozen"] / layer["NoQK"] - 1))
    # 5: the learned gain's CV grows, the frozen one stays 0 and says so in the legend
    legend = [t.get_text() for t in figs["5_gamma_cv.png"].legends[0].get_texts()]
    assert any("QK_frozen" in t and "CV = 0 throughout" in t for t in legend)


def test_seed_bands_and_missing_data():
    runs = qk_runs((50, 40, 42), (3.60, 3.70, 3.65))
    figs = qk_norm.figures(analysis.analyze(runs))
    ax = figs["2_key_pr_causal.png"].axes[0]
    assert len(ax.collections) == 3  # one shaded 95% band per condition
    np.testing.assert_allclose(labelled_lines(ax)[qk_norm.name("QK") + ", n=3"],
                               np.mean([r["mean_pr"] for r in runs["QK"]], axis=0))
    (note,) = [t.get_text() for t in figs["2_key_pr_causal.png"].texts]  # two lines: the rule, the outcome words
    assert note.splitlines()[1] == ("At the last probe: QK/QK_frozen different, beyond the margin; QK_frozen/NoQK "
                                    "different, beyond the margin; QK/NoQK different, beyond the margin (report.md: "
                                    "the estimates and the verdict).")
    assert note.splitlines()[0].startswith("Rule: paired by seed") and len(note.splitlines()) == 2
    no_gain = {"QK": [qk_run("QK", 0, 50, 3.6, learned=False)], "NoQK": [qk_run("NoQK", 0, 40, 3.7)]}
    figs = qk_norm.figures(analysis.analyze(no_gain))
    assert "No QK-norm gain" in figs["5_gamma_cv.png"].axes[0].texts[0].get_text()
    (total,) = figs["4_causal_decomposition.png"].axes[0].containers
    a, c = (np.array([no_gain[x][0]["layer_pr"][str(i)][-1] for i in range(4)]) for x in ("QK", "NoQK"))
    assert [b.get_height() for b in total] == pytest.approx(100 * (a / c - 1))  # A/C only


PR_SV = "Final key PR, pr_sv (the write-ups' uncentered PR)"
PR_HEAD = "Final key PR, pr_sv"  # its table's first header cell: each table of a report names its quantity


def _report(runs) -> str:
    return qk_norm_report.report(analysis.analyze(runs))


def _claim_status(report: str, letter: str) -> str:
    line = next(ln for ln in report.splitlines() if ln.startswith(f"- ({letter})"))
    return re.search(r"\*\*(.+?)\*\*", line).group(1)


def _section(report: str, title: str) -> str:
    return report.split(f"### {title}\n\n", 1)[1].split("\n\n", 1)[0]


def test_report_states_finals_decisions_verdicts_and_claims_with_seeds():
    report = _report(qk_runs((50, 40, 42), (3.60, 3.70, 3.65)))
    rows = {r["condition"]: r for r in md_table(report, "condition")}
    qk = rows[qk_norm.name("QK")]
    assert qk["final PR (pr_sv)"].startswith("50.0 \u00b1 ") and qk["n"] == "3"
    assert qk["final PR (pr_var)"] == "n/a"  # these files hold no probe records
    assert rows[qk_norm.name("QK_frozen")]["final train loss"].startswith("3.700 \u00b1 ")
    pr = {r[PR_HEAD]: r for r in md_table(_section(report, PR_SV), PR_HEAD)}
    assert pr["A \u2212 B"]["mean difference"] == "+10.00"
    assert pr["A \u2212 B"]["outcome"] == "different, beyond the margin"
    # key PR is decided on log ratios: A = 49.8, 50, 50.2 and B = 39.8, 40.01, 40.19 over seeds 0, 1, 2; the family
    # is the three pairs and the difference of the steps (k = 4): t(2 dof, 1 - 0.05/8) = 8.860
    x = np.log(np.array([49.8, 50.0, 50.2]) / np.array([39.8, 40.01, 40.19]))
    half = 8.860 * x.std(ddof=1) / np.sqrt(3)
    assert pr["A \u2212 B"]["CI of ratio \u2212 1 (level)"] == (
        f"[{np.expm1(x.mean() - half):+.1%}, {np.expm1(x.mean() + half):+.1%}] (98.8%)") == "[+24.4%, +25.6%] (98.8%)"
    assert pr["A \u2212 B"]["ratio \u2212 1"] == "+25.0%"
    assert pr["A \u2212 B"]["per seed (ratio \u2212 1)"] == "+25.1%, +25.0%, +24.9%"
    assert pr["B \u2212 C"]["ratio \u2212 1"] == "-4.8%" and pr["B \u2212 C"]["n"] == "3"  # 40 / 42 - 1
    assert _section(report, "Final key PR, pr_var (centered)") == "Not recorded in these results."
    assert ("Key PR, pr_sv (the write-ups' measure): **both the gain and the normalization change key PR, in "
            "opposite directions; margin \u00b13.0% of the pair's mean, on log ratios: the gain's effect (A/B) +25.0% "
            "[+24.4%, +25.6%]") in report
    assert "Validation loss: **both the gain and the normalization change the validation loss" in report
    assert "Training loss, for comparison (the claims use the validation loss): both" in report
    assert [_claim_status(report, k) for k in "abcde"] == ["fails", "fails", "fails", "holds", "holds"]
    assert "seeds 0, 1, 2" in report and "the numbers below are descriptive only" not in report
    assert "\u00b13% of the compared values' mean (\u00b10.5% for losses)" in report


def test_report_single_runs_and_missing_conditions():
    runs = {"QK": [qk_run("QK", 0, 50, 3.6, learned=False)], "NoQK": [qk_run("NoQK", 0, 40, 3.7)]}
    report = _report(runs)
    assert [r["condition"] for r in md_table(report, "condition")] == [qk_norm.name("QK"), qk_norm.name("NoQK")]
    assert ("Key PR, pr_sv (the write-ups' measure): **no verdict, one seed per condition (descriptive only): "
            "QK-norm's whole effect (A/C) +25.1% (one seed); without the frozen-gain run (B)") in report  # 49.8/39.8
    assert md_table(_section(report, PR_SV), PR_HEAD)[0]["outcome"] == "descriptive (one seed)"
    assert _claim_status(report, "a") == "not tested"
    assert "preset" not in report.split("## Provenance")[1] and "seed 0" in report


def test_report_of_the_gain_decomposition_and_ablation():
    def run(tag, seed, keys, pre=None):
        means = {"k_norm.pr_sv": keys + 0.1 * seed, "k_norm.pr_var": keys, "k_rope.pr_sv": keys,
                 "k_rope.pr_var": keys}
        if pre is not None:
            means.update({"k_hat.pr_sv": pre + 0.1 * seed + (0.0, 0.02, -0.02)[seed], "k_hat.pr_var": pre,
                          "k_hat_rope.pr_sv": pre, "k_hat_rope.pr_var": pre})
        r = with_final_probe(qk_run(tag, seed, keys, 3.6), means)
        r["config"] = {"model": {"d_model": 128, "n_heads": 2}}
        if pre is not None:
            r["gain_ablation"] = {"step": 7, "precision": "fp32",
                                  "learned": {"val_loss": 3.50 + 0.01 * seed, "mean_pr": keys},
                                  "k_ones": {"val_loss": 3.60 + 0.01 * seed, "mean_pr": pre},
                                  "k_mean": {"val_loss": 3.52 + 0.01 * seed, "mean_pr": keys}}
        return r
    runs = {"QK": [run("QK", s, 40.0, 46.0) for s in range(3)],
            "QK_frozen": [run("QK_frozen", s, 50.0) for s in range(3)]}
    report = _report(runs)
    parts = md_table(report.split("## The gain's arithmetic")[1], "site")
    gain = next(r for r in parts if (r["site"], r["metric"], r["part"]) == ("k_norm", "pr_sv", "gain"))
    assert gain["mean difference"] == "-6.00" and gain["outcome"] == "different, beyond the margin"
    # on log ratios: A's keys 40 + 0.1 s over A's keys before the gain 46 + 0.1 s (+ 0, 0.02, -0.02)
    a = 40.0 + 0.1 * np.arange(3)
    a_hat = 46.0 + 0.1 * np.arange(3) + np.array([0.0, 0.02, -0.02])
    assert gain["%"] == f"{np.expm1(np.log(a / a_hat).mean()):+.1%}" == "-13.0%"
    ablation = report.split("## The gain ablation")[1]
    assert "3.5100 nats" in ablation
    loss_rows = {r["ablation, validation loss"]: r for r in md_table(ablation, "ablation, validation loss")}
    assert loss_rows["k gain \u2192 1"]["difference"] == "+0.1000"
    assert "Isotropic keys of size 64 would read pr_var = 63.50" in report
    figs = qk_norm.figures(analysis.analyze(runs))
    from matplotlib.container import BarContainer
    total, gain, geometry = [c for c in figs["6_gain_vs_geometry.png"].axes[0].containers
                             if isinstance(c, BarContainer)]
    # the bars are ratios minus 1 in %; gain and geometry multiply to A/B at the probe (B's keys 50 + 0.1 s); the
    # total at k_norm is the headline A/B, of the final mean_pr
    b = 50.0 + 0.1 * np.arange(3)
    assert [b_.get_height() for b_ in gain][0] == pytest.approx(100 * np.expm1(np.log(a / a_hat).mean()))
    assert [b_.get_height() for b_ in geometry][0] == pytest.approx(100 * np.expm1(np.log(a_hat / b).mean()))
    assert (1 + gain[0].get_height() / 100) * (1 + geometry[0].get_height() / 100) == pytest.approx(
        np.exp(np.log(a / b).mean()))
    headline = [np.array([r["mean_pr"][-1] for r in runs[c]]) for c in ("QK", "QK_frozen")]
    assert [b_.get_height() for b_ in total][0] == pytest.approx(100 * np.expm1(np.log(headline[0] / headline[1])
                                                                                 .mean()))


def test_report_of_writeup_results():
    _, runs = load_study(REFERENCE)
    report = _report(runs)
    rows = md_table(report, "condition")
    assert [r["final PR (pr_sv)"] for r in rows] == ["65.7", "59.6", "63.3"]
    assert [r["final train loss"] for r in rows] == ["3.618", "3.614", "3.683"]
    assert [r["final val loss"] for r in rows] == ["3.440", "3.439", "3.505"]
    assert "write-up results (no provenance recorded)" in report and "no verdict" in report


def test_report_provenance_names_the_corpus_its_hash_and_where_it_trained():
    runs = qk_runs((50, 40, 42), (3.60, 3.70, 3.65))
    for c, rl in runs.items():
        for r in rl:
            r["data"] = {"corpus": "english-v1", "source_hash": "d05e51db6254" + "0" * 52}
            r["provenance"] = {"git_commit": "abc1234", "train_precision": "bf16" if c == "NoQK" else "fp32",
                               "cpu": "Test CPU 9000"}
    lines = dict(line[2:].split(": ", 1) for line in _report(runs).split("## Provenance")[1].strip().splitlines())
    assert lines["QK"].endswith("git abc1234; data english-v1 (d05e51db6254); trained in fp32 on "
                                              "Test CPU 9000")
    assert lines["NoQK"].endswith("trained in bf16 on Test CPU 9000")
    for r in runs["NoQK"]:  # the host kind: the CPU and its native bf16 path, from older files' fields too
        r["provenance"]["cpu_native_bf16"] = False
    lines = dict(line[2:].split(": ", 1) for line in _report(runs).split("## Provenance")[1].strip().splitlines())
    assert lines["NoQK"].endswith("trained in bf16 on Test CPU 9000 (no native bf16)")


def test_in_short_answers_the_writeups_questions_with_each_pairs_outcome_and_interval():
    a = analysis.analyze(qk_runs((50, 40, 42), (3.60, 3.70, 3.65)))
    lines = qk_norm_report.in_short(a)
    assert len(lines) == 11
    assert lines[0] == ("- **Which drives key rank (final key PR), the gain or the normalization?** Both do, in "
                        "opposite directions.")
    # A/B on log ratios, as the table above: +25.0% [+24.4%, +25.6%], in the key-PR family of four at 98.8% each
    assert lines[2] == ("- key PR, the gain's effect (A/B): **different, beyond the margin** +25.0% [+24.4%, +25.6%] "
                        "(key PR family, k = 4, 98.8% each, 3 seeds)")
    assert lines[-1] == ("- The write-ups' claims at this scale: (a) **fails**; (b) **fails**; (c) **fails**; (d) "
                         "**holds**; (e) **holds** (The write-ups' claims, below).")
    one = analysis.analyze({"QK": [qk_run("QK", 0, 50, 3.6)], "NoQK": [qk_run("NoQK", 0, 40, 3.7)]})
    # seed 0's shared noise is -0.2: key PR 49.8 and 39.8; validation loss final_loss - 0.1 - 0.002
    assert qk_norm_report.in_short(one)[2:] == [
        "- Key PR (pr_sv), final (nothing tested, the values described): QK 49.8; NoQK 39.8",
        "- Validation loss, final (nothing tested, the values described): QK 3.498; NoQK 3.598"]
