"""Numbers derived from comparisons (docs/decisions.md): a share, a ranking or a count is printed only when the
comparison under it is decided; otherwise the report says "not decided" and shows the interval. Each kind gets a
seed set where the comparison is open (the derived sentence must be absent) and one where it is settled (present).
No torch."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from research.analysis import heads as heads_analysis
from research.analysis import keys as keys_analysis
from research.analysis import pilot as pilot_analysis
from research.analysis import qk_norm
from research.analysis.wording import OPEN
from research.plots import heads, keys, pilot, qk_norm_report
from tests.helpers import bullet, md_table
from tests.research.synthetic import SINK, L, make_results, qk_runs


def t_interval(d, k: int = 1) -> tuple[float, float]:
    """The Bonferroni t interval of mean(d) for a family of k, computed apart from research.analysis."""
    d = np.asarray(d, float)
    half = stats.t.ppf(1 - 0.05 / k / 2, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size)
    return d.mean() - half, d.mean() + half


def ratio_interval(a, b, k: int = 1) -> tuple[float, float, float]:
    """A positive ratio quantity's comparison as the reports print it (docs/decisions.md#ratio-quantities): the ratio
    minus 1, exp(mean ln(a/b)) - 1, and the t interval of the log ratios mapped back, computed apart from
    research.analysis."""
    x = np.log(np.asarray(a, float) / np.asarray(b, float))
    return (float(np.expm1(x.mean())), *np.expm1(t_interval(x, k)))


# ----------------------------------------------------------------------------- pilot

def pilot_seeds(drops: list[list[float]], val_missing: bool = False) -> dict:
    """Seeds 0.. of both conditions; no QK-norm's final layer PR is lower by drops[seed][layer], so per seed
    QK-norm minus no QK-norm is exactly drops[seed] in every layer. val_missing: no QK-norm's last probe holds
    no validation loss (an earlier probe does)."""
    runs = {"qk_norm": [], "no_qk_norm": []}
    for s, drop in enumerate(drops):
        runs["qk_norm"].append(make_results("qk_norm", seed=s))
        b = make_results("no_qk_norm", qk_norm="none", seed=s, pr_drop=drop)
        if val_missing:
            b["val_loss"][-1] = None
        runs["no_qk_norm"].append(b)
    return runs


def test_pilot_prints_no_ranking_count_or_loss_difference_that_was_not_decided():
    per_seed = [4.0, -3.0, 1.0]  # every layer: wide intervals around +0.67, inconclusive at +-3% of ~30
    runs = pilot_seeds([[x] * L for x in per_seed], val_missing=True)
    text = pilot.report(pilot_analysis.analyze(runs))
    assert "differ most" not in text and "Layers that differ" not in text
    assert " higher in " not in text and "higher beyond the margin in" not in text
    assert bullet(text, "Which layers differ, and in how many QK-norm, learned gain is higher") == \
        f"not decided in any of the {L} layers (their intervals are in the per-layer table below)"
    # key PR is decided on log ratios: the mean difference +0.67, then the ratio and its interval
    rel, lo, hi = ratio_interval(*([r["mean_pr"][-1] for r in runs[c]] for c in ("qk_norm", "no_qk_norm")))
    assert bullet(text, "Final mean PR") == \
        f"not decided (inconclusive{OPEN}): +0.67 mean difference; ratio {rel:+.1%} [{lo:+.1%}, {hi:+.1%}] (95.0%)"
    # the last probe of no QK-norm has no validation loss: no difference from an earlier probe beside it
    assert bullet(text, "Final val loss") == "not decided (no paired values)"
    rows = {r["condition"]: r for r in md_table(text, "condition")}
    assert rows["no QK-norm (`no_qk_norm`)"]["final val loss"] == "n/a"
    assert rows["no QK-norm (`no_qk_norm`)"]["final probe (tokens)"] == "1,000,000"


def test_pilot_one_seed_is_not_ranked():
    text = pilot.report(pilot_analysis.analyze(pilot_seeds([[0, 0, 1, 2, 5, 10]])))
    assert "Layers that differ" not in text and "higher beyond the margin in" not in text
    assert bullet(text, "Final mean PR") == "not decided (one seed, no test): +3.00"


def test_pilot_ranks_and_counts_the_decided_layers():
    drops = [[0.0, 0.0, 0.0, 0.0, 5.0, 10.0], [0.1, 0.1, 0.1, 0.1, 5.2, 10.2], [-0.1, -0.1, -0.1, -0.1, 4.8, 9.8]]
    runs = pilot_seeds(drops)
    a = pilot_analysis.analyze(runs)
    text = pilot.report(a)
    rel, lo, hi = ratio_interval(*([r["layer_pr"]["5"][-1] for r in runs[c]] for c in ("qk_norm", "no_qk_norm")), k=L)
    ranked = bullet(text, "Layers that differ beyond the margin, largest first")
    assert ranked.startswith(f"layer 5 (+10.00 mean difference; ratio {rel:+.1%} [{lo:+.1%}, {hi:+.1%}] (99.2%)")
    assert ", layer 4 (+5.00 mean difference; ratio +" in ranked
    assert "not decided in" not in ranked
    assert "\n- QK-norm, learned gain higher beyond the margin in 2 of 6 layers, lower in 0, the same within the " \
        "margin in 4\n" in text
    assert [a.layer_decisions[i].outcome for i in range(L)] == ["equal"] * 4 + ["different, beyond the margin"] * 2


# ----------------------------------------------------------------------------- key dynamics

def with_final_norms(res: dict, shift: float) -> dict:
    """`res` with every layer's mean key norm at the last probe moved by `shift` (the change over the run too)."""
    for layer in res["probes"][-1]["layers"]:
        layer["means"]["k_norm.norm_mean"] += shift
    return res


