"""research/analysis/{keys,heads,pilot}.py on hand-built results whose answers are known."""
from __future__ import annotations

import numpy as np
import pytest

from research.analysis import heads, keys, pilot
from research.analysis.rules import DESCRIPTIVE, DIFFERENT, EQUAL
from research.results.layout import runs_from_combined
from research.results import validate
from tests.research.synthetic import (FINAL_LAYER_NORM, GATHERER, SINK, TOKENS, L, drop_probes, make_results,
                                      writeups_only)

# ----------------------------------------------------------------------------- keys

def test_key_dynamics_where_layers_end():
    k = keys.analyze({"QK": [make_results()]}).conditions["QK"]
    assert [k.ended_where(i) for i in range(L)] == ["above", "above", "at", "at", "below", "below"]
    assert k.ended[0].outcome == DESCRIPTIVE  # one seed: by the sign beyond the margin, no test
    assert (k.d_head, k.d_source) == (64, "config d_model / n_heads")
    np.testing.assert_allclose(k.series["norm_mean"][0], [8.0] * L)
    np.testing.assert_allclose(k.series["norm_mean"][-1], FINAL_LAYER_NORM)
    assert k.seeds == "seed 0" and k.final_norm_std is None and list(k.tokens) == TOKENS


def test_key_dynamics_decided_over_seeds():
    runs = {"QK": [make_results(seed=s, norm_drift=0.01 * (s - 1)) for s in range(3)]}  # changes 1 -/+ 0.01
    a = keys.analyze(runs)
    k = a.conditions["QK"]
    assert [k.ended_where(i) for i in range(L)] == ["above", "above", "at", "at", "below", "below"]
    assert k.ended[0].outcome == DIFFERENT and k.ended[2].outcome == EQUAL
    np.testing.assert_allclose(k.final_norm_std, np.std([-0.01, 0, 0.01]))
    early, final = a.group_changes[("QK", "early")], a.group_changes[("QK", "final")]
    assert early.diff == pytest.approx(1.0) and final.diff == pytest.approx(-1.0) and early.outcome == DIFFERENT
    assert a.early_shrink_late_grow("QK") == "fails"  # here the early layers grow and the final ones shrink
    assert a.weight_decay == {}


def uneven_seeds() -> list[dict]:
    """Two seeds probed on different grids that end together: seed 0 lacks the probe at 250,000 tokens, seed 1
    (key norms 1.0 higher) the one at 500,000; both have 0, 750,000 and 1,000,000."""
    return [drop_probes(make_results(seed=0), 1), drop_probes(make_results(seed=1, norm_offset=1.0), 2)]


def test_key_dynamics_average_seeds_at_the_same_token_count():
    """Layer 0's key norm goes 8 -> 9 linearly over 1M tokens (8.25 per 250k): seed 0 reads 8, 8.5, 8.75, 9 at
    0, 500k, 750k, 1M; seed 1 (+1) 9, 9.25, 9.75, 10 at 0, 250k, 750k, 1M. At the shared 0, 750k and 1M the mean
    is 8.5, 9.25, 9.5. By position the second point would have read (8.5 + 9.25) / 2 = 8.875 "at 500,000"."""
    k = keys.condition_dynamics(uneven_seeds())
    assert list(k.tokens) == [0, 750_000, 1_000_000]
    np.testing.assert_allclose(k.series["norm_mean"][:, 0], [8.5, 9.25, 9.5])
    assert k.series["max_abs"].shape == (3, L)


def test_weight_decay_part_of_the_norm_change():
    """With weight decay on the gains the final layers end 1.0 lower (7 instead of 8 + ...): its part."""
    with_wd = [make_results(seed=s, norm_offset=0.01 * s) for s in range(3)]
    without = [make_results("QK_no_gain_wd", seed=s, norm_offset=0.01 * s, norm_drift=(0.0, 0.01, -0.01)[s])
               for s in range(3)]  # each seed's own part of the change, 0 in the mean
    for r in without:  # the same runs, but the final layers' keys keep norm 8
        for probe, f in zip(r["probes"], np.linspace(0, 1, len(r["probes"]))):
            for rec in probe["layers"][4:]:
                rec["means"]["k_norm.norm_mean"] += f * 1.0
    for r, wd in ((with_wd[0], True), (without[0], False)):
        r["config"]["train"] = {"adamw_lr": 0.006, "adamw_weight_decay": 0.2, "wd_on_gains": wd}
    a = keys.analyze({"QK": with_wd, "QK_no_gain_wd": without})
    assert a.weight_decay["final"].diff == pytest.approx(-1.0) and a.weight_decay["final"].outcome == DIFFERENT
    assert a.weight_decay["early"].outcome == EQUAL
    assert a.shrink["QK"] == pytest.approx((1 - 0.006 * 0.2) ** 4) and a.shrink["QK_no_gain_wd"] == 1.0


