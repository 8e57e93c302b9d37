"""The "In short" of the conditions, spikes, pretrained-keys and checkpoint-keys kinds on inputs whose numbers are known
by hand, the route each kind's open outcomes are settled by, and the stored folders of every kind rendered with the
section first."""
from __future__ import annotations

import pytest

from research.analysis import pretrained as pretrained_analysis
from research.analysis import trajectory as trajectory_analysis
from research.analysis import trajectory_seeds as seeds_analysis
from research.analysis.conditions import ConditionRuns
from research.analysis.conditions import analyze as analyze_conditions
from research.analysis.spikes import analyze as analyze_spikes
from research.analysis.wording import OPEN, settle_line
from research.plots import conditions, pretrained_report, spikes, trajectory, trajectory_seeds
from research.plots.in_short import MOST
from research.studies.kinds import KINDS
from research.studies.render import load_and_analyze
from tests.research.analysis.test_conditions import runs_of
from tests.research.analysis.test_pretrained import _record
from tests.research.analysis.test_spikes import SEEDS, _run, _runs
from tests.research.studies.stored import BUILDERS, unpack

MARGIN = "margin \u00b13% of the pair's mean: a ratio from -2.96% to +3.05%"


# ---------------------------------------------------------------------------------- conditions

def test_conditions_states_the_family_once_then_one_line_per_comparison():
    """The largest logit named primary: base 8.0 in each seed, up 10.0, 10.1, 9.9: differences 2.0, 2.1, 1.9 (mean
    2.0, sd 0.1), one comparison (k = 1): 2.0 +- t(2, 0.975) 4.3027 x 0.1 / sqrt(3) = 2.0 +- 0.2484, [+1.75, +2.25],
    wholly beyond +-0.25 logits; 2.0 of the baseline's 8.0 is +25%. The other eight quantities are exploratory."""
    runs = {"base": runs_of("base", logit_max=[8.0] * 3), "up": runs_of("up", 0.003, logit_max=[10.0, 10.1, 9.9])}
    lines = conditions.in_short(analyze_conditions(ConditionRuns(runs, "base", ("logit_max",)), 0.03, 0.005))
    assert len(lines) == 3
    assert lines[0].startswith("The study's primary quantities (largest attention logit) are read as one family of "
                               "k = 1 comparisons: every interval at 1 \u2212 0.05/1 (95.0%), so all the lines below "
                               "are right at once with probability at least 95%. Each effect: its difference and "
                               "interval in the quantity's units, then a share of the baseline base's value,")
    assert lines[1] == ("- up \u2212 base: **differs beyond the margin** in largest attention logit +2.00 [+1.75, "
                        "+2.25] logits (+25% of base).")
    assert lines[2].startswith("Exploratory, not read here (each its own family at 95%, in its table under Decisions): "
                               "key PR (pr_sv), centered key PR (pr_var), key norm,")


def test_conditions_past_twelve_lines_counts_the_comparisons_left_to_the_tables():
    """Six conditions without a baseline: 15 pairs. The family note and 10 pairs fill 11 lines; the twelfth counts
    the other 5."""
    runs = {c: runs_of(c, 0.001 * (i + 1)) for i, c in enumerate("ABCDEF")}
    lines = conditions.in_short(analyze_conditions(ConditionRuns(runs), 0.03, 0.005))
    assert len(lines) == MOST and lines[0].startswith("Read as 9 families, one per quantity")
    assert lines[1].startswith("- A \u2212 B: ") and lines[2].startswith("- A \u2212 C: ")
    assert lines[-1] == "- 5 more comparisons: in the tables under Decisions."


def test_the_conditions_report_names_each_table_by_its_quantity_and_places_its_figures():
    runs = {"base": runs_of("base"), "up": runs_of("up", 0.003)}
    text = conditions.report(analyze_conditions(ConditionRuns(runs, "base"), 0.03, 0.005))
    assert "## In short" not in text and "## Figures" not in text  # research.studies.render places In short
    assert "| largest key component \\|k_i\\| (max_abs), comparison | n | mean difference |" in text  # pipe escaped
    assert text.count("Ratios: from per-seed log ratios (the ratio rule: docs/decisions.md#ratio-quantities).") == 5
    assert "exp(mean ln(A/B))" not in text  # the rule is said once, in the procedure's paragraph
    for name in conditions.FIGURES:
        assert text.count(f"]({name})") == 1
    assert text.index("](comparisons.png)") < text.index("### key PR (pr_sv)")


