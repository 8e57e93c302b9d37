"""The conditions kind (a study file's), on runs whose final values are written by hand: the primary quantities'
one family, the bound of reading nine families together, differences in units and as a share of a named
condition, the logit's absolute margin, and each reason for not deciding said in its own words."""
from __future__ import annotations

import math

import pytest

from research.analysis.conditions import (INSIDE, LOGIT_MARGIN, QUANTITIES, ConditionRuns, analyze, check_primary,
                                          reading)
from research.analysis.rules import DIFFERENT, EQUAL, NO_DATA, NO_SPREAD, UNRESOLVED, WITHIN
from research.plots.conditions import in_short, report
from research.simulations.conditions import TRUTH, synthetic_run
from configs.config import ConfigError

SEEDS = (0, 1, 2)
OWN = (0.0, 1.0, -1.0)  # a seed's own part of a value: 0 in the mean over seeds 0, 1, 2


def runs_of(cond: str, own: float = 0.001, **per_seed) -> list[dict]:
    """A condition's runs over SEEDS: TRUTH's values, those named given per seed (a list) or for every seed (a
    number), each given as a number or taken from TRUTH plus `own` x OWN[seed] (a spread of this condition's own,
    so that differences between conditions with different `own` are never all the same)."""
    out = []
    for i, s in enumerate(SEEDS):
        finals = {k: v + own * OWN[i] for k, v in TRUTH.items()}
        for key, v in per_seed.items():
            finals[key] = v[i] if isinstance(v, (list, tuple)) else v + own * OWN[i]
        out.append(synthetic_run(cond, s, finals))
    return out


def short(a) -> str:
    """The report's "In short", as research.studies.render places it under the title."""
    return "\n".join(in_short(a))


def line(text: str, pair: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith(f"- {pair}: "))


def test_primary_quantities_are_one_family_and_the_others_exploratory():
    """Key PR and the validation loss named primary, two comparisons each: one family of k = 4, every interval at
    1 - 0.05/4 = 98.75%: t(2 dof, 0.99375) = 8.8602. Key PR is decided on log ratios (docs/decisions.md#ratio-
    quantities): up / base = 25/24, 26/24, 27/24, logs 0.040822, 0.080043, 0.117783 (mean 0.079549, sd 0.038483), so
    the interval is 0.079549 +- 8.8602 x 0.038483 / sqrt(3) = 0.079549 +- 0.196857, a ratio of +8.3% [-11.1%,
    +31.8%]; the mean difference stays 2 (differences 1, 2, 3). Each exploratory quantity is its own family of 2, at
    97.5%."""
    runs = {"base": runs_of("base", pr_sv=[24.0, 24.0, 24.0]), "up": runs_of("up", 0.003, pr_sv=[25.0, 26.0, 27.0]),
            "same": runs_of("same", 0.002)}
    a = analyze(ConditionRuns(runs, "base", ("val_loss", "pr_sv")), 0.03, 0.005)
    assert a.primary == ("pr_sv", "val_loss")  # in the order of QUANTITIES
    assert a.family_k == {q.key: 4 if q.key in a.primary else 2 for q in QUANTITIES}
    up = a.decisions["pr_sv"][("up", "base")]
    assert (up.diff, up.sd, up.ci_level) == (pytest.approx(2.0), pytest.approx(0.038483, abs=1e-6), 1 - 0.05 / 4)
    assert up.ratio and up.ci == pytest.approx((0.079549 - 0.196857, 0.079549 + 0.196857), abs=1e-6)
    assert (up.rel, *up.ci_rel) == pytest.approx((0.082799, -0.110688, 0.318383), abs=1e-6)
    assert a.decisions["key_norm"][("up", "base")].ci_level == 1 - 0.05 / 2
    assert [q.key for q in a.stated] == ["pr_sv", "val_loss"] and len(a.exploratory) == 7
    assert {q.key for p, items in a.in_short().items() for q, _ in items} == {"pr_sv", "val_loss"}
    text, lines = report(a), in_short(a)
    assert lines[0].startswith("The study's primary quantities (key PR (pr_sv), validation loss) are read as one "
                               "family of k = 4 comparisons: every interval at 1 \u2212 0.05/4 (98.8%), so all the "
                               "lines below are right at once with probability at least 95%. Each effect: its "
                               "difference and interval in the quantity's units, then a share of the baseline base's")
    assert len(lines) == 4 and lines[1].startswith("- up \u2212 base: ") and lines[2].startswith("- same \u2212 base: ")
    assert "key norm" not in line(short(a), "up \u2212 base") and lines[3].startswith(
        "Exploratory, not read here (each its own family at 95%, in its table under Decisions): centered key PR "
        "(pr_var), key norm,")
    assert "## In short" not in text  # research.studies.render places it, first
    assert "Primary: one family with the other primary quantities, k = 4." in text
    assert "Exploratory: its own family, k = 2." in text


