"""research/analysis/{rules,qk_norm,claims}.py: the equality rule, the verdict, the claims and the tables,
on runs whose answers are known and on the write-ups' own results."""
from __future__ import annotations

import numpy as np
import pytest

from research.analysis import claims, qk_norm, rules
from research.results.layout import load_study
from tests.helpers import REFERENCE
from tests.research.synthetic import qk_run, qk_runs


@pytest.mark.skipif(not REFERENCE.is_dir(), reason=f"write-ups' reference results not found at {REFERENCE}")
def test_writeup_results():
    kind, runs = load_study(REFERENCE)
    assert kind == "qk_norm" and list(runs) == ["QK", "QK_frozen", "NoQK"]
    a = qk_norm.analyze(runs)
    assert [round(a.summary[c]["final_pr"], 1) for c in a.conditions] == [65.7, 59.6, 63.3]
    assert [round(a.summary[c]["final_loss"], 3) for c in a.conditions] == [3.618, 3.614, 3.683]
    assert a.summary["NoQK"]["final_loss_per_seed"] == [pytest.approx(3.6832, abs=1e-4)]
    assert a.summary["QK"]["final_pr_ci95"] is None  # one seed: no interval
    # 65.7 / 59.6 / 63.3: every pair differs by more than 3% of the mean -> "both", not the write-ups' "gain"
    assert a.verdict.key == "both" and not a.verdict.tentative
    assert a.claims["c"].status == "holds"             # all three fall to ~51-55 and recover
    assert a.claims["d"].status == "does not hold"     # frozen 3.614 < no QK-norm 3.683
    assert [e.kind for e in a.layer_effects.effects] == ["gain", "normalization"]
    assert len(a.layer_effects.layers) == 32 and a.layer_effects.one_run_each


def test_verdicts_by_hand():
    assert qk_norm.triangulate(qk_runs((50, 40, 40), (3.6, 3.6, 3.6))).key == "gain"
    assert qk_norm.triangulate(qk_runs((50, 50, 40), (3.6, 3.6, 3.6))).key == "normalization"
    both = qk_norm.triangulate(qk_runs((60, 50, 40), (3.6, 3.6, 3.6)))
    assert both.key == "both" and "all differ" in both.verdict
    assert qk_norm.triangulate(qk_runs((50, 50, 50), (3.6, 3.6, 3.6))).key == "neither"
    tri = qk_norm.triangulate(qk_runs((50, 40, 40), (3.6, 3.6, 3.6)))
    assert tri.rule_applied.startswith("threshold and Welch test") and "Welch p" in tri.rule_short


def test_equality_rule_needs_small_difference_and_no_significance():
    # 2% apart with seed noise of +-10: below the 3% threshold and not significant -> equal
    noisy = {c: [qk_run(c, s, pr + (s - 1) * 10, 3.6) for s in range(3)]
             for c, pr in zip(("QK", "QK_frozen", "NoQK"), (51, 50, 50))}
    assert qk_norm.triangulate(noisy).pairs[("QK", "QK_frozen")].equal
    # 2% apart with seed noise of +-0.2: below the threshold but significant -> different
    c = qk_norm.triangulate(qk_runs((51, 50, 50), (3.6, 3.6, 3.6))).pairs[("QK", "QK_frozen")]
    assert c.close and c.p < 0.05 and not c.equal
    # 10% apart with huge noise: not significant but above the threshold -> different, flagged tentative
    noisy = {c: [qk_run(c, s, pr + (s - 1) * 20, 3.6) for s in range(3)]
             for c, pr in zip(("QK", "QK_frozen", "NoQK"), (55, 50, 50))}
    tri = qk_norm.triangulate(noisy)
    c = tri.pairs[("QK", "QK_frozen")]
    assert c.tested and c.p > 0.05 and not c.close and not c.equal
    assert tri.key == "gain" and tri.tentative and "not significant" in tri.verdict
    assert qk_norm.analyze(noisy).claims["a"].status == "holds (tentative)"
    one_seed = {c: [r[0]] for c, r in noisy.items()}
    assert not qk_norm.triangulate(one_seed).pairs[("QK", "QK_frozen")].tested


def test_compare_by_hand():
    c = rules.compare([10.0, 11.0, 12.0], [10.0, 10.5, 11.0], rel_tol=0.1)
    assert (c.mean_a, c.mean_b, c.diff) == (11.0, 10.5, pytest.approx(0.5))
    assert c.rel == pytest.approx(0.5 / 10.75) and c.close and c.tested
    assert c.p > 0.05 and c.equal


def test_claims_with_seeds():
    a = qk_norm.analyze(qk_runs((50, 40, 42), (3.60, 3.70, 3.65)))
    assert a.claims["c"].status == "holds" and "(U-shaped in 3 of 3 seeds)" in a.claims["c"].text
    assert a.claims["d"].status == "holds"             # frozen 3.70 > none 3.65
    assert a.claims["b"].status == "does not hold"     # PR order A > C > B is the loss order A < C < B
    mono = qk_norm.analyze(qk_runs((50, 40, 40), (3.6, 3.6, 3.6), shape="mono"))
    assert mono.claims["c"].status == "does not hold" and "minimum at the end" in mono.claims["c"].text


def test_u_shape_by_hand():
    assert claims.u_shape([80, 60, 40, 45, 50]).u
    u = claims.u_shape([80, 60, 40, 40.5])           # recovers by less than 5% of the minimum
    assert not u.u and u.reason.startswith("recovers by only 0.50") and u.i_min == 2
    assert claims.u_shape([1, 2]).reason == "fewer than 3 probes"


def test_summary_and_pairwise_with_seeds():
    a = qk_norm.analyze(qk_runs((50, 40, 42), (3.60, 3.70, 3.65)))
    s = a.summary["QK"]
    assert s["n"] == 3 and s["seeds"] == [0, 1, 2] and s["final_pr"] == pytest.approx(50.0)
    assert s["final_pr_per_seed"] == pytest.approx([49.8, 50.0, 50.2])
    assert s["final_pr_ci95"] == pytest.approx(4.3027 * 0.2 / np.sqrt(3), abs=1e-3)
    ab = next(d for d in a.pairwise if (d.a, d.b, d.field) == ("QK", "QK_frozen", "mean_pr"))
    assert ab.diff == pytest.approx(10.0) and ab.p < 1e-4
    assert len(a.pairwise) == 3 * 3  # three pairs x three quantities


def test_layer_effects_per_layer():
    runs = qk_runs((50, 40, 42), (3.6, 3.6, 3.6), seeds=1)
    e = qk_norm.layer_effects(runs)
    assert e.layers == ["0", "1", "2", "3"] and e.one_run_each
    gain, norm = e.effects
    assert gain.mean == pytest.approx([10.0] * 4) and norm.mean == pytest.approx([-2.0] * 4)
    assert np.isnan(gain.ci95).all()                     # one run per condition: no interval
    only_ac = qk_norm.layer_effects({c: runs[c] for c in ("QK", "NoQK")})
    assert [x.kind for x in only_ac.effects] == ["total"] and only_ac.effects[0].mean == pytest.approx([8.0] * 4)


def test_missing_conditions():
    runs = {"QK": [qk_run("QK", 0, 50, 3.6, learned=False)], "NoQK": [qk_run("NoQK", 0, 40, 3.7)]}
    a = qk_norm.analyze(runs)
    assert a.conditions == ["QK", "NoQK"] and a.verdict.key == "qknorm"
    assert "cannot be separated" in a.verdict.verdict
    assert a.claims["a"].status == "cannot be tested" and a.claims["d"].status == "cannot be tested"
