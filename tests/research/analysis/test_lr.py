"""research/analysis/lr.py and research/plots/lr.py on hand-built learning-rate grids (no torch)."""
import math

import pytest

from research.analysis.lr import analyze, max_logit_series, sensitivity, grid
from research.analysis.rules import DIFFERENT, INCONCLUSIVE
from research.plots import lr as lr_plots
from research.results import validate
from research.results.vocabulary import grid_key
from tests.helpers import md_table

L0 = 8.0  # initial loss of every run
MULTS = (0.25, 1, 4, 16)


def run(seed, final_loss, max_logit=10.0, diverged=None):
    """Two probes (step 0 and the end), final validation loss and one layer's logit_max."""
    probe = lambda t, logit: {"step": t, "tokens": t, "layers": [{"layer": 0, "means": {"k_norm.norm_mean": 8.0},  # noqa
                                                                   "attn": {"logit_max": [logit, logit / 2]}}]}
    res = {"tag": "x", "seed": seed, "tokens": [0, 1000], "loss": [None, final_loss],
           "val_loss": [None, final_loss], "mean_pr": [30.0, 20.0], "layer_pr": {"0": [30.0, 20.0]},
           "init_val_loss": L0, "probes": [probe(0, 1.0), probe(1000, max_logit)]}
    if diverged is not None:
        res["diverged"] = {"step": diverged}
    return validate(res)


OWN = (0, 1, -1)  # a seed's own part of a condition's values: 0 for seed 0, summing to 0 over seeds 0, 1, 2


def flat_and_steep(seeds=(0, 1, 2)):
    """QK: 3.0 at every rate (+0.01 per seed, and 0.001 * OWN[s] of its own): sensitivity 0. NoQK: 3.0, 3.0, 3.5
    (+0.01 per seed), diverged at 16x (counted at l0 = 8): seed s has mean(3 + .01s, 3 + .01s, 3.5 + .01s, 8) -
    (3 + .01s) = 1.375 - .0025s. NoQK's largest logit 10 x the multiplier, + 0.1 * OWN[s] per unit of multiplier
    above 1x, so its growth from 1x spreads over seeds (a difference with no spread is not decided)."""
    runs = {}
    for m in MULTS:
        runs[grid_key("QK", m)] = [run(s, 3.0 + 0.01 * s + 0.001 * OWN[s]) for s in seeds]
        loss = {0.25: 3.0, 1: 3.0, 4: 3.5, 16: math.nan}[m]
        runs[grid_key("NoQK", m)] = [run(s, loss + 0.01 * s, max_logit=10.0 * m + 0.1 * OWN[s] * (m - 1),
                                         diverged=5 if m == 16 else None) for s in seeds]
    return runs


def test_sensitivity_as_wortsman_et_al_define_it():
    g = grid(flat_and_steep())
    assert list(g) == ["QK", "NoQK"] and list(g["NoQK"]) == list(MULTS)
    assert sensitivity(g["QK"]) == pytest.approx({0: 0.0, 1: 0.0, 2: 0.0})
    assert sensitivity(g["NoQK"]) == pytest.approx({s: 1.375 - 0.0025 * s for s in range(3)})


def test_analysis_decides_sensitivity_onsets_and_stability():
    a = analyze(flat_and_steep())
    d = a.decisions[("QK", "NoQK")]
    assert d.outcome == DIFFERENT and d.diff == pytest.approx(-1.3725)
    assert a.highest_stable == {"QK": 16, "NoQK": 4}
    assert a.first(a.loss_onset["NoQK"], +1) == 4   # 3.5 vs 3.0 at 4x, and l0 at 16x
    assert a.first(a.logit_onset["NoQK"], +1) == 4  # 40 vs 10 at 1x (the diverged 16x has its last probe's 160)
    assert a.first(a.logit_onset["QK"], +1) is None


def test_two_seeds_far_apart_are_inconclusive():
    runs = {}
    for m in MULTS:
        runs[grid_key("QK", m)] = [run(0, 3.0), run(1, 3.0)]
        runs[grid_key("NoQK", m)] = [run(0, 3.0 if m != 16 else 3.4), run(1, 3.0 if m != 16 else 3.0)]
    assert analyze(runs).decisions[("QK", "NoQK")].outcome == INCONCLUSIVE


