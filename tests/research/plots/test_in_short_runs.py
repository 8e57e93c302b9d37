"""The "In short" of the pilot, key-dynamics, head, learning-rate and fine-tuning reports (research.plots.in_short):
on hand-built seed sets whose effects are set here, each line states the outcome, the effect and its interval
(computed apart from research.analysis) and the family it was decided in; and every report, drawn from its stored
study folder, opens with it. No torch."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from research.analysis import finetune as finetune_analysis
from research.analysis import heads as heads_analysis
from research.analysis import keys as keys_analysis
from research.analysis import pilot as pilot_analysis
from research.analysis.lr import analyze as lr_analyze
from research.analysis.wording import OPEN
from research.plots import finetune, heads, keys, lr, pilot
from research.plots.in_short import with_in_short
from research.results.vocabulary import REPORT
from research.studies.kinds import KINDS
from research.studies.render import load_and_analyze
from tests.research.analysis.test_lr import flat_and_steep
from tests.research.plots.test_derived_numbers import pilot_seeds, with_final_norms, with_sink_norm
from tests.research.studies.stored import unpack
from tests.research.studies.test_finetune_report import START_LOSS, ft_run
from tests.research.synthetic import L, make_results

MINE = ("pilot", "keys", "heads", "lr", "finetune")


def t_interval(d, k: int = 1) -> tuple[float, float, float]:
    """(mean, lo, hi): the Bonferroni t interval of mean(d) for a family of k, apart from research.analysis."""
    d = np.asarray(d, float)
    half = stats.t.ppf(1 - 0.05 / k / 2, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size)
    return d.mean(), d.mean() - half, d.mean() + half


def ratio_text(a, b, k: int = 1) -> str:
    """'+11.1% [+10.2%, +12.0%]': exp(mean ln(a/b)) - 1 and its interval mapped back, at one decimal."""
    mean, lo, hi = np.expm1(t_interval(np.log(np.asarray(a, float) / np.asarray(b, float)), k))
    return f"{mean:+.1%} [{lo:+.1%}, {hi:+.1%}]"


def share_text(diffs, scale: float, k: int = 1) -> str:
    """'-2.6% [-3.2%, -2.0%]': the mean difference and its interval as shares of `scale`, at one decimal."""
    mean, lo, hi = (x / scale for x in t_interval(diffs, k))
    return f"{mean:+.1%} [{lo:+.1%}, {hi:+.1%}]"


def opens_with(kind: str, analysis, lines: list[str]) -> None:
    """The kind's report, drawn from `analysis` as render does it, opens under its title with exactly `lines`."""
    k = KINDS[kind]
    report = k.draw(analysis)[REPORT]
    title = report.partition("\n\n")[0]
    assert k.in_short(analysis) == lines
    assert with_in_short(report, lines, k.settle(analysis)).startswith(
        f"{title}\n\n## In short\n\n" + "\n".join(lines) + "\n\n")


# ----------------------------------------------------------------------------- pilot

def test_pilot_in_short_states_the_pr_effect_the_open_loss_and_the_layers():
    # no QK-norm's final PR is 3.0, 3.1, 2.9 lower in every layer than QK-norm's 30: about +11% beyond the margin;
    # its final validation loss moved by +0.1, -0.1, +0.05 on 6.1: open at +-0.5%
    runs = pilot_seeds([[3.0] * L, [3.1] * L, [2.9] * L])
    for r, e in zip(runs["no_qk_norm"], (0.1, -0.1, 0.05)):
        r["val_loss"][-1] += e
    a = pilot_analysis.analyze(runs)
    pr = ratio_text([30.0] * 3, [27.0, 26.9, 27.1])
    qk_val, noqk_val = [6.1] * 3, [6.2, 6.0, 6.15]
    val = share_text(np.subtract(qk_val, noqk_val), (np.mean(qk_val) + np.mean(noqk_val)) / 2)
    lines = [f"- final key PR, QK-norm, learned gain / no QK-norm: **different, beyond the margin** {pr} "
             "(its own family, k = 1, 95.0%, 3 seeds)",
             f"- final validation loss, QK-norm, learned gain \u2212 no QK-norm: **inconclusive**{OPEN} {val} "
             "(its own family, k = 1, 95.0%, 3 seeds)",
             f"- final key PR per layer, QK-norm, learned gain against no QK-norm: higher beyond the margin in {L} "
             f"of {L} layers, lower in 0, the same within the margin in 0, not decided in 0 (per-layer family, "
             f"k = {L}, 99.2% each, 3 seeds)"]
    assert pilot.in_short(a) == lines
    opens_with("pilot", a, lines)