def test_key_dynamics_groups_and_d_head_fallbacks():
    assert keys.layer_groups(6) == {"early": [0, 1], "middle": [2, 3], "final": [4, 5]}
    assert keys.layer_groups(22) == {"early": [0, 1], "middle": [10, 11], "final": [20, 21]}
    assert keys.layer_groups(1) == {"early": [0], "middle": [0], "final": [0]}
    k = keys.condition_dynamics([make_results(with_config=False)])
    assert k.d_head == 64 and "gain" in k.d_source
    k = keys.condition_dynamics([make_results(with_config=False, qk_norm="none")])
    assert k.d_head == keys.DEFAULT_D_HEAD and "assumed" in k.d_source
    assert keys.analyze({"QK": [writeups_only(make_results())]}).conditions == {"QK": None}


# ----------------------------------------------------------------------------- heads

def test_head_taxonomy_by_attention_and_layer_choice():
    c = heads.analyze({"QK": [make_results()]}).conditions["QK"]
    run = c.runs[0]
    assert run.divergence.layer == 4 and run.shown == run.divergence  # KV-head norms 12 vs 2: the widest spread
    t = run.taxonomy
    assert t.median_entropy == pytest.approx(2.0) and (t.sink_entropy, t.gatherer_entropy) == pytest.approx((1.8, 2.2))
    assert t.heads("sink") == [SINK] and t.heads("gatherer") == [GATHERER]
    assert (t.classes == "neither").sum() == L * 2 - 2
    assert c.norm_gap.diff == pytest.approx(12.0 - 5.0) and c.norm_gap.outcome == DESCRIPTIVE
    assert c.norm_gap_claim == "not tested"


def test_a_low_entropy_head_without_sink_mass_is_no_sink():
    # two focused heads (entropy 0.5), only the second on the first token; two diffuse ones
    t = heads.classify([[0.1, 0.5, 0.05, 0.05]], [[0.5, 0.5, 3.0, 3.0]])
    assert t.median_entropy == 1.75 and t.classes.tolist() == [["neither", "sink", "gatherer", "gatherer"]]


def test_sinks_have_higher_norms_across_seeds():
    c = heads.analyze({"QK": [make_results(seed=s, norm_offset=0.01 * s, sink_drift=0.01 * s) for s in range(3)]}
                      ).conditions["QK"]
    assert c.norm_gap.outcome == DIFFERENT and c.norm_gap_claim == "holds"


def test_heads_fixed_layer_grouping_and_no_records():
    c = heads.analyze({"NoQK": [make_results("NoQK", qk_norm="none")]}, layer=2).conditions["NoQK"]
    assert c.runs[0].shown.layer == 2 and c.runs[0].shown.why == "set by the caller"
    assert c.runs[0].divergence.layer == 4
    with pytest.raises(ValueError, match="layer 9"):
        heads.analyze({"QK": [make_results()]}, layer=9)
    h = heads.head_series(make_results(n_kv=1, n_q=2))  # one KV head, two query heads with entropies e -/+ 0.5
    assert h.n_kv == 1 and h.group == 2
    np.testing.assert_allclose(h.series["entropy"][-1, :, 0], 2.0)
    assert "one KV head" in heads.choose_layer(h).why
    assert heads.analyze({"QK": [writeups_only(make_results())]}).conditions == {"QK": None}


def test_heads_erank_is_the_seed_mean():
    a, b = make_results(seed=0), make_results(seed=1)
    c = heads.analyze({"QK": [a, b]}).conditions["QK"]
    assert c.n_seeds == 2 and c.erank_seeds == "mean over 2 seeds" and len(c.runs) == 2
    np.testing.assert_allclose(c.erank[-1], [56.0 - 2 * (i + 1) for i in range(L)])