def group_ends(res: dict, layers=(0, 1)) -> tuple[float, float]:
    """The mean key norm of a group of layers at the first and the last probe, read from the file."""
    return tuple(float(np.mean([res["probes"][p]["layers"][i]["means"]["k_norm.norm_mean"] for i in layers]))
                 for p in (0, -1))


def wd_runs(with_shifts, without_shifts) -> dict:
    return {keys_analysis.WITH_WD: [with_final_norms(make_results(seed=s), x) for s, x in enumerate(with_shifts)],
            keys_analysis.WITHOUT_WD: [with_final_norms(make_results(keys_analysis.WITHOUT_WD, seed=s), x)
                                       for s, x in enumerate(without_shifts)]}


def test_key_dynamics_gives_no_share_of_an_undecided_weight_decay_part():
    # early layers change by +1 with weight decay; weight decay's part per seed -0.5, +0.4, -0.1 around a norm of 8
    runs = wd_runs([0.0, 0.0, 0.0], [0.5, -0.4, 0.1])
    a = keys_analysis.analyze(runs)
    assert a.weight_decay["early"].outcome == "inconclusive"
    text = keys.report(a)
    assert "of which" not in text and "is weight decay's" not in text
    # decided on log ratios: ln(growth with / growth without), the growth being final over initial norm
    growth = {c: [end / start for start, end in map(group_ends, rl)] for c, rl in runs.items()}
    rel, lo, hi = ratio_interval(growth[keys_analysis.WITH_WD], growth[keys_analysis.WITHOUT_WD], k=3)
    line = bullet(text, "early layers: weight decay's part of the change")
    assert line.startswith(f"not decided (inconclusive{OPEN}): -0.067 mean difference; ratio {rel:+.1%} [{lo:+.1%}, "
                           f"{hi:+.1%}] (98.3%)")
    assert line.endswith("No share is given.")


