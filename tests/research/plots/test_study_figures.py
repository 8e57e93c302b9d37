"""Figures and reports of the pilot, key-dynamics and head-specialization studies: the data each figure
is drawn from and the facts each report states, on hand-built results. No torch anywhere."""
from __future__ import annotations

import numpy as np
import pytest

from research.analysis import heads as heads_analysis
from research.analysis import keys as keys_analysis
from research.analysis import pilot as pilot_analysis
from research.plots import heads, keys, pilot
from research.results.vocabulary import label
from tests.helpers import bullet, labelled_lines, md_table
from tests.research.synthetic import FINAL_LAYER_NORM, GATHERER, SINK, L, make_results, writeups_only

# ----------------------------------------------------------------------------- keys

def test_key_figures_draw_groups_outliers_and_final_norms():
    res = make_results()
    figs = keys.figures(keys_analysis.analyze({"QK": [res]}))
    assert list(figs) == ["key_analysis_report.png", "key_norm_evolution.png"]
    a, b, c, d = figs["key_analysis_report.png"].axes[:4]
    assert set(labelled_lines(a)) >= {"early layers (0, 1)", "middle layers (2, 3)", "final layers (4, 5)"}
    outliers = labelled_lines(b)
    assert set(outliers) == {"layer 0 (first)", "layer 3 (middle)", "layer 5 (last)"}
    np.testing.assert_allclose(outliers["layer 5 (last)"], [3.0 + f * 6 for f in np.linspace(0, 1, 5)])
    assert [p.get_height() for p in d.containers[0]] == pytest.approx(FINAL_LAYER_NORM)
    evolution = labelled_lines(figs["key_norm_evolution.png"].axes[0])
    np.testing.assert_allclose(evolution["final layers (layers 4, 5): group mean"][-1], 7.0)


def test_key_figures_per_condition_and_without_records():
    runs = {"QK": [make_results()], "NoQK": [writeups_only(make_results("NoQK", qk_norm="none"))]}
    figs = keys.figures(keys_analysis.analyze(runs))
    assert sorted(figs) == ["key_analysis_report_NoQK.png", "key_analysis_report_QK.png",
                            "key_norm_evolution_NoQK.png", "key_norm_evolution_QK.png"]
    assert "no per-probe key records" in figs["key_analysis_report_NoQK.png"].axes[0].texts[0].get_text()


def test_key_report_states_where_layers_ended():
    text = keys.report(keys_analysis.analyze({"QK": [make_results()]}))
    assert bullet(text, "Ended above sqrt(d_head)") == "layers 0, 1"
    assert bullet(text, "Ended below sqrt(d_head)") == "layers 4, 5"
    assert bullet(text, "Ended at sqrt(d_head)") == "layers 2, 3"
    # on log ratios the band is 8 x 0.985/1.015 to 8 x 1.015/0.985 (|N - 8| <= 3% of (N + 8)/2)
    assert ("at it within \u00b13% of the mean of the two (the band each condition's section gives), decided per "
            "seed on log ratios, ln(norm / sqrt(d_head)), Bonferroni over the layers (with one seed: descriptive, by "
            "the sign of the log ratio beyond the margin).") in text
    assert "- sqrt(d_head) = 8.00 (d_head = 64, config d_model / n_heads); at it within 7.76 to 8.24; one seed, so " \
        "descriptive\n" in text
    rows = {r["layer (QK)"]: r for r in md_table(text, "layer (QK)")}
    assert (rows["0"]["group"], rows["0"]["final norm"], rows["0"]["vs sqrt(d_head)"]) == ("early", "9.000", "above")
    assert (rows["5"]["change"], rows["5"]["vs sqrt(d_head)"]) == ("-1.000", "below")
    groups = {r["group (QK)"]: r for r in md_table(text, "group (QK)")}
    assert (groups["middle"]["layers"], groups["middle"]["final norm"]) == ("2, 3", "8.000")
    two = keys.report(keys_analysis.analyze({"QK": [make_results(seed=0, norm_drift=-0.01),  # changes 1 -/+ 0.01
                                                    make_results(seed=1, norm_offset=0.01, norm_drift=0.01)]}))
    assert bullet(two, "Runs").startswith("mean over 2 seeds") and "spread over seeds" in two
    changes = {r["comparison"]: r for r in md_table(two.split("## How each layer group")[1], "comparison")}
    assert changes["QK: early layers"]["mean difference"] == "+1.000" and changes["QK: early layers"]["n"] == "2"
    assert changes["QK: early layers"]["ratio \u2212 1"] == "+12.5%"  # decided on log ratios: 8 -> 9
    assert "- The write-ups' claim that early layers' keys shrink and final layers' keys grow: QK **fails**." in two
    assert "No per-probe key records" in keys.report(keys_analysis.analyze({"QK": [writeups_only(make_results())]}))


# ----------------------------------------------------------------------------- heads