# ---------------------------------------------------------------------------------- spikes

def test_spikes_names_the_signals_that_warn_with_their_rates():
    """test_spikes' runs: logit_max rises 5 steps before each of 2 spikes a run; held out on seeds 6-11, each run's
    alarms hit its own 2 spikes (12 of 12) and no other run's: chance 1/6 (each spike hit by 1 of the 6 runs' alarms
    when they are paired). Three signals tested (logit_max, its growth, grad_norm): one-sided 0.05 / 2 / 3."""
    lines = spikes.in_short(analyze_spikes(_runs(), seeds=SEEDS))
    assert len(lines) == 1
    assert lines[0].startswith("- no QK-norm (NoQK), 12 held-out spike(s): **warns**: logit_max (hit rate 1.00 [1.00, "
                               "1.00] against 0.17 [0.17, 0.17] by chance), logit_growth (hit rate 1.00 [1.00, 1.00] "
                               "against 0.17 [0.17, 0.17] by chance); ")
    assert "key_norm, update_rms_muon, update_rms_adamw, entropy (not recorded in its runs)" in lines[0]
    assert lines[0].endswith("(3 signal(s) tested, one family at one-sided p \u2264 0.0083 each; checks: loss_rise "
                             "inconclusive, late_loss_rise inconclusive).")


def test_spikes_says_a_signal_does_not_warn_with_its_bounds():
    """4 spikes a run, 24 held out, and one alarm a run after every spike: no hit, chance 0. The exact bound on the
    pooled hit rate is 1 - 0.025 ** (1 / 24) = 0.1425 (one signal tested), under 0.25; so is the t bound on the
    per-seed excess, 0 in every seed."""
    runs = [_run(s, 128, tuple(30 + 12 * (s % 6) + 30 * i for i in range(4)), (185,)) for s in SEEDS]
    line, = spikes.in_short(analyze_spikes(runs, seeds=SEEDS))
    assert line.startswith("- no QK-norm (NoQK), 24 held-out spike(s): **does not warn**: logit_max (hit rate above "
                           "chance 0.00 [0.00, 0.00], exact bound 0.14); **inconclusive**: logit_growth, key_norm,")
    assert "(1 signal(s) tested, one family at one-sided p \u2264 0.025 each; checks: loss_rise does not warn, " \
           "late_loss_rise does not warn)." in line


# ---------------------------------------------------------------------------------- pretrained keys

def test_pretrained_gives_the_four_answers_over_text_batches():
    """test_pretrained's record, 5 batches. Norms: each group's mean key norm 2.5 + 0.011 b - 0.002 (2.52 on average)
    against sqrt(4) = 2, on log ratios: +26.0%, t(4, 1 - 0.05/6) = 3.9608 x sd 0.00436 / sqrt(5): [+24.5%, +27.5%];
    the groups are the same layers' keys batch by batch: no spread. Sinks: KV head 0 of every layer a sink (half the
    query heads above 0.3), its keys 3 + 0.01 b + 0.002 (b - 2) against 2 + 0.01 b: +49.5% [+49.2%, +49.8%]. No
    k_norm. Rank: pr_sv (1.5 + 0.01 b) / (3.0 - 0.01 b), log ratios mean -0.67324, sd 0.015709: -49.0% [-50.4%,
    -47.6%]."""
    a = pretrained_analysis.PretrainedAnalysis({}, {"toy": pretrained_analysis.analyze(_record())}, 0.03)
    lines = pretrained_report.in_short(a)
    assert len(lines) == 4
    assert lines[0].startswith("- Key norm against sqrt(d_head) = 2.00 at k_proj: early 2.52: **different, beyond the "
                               "margin** +26.0% [+24.5%, +27.5%]; middle 2.52: ")
    assert lines[0].endswith("(one family of 3, 98.3% each, over 5 text batches); by depth: middle \u2212 early: **no "
                             "spread** (every batch has the same ratio, +0.0%); final \u2212 middle: **no spread** "
                             "(every batch has the same ratio, +0.0%); final \u2212 early: **no spread** (every batch "
                             "has the same ratio, +0.0%) (none tested, 5 text batch(es)).")
    assert lines[1] == ("- Sinks: sink rate 0.500 (query heads with mean first-token attention > 0.3); KV heads sink "
                        "6, gatherer 6, neither 0; the top-sink KV head's keys against its layer's others': "
                        "**different, beyond the margin** +49.5% [+49.2%, +49.8%] (its own family, 95.0%, over 5 text "
                        "batches); "
                        "sinks' keys against gatherers': **different, beyond the margin** +49.5% [+49.2%, +49.8%] (its "
                        "own family, 95.0%, over 5 text batches).")
    assert lines[2] == "- k_norm gain: the model has none."
    assert lines[3] == ("- Key rank (pr_sv at k_proj), trained against untrained: " + "; ".join(
        f"{g} 1.5 against 3.0: **different, beyond the margin** -49.0% [-50.4%, -47.6%]"
        for g in ("early", "middle", "final")) + " (one family of 3, 98.3% each, over 5 text batches).")
    several = pretrained_analysis.PretrainedAnalysis({}, {"a": a.models["toy"], "b": a.models["toy"]}, 0.03)
    lines = pretrained_report.in_short(several)
    assert len(lines) == 8 and lines[2] == "- a: k_norm gain: the model has none."
    assert lines[4].startswith("- b: key norm against sqrt(d_head) = 2.00")


