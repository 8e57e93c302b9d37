"""The key cache's quantities of the conditions kind (research.analysis.conditions.KV_QUANTITIES), read from probe
records and kv_cache sections written by hand: decided where the runs hold them or a study names them primary,
the loss changes against --loss_margin as an absolute margin; runs without them decided as before."""
from __future__ import annotations

import math

import pytest

from research.analysis.conditions import KV_QUANTITIES, QUANTITIES, ConditionRuns, analyze, check_primary
from research.analysis.rules import DIFFERENT, NO_DATA, UNRESOLVED
from research.plots.conditions import in_short, report
from research.results import validate
from research.simulations.conditions import TRUTH, synthetic_run

Q = {q.key: q for q in KV_QUANTITIES}
SEEDS = (0, 1, 2)


def kv_run(tag: str, seed: int, loss_4bit: float = 4.02, rank90: float = 12.0) -> dict:
    """A run with TRUTH's values, probe records holding rank90 (after RoPE) and low_freq_share, and a key cache
    section: losses 4.0 unquantized, `loss_4bit` with 4-bit keys, 4.2 with 3-bit; two layers' 4-bit logit errors per
    query head, [0.1, 0.3] and [0.2, 0.2]."""
    run = synthetic_run(tag, seed, dict(TRUTH))
    run["steps"] = [0, 10]
    for probe in run["probes"]:
        probe["layers"][0]["means"].update({"k_rope.rank90": rank90, "k_norm.low_freq_share": 0.25})
    errors = lambda heads: {"logit_error": heads, "attention_kl": [0.0, 0.0], "output_error": [0.0, 0.0]}
    run["kv_cache"] = {
        "step": 10, "sequences": 8, "seq_len": 128, "precision": "fp32", "bits": [8, 4, 3, 2], "ranks": [8, 16, 32],
        "loss": {"scheme": "per_token", "site": "pre_rope",
                 "by_bits": {"16": 4.0, "8": 4.0, "4": loss_4bit, "3": 4.2, "2": 6.0},
                 "change": {"16": 0.0, "8": 0.0, "4": loss_4bit - 4.0, "3": 0.2, "2": 2.0}},
        "usable_k_bits": 4, "loss_margin": 0.005,
        "layers": [{"layer": i, "quantized": {"pre_rope": {"per_token": {"4": errors(heads)}}}, "projected": {}}
                   for i, heads in enumerate(([0.1, 0.3], [0.2, 0.2]))]}
    return validate(run)


def test_each_key_cache_quantity_reads_its_value():
    run = kv_run("QK", 0)
    assert Q["rank90"].final(run) == 12.0 and Q["low_freq_share"].final(run) == 0.25
    assert Q["kv_loss_4bit"].final(run) == pytest.approx(0.02 / 4.0) and Q["kv_loss_3bit"].final(run) == \
        pytest.approx(0.2 / 4.0)
    assert Q["kv_logit_error_4bit"].final(run) == pytest.approx(0.2)
    assert Q["kv_logit_error_4bit"].per_layer(run).tolist() == pytest.approx([0.2, 0.2])
    assert Q["kv_loss_4bit"].per_layer(run).size == 0 and not Q["kv_loss_4bit"].layered
    assert Q["rank90"].per_layer(run).tolist() == [12.0] and Q["rank90"].trajectory(run).tolist() == [12.0, 12.0]
    traj = Q["kv_logit_error_4bit"].trajectory(run)  # measured at the last probe's step only
    assert math.isnan(traj[0]) and traj[1] == pytest.approx(0.2)
    old = synthetic_run("QK", 0, dict(TRUTH))  # a file from before: no values, no error
    assert all(math.isnan(q.final(old)) for q in KV_QUANTITIES)


def test_a_study_names_key_cache_quantities_primary():
    """The 4-bit loss change: 0.005 in every base run, 0.05, 0.06, 0.07 without QK-norm. Two primaries of one
    comparison each: k = 2, intervals at 97.5%, t(2 dof, 0.9875) = 6.2053; differences 0.045, 0.055, 0.065 (sd 0.01):
    0.055 +- 6.2053 x 0.01 / sqrt(3) = 0.055 +- 0.0358, wholly beyond the absolute margin 0.001 (KV_LOSS_MARGIN, 0.1%
    of the loss; no longer --loss_margin), and a study file's kv_loss_margin of 0.03 puts it inside (unresolved)."""
    assert check_primary([q.key for q in KV_QUANTITIES]) == tuple(q.key for q in KV_QUANTITIES)
    runs = {"QK": [kv_run("QK", s, loss_4bit=4.02) for s in SEEDS],
            "NoQK": [kv_run("NoQK", s, loss_4bit=4.0 * (1 + x), rank90=12.0 + s) for s, x in
                     zip(SEEDS, (0.05, 0.06, 0.07))]}
    a = analyze(ConditionRuns(runs, "QK", ("kv_loss_4bit", "rank90")), 0.03, 0.005)
    # the formats' loss changes are not held: these runs' sections measured none (a section before them)
    assert a.quantities == QUANTITIES + KV_QUANTITIES[:5] and a.primary == ("rank90", "kv_loss_4bit")
    d = a.decisions["kv_loss_4bit"][("NoQK", "QK")]
    assert (d.diff, d.margin, d.share, d.ci_level) == (pytest.approx(0.055), 0.001, None, 1 - 0.05 / 2)
    assert d.ci == pytest.approx((0.055 - 0.03583, 0.055 + 0.03583), abs=1e-4) and d.outcome == DIFFERENT
    text = report(a)
    assert "in 14 quantities" in text and "\u00b10.001 for a loss change with quantized keys" in text
    short = in_short(a)[0]
    wide = analyze(ConditionRuns(runs, "QK", ("kv_loss_4bit", "rank90"), kv_loss_margin=0.03), 0.03, 0.005)
    assert (wide.decisions["kv_loss_4bit"][("NoQK", "QK")].outcome, wide.kv_loss_margin) == (UNRESOLVED, 0.03)
    assert "The study's primary quantities (key rank at 90% energy after RoPE (rank90), loss change with 4-bit keys " \
           "(share of the loss)) are read as one family of k = 2" in short