def test_heads_erank_is_averaged_at_the_same_token_count():
    """Layer 0's effective rank goes 56 -> 54 (0.5 per 250k); seed 1's is raised by 2. Seed 0 reads 56, 55, 54.5,
    54 at 0, 500k, 750k, 1M; seed 1 58, 57.5, 56.5, 56 at 0, 250k, 750k, 1M: at the shared 0, 750k, 1M the mean is
    57, 55.5, 55 (by position the second point would have read (55 + 57.5) / 2 = 56.25 "at 500,000")."""
    runs = uneven_seeds()
    for probe in runs[1]["probes"]:
        for rec in probe["layers"]:
            rec["means"]["k_norm.erank"] += 2.0
    c = heads.analyze({"QK": runs}).conditions["QK"]
    assert list(c.erank_tokens) == [0, 750_000, 1_000_000]
    np.testing.assert_allclose(c.erank[:, 0], [57.0, 55.5, 55.0])


# ----------------------------------------------------------------------------- pilot

def pilot_runs():
    return {"qk_norm": [make_results("qk_norm")],
            "no_qk_norm": [make_results("no_qk_norm", qk_norm="none", pr_drop=[0, 0, 1, 2, 5, 10])]}


def test_pilot_differences_by_layer():
    a = pilot.analyze(pilot_runs())
    assert (a.a, a.b) == ("qk_norm", "no_qk_norm")
    assert a.delta == pytest.approx({0: 0, 1: 0, 2: 1, 3: 2, 4: 5, 5: 10})
    assert a.ranked[:3] == [5, 4, 3]
    assert a.conditions["qk_norm"].final_pr == pytest.approx(30.0)
    assert a.conditions["no_qk_norm"].final_pr == pytest.approx(27.0)
    assert (a.conditions["qk_norm"].final_loss, a.conditions["qk_norm"].final_val) == (6.0, pytest.approx(6.1))
    assert pilot.pair(["QK", "NoQK"]) == ("QK", "NoQK") and pilot.pair(["x", "y"]) == ("x", "y")
    assert pilot.analyze({"qk_norm": pilot_runs()["qk_norm"]}).b is None


def test_pilot_combined_round_trip_and_seed_mean():
    runs = pilot_runs()
    comb = pilot.combined_from_runs(runs)
    assert set(comb) == {"qk_norm", "no_qk_norm"}
    assert comb["qk_norm"]["train_loss"] == runs["qk_norm"][0]["loss"]
    back = runs_from_combined(comb)
    for cond, (res,) in runs.items():
        (b,) = back[cond]
        for k in ("tokens", "loss", "val_loss", "mean_pr", "layer_pr", "gamma_cv"):
            assert b[k] == res[k], (cond, k)
        assert b["tag"] == cond and b["gamma_final"] == {}
    a, b = make_results("qk_norm", seed=0), make_results("qk_norm", seed=1, pr_drop=[2.0] * L)
    comb = pilot.combined_from_runs({"qk_norm": [a, b]})
    assert comb["qk_norm"]["n_seeds"] == 2
    assert comb["qk_norm"]["layer_pr"]["0"][-1] == pytest.approx(29.0)  # (30 + 28) / 2
    again = pilot.combined_from_runs(runs_from_combined(comb))  # a redraw keeps the seed count
    assert again["qk_norm"]["n_seeds"] == 2 and again["qk_norm"]["seeds"] == [0, 1]


def writeups_run(seed: int, tokens: list[int], pr: list[float]) -> dict:
    return validate({"tag": "qk_norm", "seed": seed, "tokens": tokens, "loss": [4.0] * 3, "val_loss": [4.1] * 3,
                     "mean_pr": pr, "layer_pr": {"0": pr}})


def test_pilot_combined_curve_averages_seeds_at_the_same_token_count():
    """Seed 0 probed at 100k, 200k, 500k tokens with PR 80, 60, 50; seed 1 at 100k, 300k, 500k with 70, 58, 40.
    The combined curve is (80 + 70) / 2 = 75 at 100k and (50 + 40) / 2 = 45 at 500k, and nothing else: by
    position it read (60 + 58) / 2 = 59 "at 200,000 tokens", a mean of 200k and 300k."""
    runs = {"qk_norm": [writeups_run(0, [100_000, 200_000, 500_000], [80.0, 60.0, 50.0]),
                        writeups_run(1, [100_000, 300_000, 500_000], [70.0, 58.0, 40.0])]}
    e = pilot.combined_from_runs(runs)["qk_norm"]
    assert e["tokens"] == [100_000, 500_000]
    assert e["mean_pr"] == [75.0, 45.0] and e["layer_pr"] == {"0": [75.0, 45.0]}
    assert e["train_loss"] == [4.0, 4.0] and e["gamma_cv"] == {}
    assert pilot.analyze(runs).conditions["qk_norm"].final_pr == 45.0