def test_pretrained_open_outcomes_are_settled_by_new_batches():
    a = pretrained_analysis.PretrainedAnalysis({}, {"toy": pretrained_analysis.analyze(_record())}, 0.03)
    assert KINDS["pretrained_keys"].settle(a) == settle_line("batch")
    assert "a replication on new batches decided on its own" in settle_line("batch")


# ---------------------------------------------------------------------------------- checkpoint keys

L, HQ, HKV = 3, 4, 2
FALL = (0.80, 0.81, 0.79)  # the last checkpoint's keys, entropy: the first's times these, batch by batch or per seed


def _batch(f: float, loss: float, sink: float = 0.1) -> dict:
    keys = {site: {"pr_sv": [[10.0 * f] * HKV] * L, "norm_mean": [[4.0 * f] * HKV] * L,
                   "peak_frac": [[0.3] * HKV] * L} for site in ("k_proj", "k_rope")}
    return {"loss": loss, "keys": keys, "attn": {"entropy": [[2.0 * f] * HQ] * L,
                                                 "sink_mass_excl_q0": [[sink] * HQ] * L}}


def _checkpoint(label: str, step: int, falls, losses, sink: float = 0.1, **extra) -> dict:
    return {"label": label, "step": step, "source": label, "sha256": "0" * 64,
            "batches": [_batch(f, loss, sink) for f, loss in zip(falls, losses)], **extra}


def _key_lines(unit: str) -> list[str]:
    """Every ratio metric falls by FALL: log ratios mean -0.223196, sd 0.0125007, 15 comparisons with an interval
    (five ratio metrics, three groups; peak_frac and the first-token attention do not move: no spread), t(2, 1 -
    0.05/30) = 17.2772: -0.223196 +- 0.124693, a ratio of -20.0% [-29.4%, -9.4%]."""
    fall = "**different, beyond the margin** -20.0% [-29.4%, -9.4%]"
    return [f"- {title}: " + "; ".join(f"{g} {a} \u2192 {b}: {fall}" for g in ("early", "middle", "final"))
            + " (key and attention family)." for title, a, b in (
                ("pr_sv at k_proj", 10, 8), ("key norm at k_proj", 4, 3.2), ("pr_sv after RoPE (k_rope)", 10, 8),
                ("key norm after RoPE (k_rope)", 4, 3.2))] + [
        "- peak_frac at k_proj: " + "; ".join(f"{g} 0.3 \u2192 0.3: **no spread** (every {unit} differs by exactly "
                                             f"+0.000)" for g in ("early", "middle", "final"))
        + " (key and attention family).",
        "- attention entropy (nats): " + "; ".join(f"{g} 2 \u2192 1.6: {fall}" for g in ("early", "middle", "final"))
        + " (key and attention family)."]