def test_without_primary_quantities_the_report_bounds_reading_the_families_together():
    """Two quantities vary (key PR, validation loss), the others are the same in every run (no spread, no family):
    two families at 95% each, read together up to 10% (Bonferroni), 1 - 0.95^2 = 9.75% if independent. With all
    nine varying: up to 45%, 1 - 0.95^9 = 37%."""
    flat = {k: v for k, v in TRUTH.items() if k not in ("pr_sv", "val_loss")}
    runs = {c: runs_of(c, own, **flat) for c, own in (("base", 0.001), ("up", 0.003))}
    for c in runs:  # every value but key PR and the validation loss the same in every run of every condition
        for r in runs[c]:
            r["probes"][-1]["layers"][0]["means"].update({f"{q.site}.{q.metric}": TRUTH[q.key] for q in QUANTITIES
                                                          if q.site and q.key != "pr_sv"})
            r["loss"][-1] = TRUTH["loss"]
    a = analyze(ConditionRuns(runs, "base"), 0.03, 0.005)
    assert [k for k, n in a.family_k.items() if n] == ["pr_sv", "val_loss"]
    assert ("Read as 2 families, one per quantity, each right at once with probability at least 95%; a false line "
            "among them up to 10% (Bonferroni, 2 \u00d7 5%). Name `primary` quantities in the study file to read them "
            "as one family") in in_short(a)[0]
    nine = analyze(ConditionRuns({"base": runs_of("base"), "up": runs_of("up", 0.003)}, "base"), 0.03, 0.005)
    assert "a false line among them up to 45% (Bonferroni, 9 \u00d7 5%)" in in_short(nine)[0]


def test_each_difference_in_units_and_as_a_share_of_a_named_condition():
    """docs/study_files.md's logits: QK 8.20, NoQK 18.11, NoQK_softcap 11.96 (each +-0.1 over the seeds, so the
    differences spread by 0.01 or 0.02). NoQK - QK = +9.91, 9.91 / 8.20 = +121% of QK, against +-0.25 logits (one
    family of two comparisons: t(2, 0.9875) 6.2053 x 0.01 / sqrt(3) = 0.0358); NoQK_softcap - QK = +3.76, +46% of
    QK (the old report and page said +37%: a share of the pair's mean 10.08). Key norm 8.05 and 10.81: +2.76, and on
    log ratios (a key norm is a ratio quantity) 10.81 / 8.05 = 1.3429, +34.3% [+34.2%, +34.4%] against 3% of the
    pair's mean, |ln(NoQK/QK)| <= ln(1.015/0.985): a ratio from -2.96% to +3.05%."""
    runs = {"QK": runs_of("QK", logit_max=[8.1, 8.2, 8.3], key_norm=8.05),
            "NoQK": runs_of("NoQK", 0.003, logit_max=[18.0, 18.11, 18.22], key_norm=10.81),
            "NoQK_softcap": runs_of("NoQK_softcap", 0.002, logit_max=[11.87, 11.96, 12.05], key_norm=10.81)}
    a = analyze(ConditionRuns(runs, "QK"), 0.03, 0.005)
    text = line(short(a), "NoQK \u2212 QK")
    assert "largest attention logit +9.91 [+9.87, +9.95] logits (+121% of QK)" in text
    assert "key norm ratio NoQK/QK +34.3% [+34.2%, +34.4%]" in text  # its margin and mean difference: the table
    row = next(r for r in report(a).split("### key norm")[1].splitlines() if r.startswith("| NoQK \u2212 QK"))
    assert "| +2.760 |" in row and "\u00b13% of the pair's mean: a ratio from -2.96% to +3.05%" in row
    soft = a.decisions["logit_max"][("NoQK_softcap", "QK")]
    assert a.of_reference(("NoQK_softcap", "QK"), soft) == pytest.approx(3.76 / 8.20)
    assert "largest attention logit +3.76 [" in line(short(a), "NoQK_softcap \u2212 QK")
    assert "(+46% of QK)" in line(short(a), "NoQK_softcap \u2212 QK")
    assert "then a share of the baseline QK's value" in short(a)
    # Without a baseline, each pair in the study's order, first minus second, as a share of the first condition
    every = analyze(ConditionRuns(runs), 0.03, 0.005)
    assert "largest attention logit -9.91 [-9.95, -9.87] logits (-121% of QK)" in line(
        short(every), "QK \u2212 NoQK")
    assert "then a share of the first condition of each comparison's value" in short(every)