def test_head_figures_show_the_chosen_layer_and_the_taxonomy():
    figs = heads.figures(heads_analysis.analyze({"QK": [make_results()]}))
    assert list(figs) == ["norm_divergence.png", "entropy_norm_scatter.png", "effective_rank.png",
                          "gamma_heatmap.png"]
    norms = labelled_lines(figs["norm_divergence.png"].axes[0])
    assert norms["KV head 0 (query head 0)"][-1] == pytest.approx(12.0)  # layer 4, the sink
    assert "layer 4 chosen" in figs["norm_divergence.png"]._suptitle.get_text()
    scatter = figs["entropy_norm_scatter.png"].axes[0]
    legend = [t.get_text() for t in scatter.get_legend().get_texts()]
    assert any("sink mass > 0.3 and entropy < 1.80" in t for t in legend)
    assert "last probe: sink (1)" in legend and "last probe: gatherer (1)" in legend
    erank = labelled_lines(figs["effective_rank.png"].axes[0])
    assert erank["layer 0"][-1] == pytest.approx(54.0)
    gains = figs["gamma_heatmap.png"].axes[0].images[0].get_array()
    assert gains.shape == (64, 5)


def test_head_figures_without_gains_or_records():
    figs = heads.figures(heads_analysis.analyze({"NoQK": [make_results("NoQK", qk_norm="none")]}, layer=2))
    assert "qk_norm = none" in figs["gamma_heatmap.png"].axes[0].texts[0].get_text()
    assert "layer 2 chosen: set by the caller" in figs["norm_divergence.png"]._suptitle.get_text()
    figs = heads.figures(heads_analysis.analyze({"QK": [writeups_only(make_results())]}))
    assert len(figs) == 4 and all("no per-probe head records" in f.axes[0].texts[0].get_text()
                                  for f in figs.values())


def test_head_report_states_sinks_gatherers_and_thresholds():
    text = heads.report(heads_analysis.analyze({"QK": [make_results()]}))
    assert bullet(text, "Sinks (1)") == f"layer {SINK[0]} KV head {SINK[1]}"
    assert bullet(text, "Gatherers (1)") == f"layer {GATHERER[0]} KV head {GATHERER[1]}"
    assert bullet(text, "Thresholds") == ("sink if sink mass > 0.3 and entropy < 1.800; "
                                          "gatherer if sink mass \u2264 0.3 and entropy > 2.200")
    assert "No seed has both a sink and a gatherer: the claim is not tested." not in text  # the one seed has both
    assert "(1 seed with both)" in text and "The claim: **not tested**." in text  # one seed: no test
    assert "margin m = 0.1" in text and bullet(text, "Neither") == f"{2 * L - 2} heads"
    rows = md_table(text, "layer (QK)")
    classes = {(r["layer (QK)"], r["KV head"]): r["class"] for r in rows}
    assert classes[("4", "0")] == "sink" and classes[("1", "1")] == "gatherer"
    assert next(r for r in rows if (r["layer (QK)"], r["KV head"]) == ("4", "0"))["norm"] == "12.000"
    assert "No per-probe head records" in heads.report(heads_analysis.analyze({"QK": [writeups_only(make_results())]}))


# ----------------------------------------------------------------------------- pilot

def pilot_runs():
    return {"qk_norm": [make_results("qk_norm")],
            "no_qk_norm": [make_results("no_qk_norm", qk_norm="none", pr_drop=[0, 0, 1, 2, 5, 10])]}


def test_pilot_figures_draw_both_conditions_and_the_deltas():
    runs = pilot_runs()
    figs = pilot.figures(pilot_analysis.analyze(runs))
    assert list(figs) == list(pilot.FIGURES)
    pr = labelled_lines(figs["panel_b_pr_trajectory.png"].axes[0])
    np.testing.assert_allclose(pr[label("qk_norm")], runs["qk_norm"][0]["mean_pr"])
    deltas = figs["panel_d_delta.png"].axes[0].containers[0]
    # key PR is decided on log ratios, so the bars are the ratio minus 1 in %: 30 against 30 - drop per layer
    assert [p.get_height() for p in deltas] == pytest.approx([100 * (30 / (30 - x) - 1) for x in (0, 0, 1, 2, 5, 10)])
    assert figs["panel_d_delta.png"].axes[0].get_ylabel() == "final key PR, ratio \u2212 1 (%)"
    heat = figs["layer_pr_heatmap_500k.png"]
    assert [ax.get_title() for ax in heat.axes[:2]] == [label("qk_norm"), label("no_qk_norm")]
    np.testing.assert_allclose(heat.axes[1].images[0].get_array()[:, -1], [30, 30, 29, 28, 25, 20])


def test_pilot_report_states_the_differences():
    text = pilot.report(pilot_analysis.analyze(pilot_runs()))
    row = md_table(text, "condition")[0]
    assert (row["seeds"], row["final probe (tokens)"], row["final mean PR"], row["final train loss"],
            row["final val loss"]) == ("1", "1,000,000", "30.00", "6.000", "6.100")
    assert bullet(text, "Final mean PR") == "not decided (one seed, no test): +3.00"  # one seed: no ranking either
    assert "Layers that differ" not in text
    single = pilot.report(pilot_analysis.analyze({"qk_norm": pilot_runs()["qk_norm"]}))
    assert "needs both" in single