def test_pilot_in_short_of_one_seed_and_of_one_condition():
    a = pilot_analysis.analyze(pilot_seeds([[3.0] * L]))
    assert pilot.in_short(a)[0] == ("- final key PR, QK-norm, learned gain / no QK-norm: **descriptive** +11.1% "
                                    "(one seed) (its own family, not tested, 1 seed)")
    one = pilot_analysis.analyze({"qk_norm": [make_results("qk_norm")]})
    assert pilot.in_short(one) == ["- QK-norm, learned gain: final mean key PR 30.00, final validation loss 6.100 "
                                   "(1 seed(s)); the QK-norm minus no-QK-norm difference needs both conditions"]


# ----------------------------------------------------------------------------- key dynamics

def test_keys_in_short_states_weight_decays_part_of_each_group_and_where_layers_ended():
    # with weight decay every group's final norm is moved by +0.02, -0.02, 0 per seed, without it by -0.5 +- 0.02:
    # early layers grow 8 -> 9 against 8 -> 8.5, middle 8 -> 8 against 8 -> 7.5, final 8 -> 7 against 8 -> 6.5
    on, off = (0.02, -0.02, 0.0), (-0.5, -0.52, -0.48)
    runs = {keys_analysis.WITH_WD: [with_final_norms(make_results(seed=s), x) for s, x in enumerate(on)],
            keys_analysis.WITHOUT_WD: [with_final_norms(make_results(keys_analysis.WITHOUT_WD, seed=s), x)
                                       for s, x in enumerate(off)]}
    a = keys_analysis.analyze(runs)
    lines = keys.in_short(a)
    for line, (g, end) in zip(lines, (("early", 9.0), ("middle", 8.0), ("final", 7.0))):
        part = ratio_text([(end + x) / 8 for x in on], [(end + x) / 8 for x in off], k=3)
        assert line == (f"- weight decay on the gains, {g} layers' key-norm growth (QK / QK_no_gain_wd): "
                        f"**different, beyond the margin** {part} (weight-decay family, k = 3, 98.3% each, 3 seeds)")
    early = ratio_text([9.0 + x for x in on], [8.0] * 3, k=6)
    assert lines[3].startswith(f"- QK-norm, learned gain, key norm final / initial: early **different, beyond the "
                               f"margin** {early}, middle **equal** ")
    assert lines[3].endswith("(group-change family, k = 6, 99.2% each, 3 seeds); final norm against sqrt(d_head) = "
                             "8.00: layers 0, 1 above it, layers 4, 5 below it, layers 2, 3 at it")
    assert lines[4].startswith("- QK_no_gain_wd, key norm final / initial: early **different, beyond the margin** ")
    assert lines[5] == ("- The write-ups' claim that early layers' keys shrink and final layers' keys grow: "
                        "QK-norm, learned gain **fails**; QK_no_gain_wd **fails**")
    assert len(lines) == 6
    opens_with("keys", a, lines)


# ----------------------------------------------------------------------------- heads

def test_heads_in_short_counts_sinks_and_gatherers_and_states_the_norm_gap():
    shifts = (0.0, 0.1, -0.1)  # the sink's final key norm 12 + shift against the gatherer's 5 in each seed
    a = heads_analysis.analyze({"QK": [with_sink_norm(make_results(seed=s), x) for s, x in enumerate(shifts)]})
    gap = ratio_text([12.0 + x for x in shifts], [5.0] * 3)
    # the keys' effective rank ends at 56 - 2 (layer + 1): 54 in layer 0 down to 44 in layer 5
    lines = ["- QK-norm, learned gain, last probe: 1 sink and 1 gatherer in every seed (of 12 KV heads); key effective "
             "rank 44.0 (layer 5) to 54.0 (layer 0), at most d_head = 64, mean over 3 seeds",
             f"- QK-norm, learned gain, sinks' mean key norm / gatherers': **different, beyond the margin** {gap} (its "
             "own family, k = 1, 95.0%, 3 seeds); the write-ups' claim that sinks have higher key norms: **holds**"]
    assert heads.in_short(a) == lines
    opens_with("heads", a, lines)
    none = heads_analysis.analyze({"QK": [make_results(seed=s, n_kv=1, n_q=1) for s in range(2)]})
    assert heads.in_short(none)[0].startswith("- QK-norm, learned gain, last probe: no sink and no gatherer in any "
                                              "seed (of 6 KV heads); ")