def test_key_dynamics_gives_the_share_when_both_are_decided():
    runs = wd_runs([0.02, -0.02, 0.0], [-0.5, -0.52, -0.48])
    a = keys_analysis.analyze(runs)
    text = keys.report(a)
    early = bullet(text, "early layers")
    # on log ratios: the early layers grow 8 -> 9 with weight decay (ln 1.125 = 0.1178) and 8 -> 8.5 without
    # (ln 1.0625 = 0.0606), so weight decay's part is ln(9 / 8.5) = 0.0572, 49% of the log change (50% of the change
    # in units, +0.5 of +1.0)
    growth = {c: [end / start for start, end in map(group_ends, rl)] for c, rl in runs.items()}
    change = ratio_interval(growth[keys_analysis.WITH_WD], [1.0] * 3, k=6)
    part = ratio_interval(growth[keys_analysis.WITH_WD], growth[keys_analysis.WITHOUT_WD], k=3)
    assert early.startswith(f"change ratio {change[0]:+.1%} [{change[1]:+.1%}, {change[2]:+.1%}] (99.2%) with weight "
                            f"decay, of which ratio {part[0]:+.1%} [{part[1]:+.1%}, {part[2]:+.1%}] (98.3%) ")
    share = np.mean(np.log(np.divide(growth[keys_analysis.WITH_WD], growth[keys_analysis.WITHOUT_WD]))) / np.mean(
        np.log(growth[keys_analysis.WITH_WD]))
    assert round(share, 2) == 0.49
    assert early.endswith(f"({share:.0%} of the log change) is weight decay's (both beyond the margin).")
    # middle layers do not change (0 with weight decay, inside the margin): no share although weight decay's part
    # (+0.5) is decided beyond it
    middle = bullet(text, "middle layers: weight decay's part of the change")
    # growths 1.0025, 0.9975, 1: their mean log is a hair below 0 (ln is concave), so the ratio reads -0.0%
    assert "different, beyond the margin; the change with weight decay: +0.000 mean difference; ratio -0.0% [" in \
        middle and "equal" in middle
    assert middle.endswith("No share is given.") and "%) is weight decay's" not in middle
    assert "### Per layer (initial = first probe, at 0 tokens; final = last probe, at 1M tokens)" in text


def test_key_dynamics_says_a_part_inside_the_margin_is_no_share():
    runs = wd_runs([0.0, 0.02, -0.02], [0.1, 0.1, 0.1])
    text = keys.report(keys_analysis.analyze(runs))
    line = bullet(text, "early layers: weight decay's part of the change")
    growth = {c: [end / start for start, end in map(group_ends, rl)] for c, rl in runs.items()}
    rel, lo, hi = ratio_interval(growth[keys_analysis.WITH_WD], growth[keys_analysis.WITHOUT_WD], k=3)
    assert line.startswith(f"ratio {rel:+.1%} [{lo:+.1%}, {hi:+.1%}] (98.3%), different, within the margin")
    assert line.endswith("different, within the margin: inside \u00b13%, no share.")
    assert "a part inside the margin puts no share of the change on weight decay" in text  # said once


# ----------------------------------------------------------------------------- heads, QK-norm

def with_sink_norm(res: dict, shift: float) -> dict:
    """`res` with the sink's key norm at the last probe moved by `shift` (the sink-gatherer gap with it)."""
    res["probes"][-1]["layers"][SINK[0]]["k_norm"]["norm_mean"][SINK[1]] += shift
    return res


@pytest.mark.parametrize("shifts, said, claim", [
    ([3.0, -6.0, 2.0], f"not decided (inconclusive{OPEN}): +6.667 mean difference; ratio ", "inconclusive"),
    ([0.0, 0.1, -0.1], "+7.000 mean difference; ratio ", "holds")])
def test_heads_gap_is_a_decision_or_said_to_be_open(shifts, said, claim):
    a = heads_analysis.analyze({"QK": [with_sink_norm(make_results(seed=s), x) for s, x in enumerate(shifts)]})
    # key norms are decided on log ratios: the sink's norm (12 + shift) over the gatherer's (5), per seed
    rel, lo, hi = ratio_interval([12.0 + x for x in shifts], [5.0] * 3)
    text = heads.report(a)
    assert f"Sinks' key norm against gatherers' (3 seeds with both): {said}{rel:+.1%} [{lo:+.1%}, {hi:+.1%}] (95.0%)" \
        in text
    assert f"The claim: **{claim}**." in text


def test_qk_norm_report_names_the_probe_of_its_final_values():
    text = qk_norm_report.report(qk_norm.analyze(qk_runs([30.0, 30.0, 30.0], [3.0, 3.0, 3.0])))
    assert "'final' = the last probe, at 1M tokens." in text