def test_runs_without_them_are_decided_as_before_unless_named_primary():
    runs = {c: [synthetic_run(c, s, dict(TRUTH)) for s in SEEDS] for c in ("QK", "NoQK")}
    plain = analyze(ConditionRuns(runs, "QK"), 0.03, 0.005)
    assert plain.quantities == QUANTITIES and "rank90" not in plain.decisions
    assert "in 9 quantities" in report(plain) and "quantized keys" not in report(plain)
    named = analyze(ConditionRuns(runs, "QK", ("kv_loss_3bit",)), 0.03, 0.005)
    assert [q.key for q in named.quantities] == [*(q.key for q in QUANTITIES), "kv_loss_3bit"]
    assert named.decisions["kv_loss_3bit"][("NoQK", "QK")].outcome == NO_DATA


def test_the_key_cache_formats_loss_changes_are_quantities_where_the_sections_hold_them():
    """A section with formats (research.probing.kv_cache since issue 72): kv_loss_<format> is the loss with every key
    in the format as a share of the unquantized loss, decided against the same absolute kv_loss_margin; where the
    runs hold them they are decided, beside the others."""
    def with_formats(tag, seed, nvfp4):
        run = kv_run(tag, seed)
        run["kv_cache"]["formats"] = {"site": "post_rope", "cases": ["nvfp4", "q8_0"], "bytes": {"nvfp4": 0.5625,
                                                                                                  "q8_0": 1.0625},
                                      "by_format": {"nvfp4": nvfp4, "q8_0": 4.0004},
                                      "change": {"nvfp4": nvfp4 - 4.0, "q8_0": 0.0004}, "usable_k_format": "q8_0"}
        return validate(run)
    run = with_formats("QK", 0, 4.08)
    assert Q["kv_loss_nvfp4"].final(run) == pytest.approx(0.02) and Q["kv_loss_q8_0"].final(run) == \
        pytest.approx(0.0001) and math.isnan(Q["kv_loss_mxfp4"].final(run)) and not Q["kv_loss_nvfp4"].layered
    runs = {"QK": [with_formats("QK", s, 4.08) for s in SEEDS],
            "NoQK": [with_formats("NoQK", s, 4.0 + x) for s, x in zip(SEEDS, (0.01, 0.012, 0.014))]}
    a = analyze(ConditionRuns(runs, "QK"), 0.03, 0.005)
    held = {q.key for q in a.quantities}
    assert {"kv_loss_nvfp4", "kv_loss_q8_0"} <= held and "kv_loss_mxfp4" not in held
    d = a.decisions["kv_loss_nvfp4"][("NoQK", "QK")]
    assert d.diff == pytest.approx(-0.017) and d.margin == 0.001 and d.outcome == DIFFERENT


def test_the_formats_figure_is_drawn_only_where_the_runs_measured_them():
    from research.plots.conditions import KV_FORMATS, figures
    plain = analyze(ConditionRuns({c: [kv_run(c, s) for s in SEEDS] for c in ("QK", "NoQK")}, "QK"), 0.03, 0.005)
    assert KV_FORMATS not in figures(plain)
    run = kv_run("QK", 0)
    run["kv_cache"]["formats"] = {"site": "post_rope", "cases": ["q8_0"], "bytes": {"q8_0": 1.0625},
                                  "by_format": {"q8_0": 4.004}, "change": {"q8_0": 0.004}, "usable_k_format": "q8_0"}
    a = analyze(ConditionRuns({"QK": [validate(run)], "NoQK": [kv_run("NoQK", 0)]}, "QK"), 0.03, 0.005)
    fig = figures(a)[KV_FORMATS]
    (x, y), = fig.axes[0].lines[0].get_xydata()[:1]
    assert y == pytest.approx(0.1)  # 0.004 / 4.0, in % of the loss