def test_one_models_checkpoints_per_metric_over_text_batches():
    """Loss 5.0, 5.1, 4.9 -> 4.0, 4.05, 3.95: -1.0 +- 4.3027 x 0.05 / sqrt(3) = [-1.1242, -0.8758], as shares of the
    pair's mean 4.5: -22.2% [-25.0%, -19.5%], beyond 0.5% of it."""
    res = {"model": {"n_layers": L}, "checkpoints": [_checkpoint("first", 0, (1, 1, 1), (5.0, 5.1, 4.9)),
                                                     _checkpoint("last", 100, FALL, (4.0, 4.05, 3.95))]}
    t = trajectory_analysis.analyze(res)
    lines = KINDS["checkpoint_keys"].in_short(t)
    assert lines == trajectory.in_short(t) and len(lines) == 9
    assert lines[0] == ("- From first (step 0) to last (step 100), over 3 text batches: the key and attention metrics "
                        "are one family of 15, 99.7% each, the loss its own.")
    assert lines[1:7] == _key_lines("batch")
    assert lines[7].startswith("- first-token attention, queries 1..T-1: early 0.1 \u2192 0.1: **no spread**")
    assert lines[8] == ("- loss (nats/token): 5 \u2192 4: **different, beyond the margin** -22.2% [-25.0%, -19.5%] "
                        "(its own family, 95.0%).")
    assert KINDS["checkpoint_keys"].settle(t) == settle_line("batch")
    one = {**res, "checkpoints": res["checkpoints"][:1]}
    assert trajectory.in_short(trajectory_analysis.analyze(one)) == [
        "- Only one checkpoint was measured (first, step 0): nothing to decide; loss 5.000 nats/token, pr_sv at "
        "k_proj early 10.000, middle 10.000, final 10.000."]


def test_seeds_checkpoints_per_metric_across_seeds_settled_by_another_suite():
    """Three seeds, each falling by its own factor of FALL (a seed's values are the same in every batch), so the
    per-seed changes are the per-batch ones above: the same intervals, over seeds. Seed 0's heads put 0.2 on the first
    token from its first revision (above the 0.15 threshold), the others' 0.1: seed 0 has a sink by step 0."""
    res = {"model": {"n_layers": L}, "sink_threshold": 0.15, "checkpoints":
           [_checkpoint(f"s{s}/a", 0, (1,) * 3, (5.0,) * 3, sink=0.2 if s == 0 else 0.1, seed=s) for s in range(3)]
           + [_checkpoint(f"s{s}/b", 100, (FALL[s],) * 3, (4.0 + (0, 0.05, -0.05)[s],) * 3,
                          sink=0.2 if s == 0 else 0.1, seed=s) for s in range(3)]}
    t = seeds_analysis.analyze(res)
    lines = KINDS["checkpoint_keys"].in_short(t)
    assert lines == trajectory_seeds.in_short(t) and len(lines) == 10
    assert lines[0] == ("- From step 0 to step 100, over 3 seeds: the key and attention metrics are one family of 15, "
                        "99.7% each, the loss its own.")
    assert lines[1:7] == _key_lines("seed")
    assert lines[8].startswith("- loss (nats/token): 5 \u2192 4: **different, beyond the margin** -22.2% [-25.0%, ")
    assert lines[9] == ("- First sink head of each seed (above 0.15; described, not tested): seed 0 by step 0; seed 1 "
                        "none at any revision; seed 2 none at any revision.")
    settle = KINDS["checkpoint_keys"].settle(t)
    assert settle.startswith(f"{OPEN} open at these seeds; to settle it: a replication on other seeds (another suite, "
                             "or runs of one's own) decided on its own;") and "--until_decided" not in settle


# ---------------------------------------------------------------------------------- stored folders

MINE = ("conditions", "spikes", "pretrained_keys", "checkpoint_keys")


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_every_stored_report_opens_with_in_short(kind, tmp_path):
    folder, _ = unpack(kind, tmp_path)
    report = load_and_analyze(folder).report
    title, short, *_ = report.split("\n\n")
    assert title.startswith("# ") and short == "## In short"
    if kind in MINE:
        lines = report.split("## In short\n\n")[1].split("\n\n")[0].splitlines()
        assert 0 < len(lines) <= MOST and all(line.strip() for line in lines)
        assert "## Figures" not in report
        for name in KINDS[kind].outputs([]):
            if name.endswith(".png"):  # each once, where it explains (a model without k_norm: its gain section)
                assert report.count(f"]({name})") == 1, name