# ----------------------------------------------------------------------------- learning rate

def test_lr_in_short_states_the_sensitivity_difference_its_values_and_stable_rates():
    a = lr_analyze(flat_and_steep())  # QK's loss does not depend on the rate; NoQK's does, and it diverges at 16x
    # per seed NoQK's sensitivity is 1.375 - 0.0025 s and QK's 0; both best losses average 3.01: the shares' base
    diffs = [-(1.375 - 0.0025 * s) for s in range(3)]
    lines = [f"- LR sensitivity, QK-norm, learned gain \u2212 no QK-norm (share of the best loss): **different, beyond "
             f"the margin** {share_text(diffs, 3.01)} (sensitivity family, k = 1, 95.0%, 3 seeds)",
             f"- LR sensitivity in nats (mean \u00b1 95% CI over seeds): QK-norm, learned gain 0.000 \u00b1 0.000; "
             f"no QK-norm 1.373 \u00b1 {t_interval(diffs)[2] - np.mean(diffs):.3f}",
             "- Highest rate with no diverged seed: QK-norm, learned gain 16x; no QK-norm 4x"]
    assert lr.in_short(a) == lines
    opens_with("lr", a, lines)


# ----------------------------------------------------------------------------- fine-tuning

def test_finetune_in_short_states_trained_against_frozen_gains_and_the_loss_over_fine_tuning():
    ends = {finetune_analysis.TRAINED: (3.80, 3.81, 3.79), finetune_analysis.FROZEN: (3.90, 3.90, 3.90)}
    prs = {finetune_analysis.TRAINED: (40.0, 40.2, 39.8), finetune_analysis.FROZEN: (38.0, 38.0, 38.0)}
    runs = {c: [ft_run(c, s, [38.0] * 4 + [prs[c][s]], ends[c][s]) for s in range(3)]
            for c in finetune_analysis.CONDITIONS}
    a = finetune_analysis.analyze(runs)
    pr = ratio_text(prs[finetune_analysis.TRAINED], prs[finetune_analysis.FROZEN], k=2)
    trained, frozen = (np.array(ends[c]) for c in finetune_analysis.CONDITIONS)
    loss = share_text(trained - frozen, (trained.mean() + frozen.mean()) / 2)
    change = share_text(trained - START_LOSS, START_LOSS)
    lines = finetune.in_short(a)
    assert lines[:6] == [
        f"- key PR (pr_sv at k_norm), trained / frozen gains: **different, beyond the margin** {pr} (key family, "
        "k = 2, 97.5% each, 3 seeds)",
        "- PR of the normalized keys before the gain (k_hat), trained / frozen gains: **different, beyond the "
        f"margin** {pr} (key family, k = 2, 97.5% each, 3 seeds)",
        "- key norm at k_norm, trained / frozen gains: **no spread**: every seed has the same ratio, +0.0% (key "
        "family, k = 2, 97.5% each, 3 seeds)",
        f"- validation loss (the probe batch), trained \u2212 frozen gains: **different, beyond the margin** {loss} "
        "(its own family, k = 1, 95.0%, 3 seeds)",
        "- held-out loss over fine-tuning, q/k norm gains trained (last \u2212 first probe, share of the first): "
        f"**different, beyond the margin** {change} (loss-change family, k = 1, 95.0%, 3 seeds)",
        "- held-out loss over fine-tuning, q/k norm gains frozen at their pretrained values (last \u2212 first probe, "
        "share of the first): **no spread**: every seed differs by exactly -0.100 (loss-change family, k = 1, 95.0%, "
        "3 seeds)"]
    assert lines[6].startswith("- Key PR rises again after its lowest point: ") and len(lines) == 7
    opens_with("finetune", a, lines)
    assert math.isclose(a.final["val_loss"].diff, -0.1)


# ----------------------------------------------------------------------------- every report opens with it

@pytest.mark.parametrize("kind", MINE)
def test_a_stored_studys_report_opens_with_in_short(kind, tmp_path):
    folder, _ = unpack(kind, tmp_path)
    view = load_and_analyze(folder)
    title, short, body, *_ = view.report.split("\n\n")
    assert title.startswith("# ") and short == "## In short"
    assert body.splitlines() == KINDS[kind].in_short(view.analysis) and body.startswith("- ")
    assert "## Figures" not in view.report
    for name in view.figures:  # every figure is placed in the report, beside what it explains
        assert f"]({name})" in view.report