def test_no_share_of_a_baseline_inside_an_absolute_margin():
    """A largest logit of 0.10 against a margin of 0.25 logits: NoQK - QK = +0.20 would read "+200% of QK", a
    share of a value the margin calls zero; the line and the table give none. Key norm 8.05 keeps its ratio."""
    runs = {"QK": runs_of("QK", logit_max=[0.09, 0.10, 0.11], key_norm=8.05),
            "NoQK": runs_of("NoQK", 0.003, logit_max=[0.28, 0.30, 0.32], key_norm=10.81)}
    a = analyze(ConditionRuns(runs, "QK"), 0.03, 0.005)
    text = line(short(a), "NoQK \u2212 QK")
    logit = text.split("largest attention logit ")[1].split(";")[0].split(", and")[0]
    assert logit.startswith("+0.20 [") and logit.endswith("] logits")  # no share of a logit the margin calls zero
    assert "key norm ratio NoQK/QK +34.3% [" in text
    assert math.isnan(a.of_reference(("NoQK", "QK"), a.decisions["logit_max"][("NoQK", "QK")]))
    table = report(a).split("### largest attention logit")[1].splitlines()
    row = next(r for r in table if r.startswith("| NoQK \u2212"))
    assert row.split(" | ")[4] == "n/a"


def test_a_logit_near_zero_is_judged_in_logits():
    """A largest logit going from -0.05 to +0.05 (differences 0.10, 0.11, 0.09: mean 0.1, sd 0.01; one comparison,
    t(2, 0.975) = 4.3027: [0.0752, 0.1248]). As a share of the pair's mean (0.05) the 3% margin was 0.0015 and the
    report said "+200% beyond the margin"; against 0.25 logits it is real and inside the margin, and no share of
    a baseline the margin calls zero is given (it read +200%). A study file's logit_margin of 0.05 puts it beyond."""
    runs = {"base": runs_of("base", logit_max=[-0.05, -0.05, -0.05]),
            "up": runs_of("up", 0.003, logit_max=[0.05, 0.06, 0.04])}
    a = analyze(ConditionRuns(runs, "base", ("logit_max",)), 0.03, 0.005)
    d = a.decisions["logit_max"][("up", "base")]
    assert (d.outcome, d.margin, d.share, a.logit_margin) == (WITHIN, LOGIT_MARGIN, None, 0.25)
    assert reading(d) == INSIDE
    assert line(short(a), "up \u2212 base").endswith(
        "**lies within the margin** in largest attention logit +0.10 [+0.08, +0.12] logits.")  # no share of -0.05
    tight = analyze(ConditionRuns(runs, "base", ("logit_max",), logit_margin=0.05), 0.03, 0.005)
    assert tight.decisions["logit_max"][("up", "base")].outcome == DIFFERENT
    assert "\u00b10.05 logits for the largest attention logit (an absolute margin" in report(tight)


def test_each_reason_for_not_deciding_is_said_in_its_own_words():
    """One seed, no paired values, a baseline whose runs were all set aside, a difference with no spread, and an
    inconclusive one: five different sentences, none of them a decision."""
    one = {c: runs_of(c)[:1] for c in ("base", "up")}
    assert line(short(analyze(ConditionRuns(one, "base"), 0.03, 0.005)), "up \u2212 base") == (
        "- up \u2212 base: **one paired seed**: nothing is tested; the differences are described in the tables "
        "under Decisions.")
    apart = {"base": runs_of("base")[:2], "up": [dict(r, seed=r["seed"] + 10) for r in runs_of("up")]}
    assert line(short(analyze(ConditionRuns(apart, "base"), 0.03, 0.005)), "up \u2212 base").startswith(
        "- up \u2212 base: **no paired values**: no seed has a value in both conditions")
    gone = analyze(ConditionRuns({"up": runs_of("up"), "other": runs_of("other")}, "base"), 0.03, 0.005)
    assert gone.baseline_set_aside and gone.decisions["pr_sv"][("up", "base")].outcome == NO_DATA
    text = report(gone)
    assert line(short(gone), "up \u2212 base") == ("- up \u2212 base: **not compared**: every run of the baseline "
                                                   "base was set aside (What was compared says why).")
    assert "| base (baseline) | none left | every run set aside (What was compared) |" in text
    assert "| up \u2212 base | 0 | n/a | n/a | n/a | n/a | n/a | not compared: the baseline's runs were set aside |" \
        in text
    # key PR is 1.5 times the baseline's in every seed (24, 25, 26 against 36, 37.5, 39): on log ratios, as key PR is
    # decided, no spread (the differences 12, 12.5, 13 spread, but are not what is decided); the sink mass inconclusive
    mixed = {"base": runs_of("base", pr_sv=[24.0, 25.0, 26.0], sink_mass=[0.2, 0.2, 0.2]),
             "up": runs_of("up", 0.003, pr_sv=[36.0, 37.5, 39.0], sink_mass=[0.1, 0.3, 0.25])}
    a = analyze(ConditionRuns(mixed, "base", ("pr_sv", "sink_mass")), 0.03, 0.005)
    flat = a.decisions["pr_sv"][("up", "base")]
    assert flat.outcome == NO_SPREAD and not flat.decided and a.family_k["pr_sv"] == 1  # only the sink mass counts
    text = report(a)
    assert line(short(a), "up \u2212 base") == (
        "- up \u2212 base: **is not decided**\u2021 (inconclusive: the interval holds 0 and reaches past the margin) "
        "in attention sink mass, and **shows no spread** in key PR (pr_sv) ratio up/base +50.0% (mean difference "
        "+12.50): every seed differs by exactly that, so there is no interval and it is not decided.")
    assert "| n/a | no spread: every seed has the same ratio, +50.0% |" in text
    # a quantity decided on differences still says its exact difference: the largest logit, 0.5 above in every seed
    logits = {"base": runs_of("base", logit_max=[8.0, 8.5, 9.0]), "up": runs_of("up", 0.003, logit_max=[8.5, 9.0, 9.5])}
    b = analyze(ConditionRuns(logits, "base", ("logit_max",)), 0.03, 0.005)
    assert b.decisions["logit_max"][("up", "base")].outcome == NO_SPREAD
    assert "| n/a | no spread: every seed differs by exactly +0.50 |" in report(b)