def test_max_logit_series_is_the_max_over_layers_and_heads():
    assert max_logit_series(run(0, 3.0, max_logit=12.0)).tolist() == [1.0, 12.0]


def test_figures_and_report_carry_the_analysis():
    a = analyze(flat_and_steep())
    figs = lr_plots.figures(a)
    ax = figs["lr_final_loss.png"].axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines["no QK-norm"].get_xdata()) == list(MULTS)
    assert lines["QK-norm, learned gain"].get_ydata() == pytest.approx([3.01] * 4)
    assert math.isnan(lines["no QK-norm"].get_ydata()[-1])  # every seed diverged at 16x: no final loss
    bars = figs["lr_sensitivity.png"].axes[0].patches
    assert [b.get_height() for b in bars] == pytest.approx([0.0, 1.3725])
    text = lr_plots.report(a)
    assert "| no QK-norm | 16x | n/a | 3/3 |" in text
    onsets = {r["condition (onsets)"]: r for r in md_table(text, "condition (onsets)")}
    assert onsets["no QK-norm"]["highest rate with no diverged seed"] == "4x"
    assert onsets["no QK-norm"]["final loss worse than QK-norm, learned gain's"] == "beyond the margin first at 4x"
    assert onsets["QK-norm, learned gain"]["final loss worse than QK-norm, learned gain's"] == "(the reference)"


def test_an_onset_is_named_from_decided_multipliers_only():
    """NoQK's loss against QK's: equal at 0.25x, open at 1x and 4x (seeds disagree), beyond the margin at 16x."""
    runs = {}
    for m in MULTS:
        runs[grid_key("QK", m)] = [run(s, 3.0 + 0.01 * s) for s in range(3)]
        off = {0.25: [0, 0.001, -0.001], 1: [0.2, -0.2, 0.05], 4: [0.3, -0.1, 0.0], 16: [0.5, 0.51, 0.49]}[m]
        runs[grid_key("NoQK", m)] = [run(s, 3.0 + 0.01 * s + off[s]) for s in range(3)]
    loss = "final loss worse than QK-norm, learned gain's"

    def onset(text: str) -> str:
        return next(r for r in md_table(text, "condition (onsets)") if r["condition (onsets)"] == "no QK-norm")[loss]
    cell = onset(lr_plots.report(analyze(runs)))
    assert cell.startswith("beyond the margin first at 16x of the decided multipliers (an undecided lower one may be "
                           "the onset) (not decided at 1x (+0.6% [")
    assert "from 16x" not in cell and "4x (+2.2% [" in cell
    one = {k: v[:1] for k, v in runs.items()}  # one seed: nothing is decided, and nothing is named as the onset
    cell = onset(lr_plots.report(analyze(one)))
    assert cell.startswith("not decided at any multiplier (0.25x (+0.0% (one seed)), 1x (+6.5% (one seed))")
    assert "first at" not in cell


def test_the_logit_curve_averages_seeds_at_the_same_token_count():
    """Seed 0 probed at 0, 500, 1000 tokens with largest logits 1, 4, 10; seed 1 at 0, 700, 1000 with 3, 8, 20.
    The curve is (1 + 3) / 2 = 2 at 0 and (10 + 20) / 2 = 15 at 1000 only; by position it drew (4 + 8) / 2 = 6
    "at 500 tokens", a mean of 500 and 700."""
    def on_grid(seed, tokens, logits):
        res = dict(run(seed, 3.0))
        res |= {"tokens": tokens, "loss": [None, 3.5, 3.0], "val_loss": [None, 3.5, 3.0], "mean_pr": [30.0] * 3,
                "layer_pr": {"0": [30.0] * 3},
                "probes": [{"step": i, "tokens": t, "layers": [{"layer": 0, "means": {"k_norm.norm_mean": 8.0},
                                                                "attn": {"logit_max": [g, g / 2]}}]}
                           for i, (t, g) in enumerate(zip(tokens, logits))]}
        return validate(res)
    a = analyze({grid_key("QK", 1): [on_grid(0, [0, 500, 1000], [1.0, 4.0, 10.0]),
                                     on_grid(1, [0, 700, 1000], [3.0, 8.0, 20.0])]})
    (line,) = lr_plots.figures(a)["lr_max_logit.png"].axes[0].get_lines()
    assert list(line.get_xdata()) == [0.0, 1000 / 1e6] and list(line.get_ydata()) == [2.0, 15.0]