def test_every_outcome_reads_in_its_own_words():
    """Beyond, inside, real of unresolved size: the three parts of a line that state estimates, in that order. A
    primary family of 3 (one comparison in each of 3 quantities): t(2, 1 - 0.05/6) = 7.6489. Key PR +10 per seed
    -+ 0.1: far beyond the margin; the other two on log ratios against ln(1.015/0.985) = 0.030002: key norm 8.01,
    8.02, 8.0 over 8 (logs mean 0.0012487, sd 0.0012484): 0.0012487 +- 0.0055132 = a ratio of +0.1% [-0.4%, +0.7%],
    inside; entropy 2.5, 2.51, 2.49 over 2.4 (logs mean 0.0408167, sd 0.0040000): [0.023152, 0.058481], a ratio of
    +4.2% [+2.3%, +6.0%], excludes 0 and reaches past the margin."""
    runs = {"base": runs_of("base", pr_sv=[24.0] * 3, key_norm=[8.0] * 3, entropy=[2.4] * 3),
            "up": runs_of("up", 0.003, pr_sv=[34.0, 34.1, 33.9], key_norm=[8.01, 8.02, 8.0],
                          entropy=[2.5, 2.51, 2.49])}
    a = analyze(ConditionRuns(runs, "base", ("pr_sv", "key_norm", "entropy")), 0.03, 0.005)
    assert [a.decisions[k][("up", "base")].outcome for k in ("pr_sv", "key_norm", "entropy")] == [
        DIFFERENT, EQUAL, UNRESOLVED]
    assert a.decisions["entropy"][("up", "base")].ci == pytest.approx((0.023152, 0.058481), abs=1e-6)
    text = line(short(a), "up \u2212 base")
    assert text.startswith("- up \u2212 base: **differs beyond the margin** in key PR (pr_sv) ratio up/base +41.7% [")
    assert ", and **lies within the margin** in key norm ratio up/base +0.1% [-0.4%, +0.7%]" in text
    assert text.endswith(", and **differs, by a size the margin does not settle**\u2021, in attention entropy (nats) "
                         "ratio up/base +4.2% [+2.3%, +6.0%].")


def test_primary_names_are_checked_with_the_closest_and_the_fix():
    assert check_primary(["logit_max", "val_loss"]) == ("logit_max", "val_loss")
    with pytest.raises(ConfigError, match=r"primary: 'logit_mx' is not a quantity of the study \(pr_sv, pr_var, "
                                          r"key_norm, max_abs, logit_max, entropy, sink_mass, val_loss, loss, rank90, "
                                          r"low_freq_share, kv_loss_4bit, kv_loss_3bit, kv_logit_error_4bit, "
                                          r"kv_loss_<format> of the key-cache formats\); did you mean 'logit_max'\? "
                                          r"Fix: name quantities of that list"):
        check_primary(["logit_mx"])
    with pytest.raises(ConfigError, match=r"primary: expected a non-empty list of quantity keys .*found \[\]"):
        check_primary([])
    with pytest.raises(ConfigError, match="primary: loss named more than once. Fix: name each quantity once"):
        check_primary(["loss", "val_loss", "loss"])
