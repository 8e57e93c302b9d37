"""qk-decide's decisions checked against numbers known by hand and published ones: Parameter Golf's record rows
(PR #1925 against #1855, seeds 42, 0, 1234) paired and by Welch, its QK-gain rows, the stored QK-norm and conditions
studies' combined.json; bad runs refused in one line; a design's looks."""
from __future__ import annotations

import json
import math

import pytest

from research import qk_decide
from research.results.file_formats import DECIDE, DECIDE_DESIGN_FORMAT
from tests.helpers import stops
from tests.research.studies.stored import unpack
from utils.formats import check

SEEDS = (42, 0, 1234)
PR1925 = (1.05906444, 1.06059202, 1.06129561)
PR1855 = (1.05989454, 1.06124613, 1.06208695)
GAIN55 = (1.0805, 1.0810, 1.0812)  # PR #1715, QK-gain 5.5, seeds 42/314/999
GAIN525 = (1.08041364, 1.08168719, 1.08181413)  # PR #1725's reproduction of 5.25


def csv(path, rows, header="condition,seed,bpb"):
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return path


def golf(tmp_path):
    return csv(tmp_path / "golf.csv", [("pr1925", s, v) for s, v in zip(SEEDS, PR1925)] +
               [("pr1855", s, v) for s, v in zip(SEEDS, PR1855)])


def decide(capsys, tmp_path, argv) -> tuple[str, dict]:
    capsys.readouterr()
    out = tmp_path / "decide.json"
    assert qk_decide.main([*argv, "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    check(DECIDE, record)
    return capsys.readouterr().out, record


def test_parameter_golf_rows_paired_and_by_welch(tmp_path, capsys):
    text, record = decide(capsys, tmp_path, [str(golf(tmp_path)), "--margin", "0.0072"])
    c, = record["comparisons"]
    assert (c["a"], c["b"], c["how"], c["n"], c["outcome"]) == ("pr1925", "pr1855", "paired by seed", 3,
                                                                 "different, within the margin")
    assert c["difference"] == pytest.approx(-0.00075852, abs=5e-9)  # the issue rounds to 8 decimals
    assert c["ci"] == pytest.approx([-0.000988, -0.000529], abs=1e-6) and c["ci_level"] == pytest.approx(0.95)
    assert c["p_one_sided"] == pytest.approx(0.0025, abs=5e-5) and c["margin"] == 0.0072
    assert "- bpb, pr1925 \u2212 pr1855: **different, within the margin** -0.000759 [-0.000988, -0.000529] (one " \
           "family, k = 1, 95.0%, 3 seeds, paired by seed)" in text
    _, record = decide(capsys, tmp_path, [str(golf(tmp_path)), "--margin", "0.0072", "--unpaired"])
    c, = record["comparisons"]
    assert c["how"] == "unpaired (Welch)" and round(c["t"], 2) == -0.83 and round(c["p_one_sided"], 3) == 0.227
    assert c["outcome"] == "equal" and c["seeds"] is None


def test_the_qk_gain_rows_are_equal_not_a_trend(tmp_path, capsys):
    rows = [("gain5.5", s, v) for s, v in zip((42, 314, 999), GAIN55)] + \
        [("gain5.25", s, v) for s, v in zip((42, 314, 999), GAIN525)]
    text, record = decide(capsys, tmp_path, [str(csv(tmp_path / "gain.csv", rows)), "--margin", "bpb=0.0072"])
    c, = record["comparisons"]
    assert c["outcome"] == "equal" and c["difference"] == pytest.approx(-0.000405, abs=1e-6)
    assert c["ci"] == pytest.approx([-0.001466, 0.000656], abs=1e-6)
    assert "**equal** -0.000405 [-0.001466, +0.000656]" in text


def test_runs_that_cannot_be_compared_stop_in_one_line(tmp_path, capsys):
    rows = [("a", 1, 1.0), ("a", 1, 1.1), ("b", 1, 1.2)]
    line = stops(capsys, qk_decide.main, [str(csv(tmp_path / "dup.csv", rows))])
    assert line.startswith("error: condition 'a' seed 1 appears twice (") and "dup.csv row 2; " in line and \
        line.endswith("dup.csv row 3): nothing is averaged in silently. Fix: keep one run of each, or pass the "
                      "files of one step"), line
    rows = [("a", 1, 10, 1.0), ("a", 2, 20, 1.1), ("b", 1, 10, 1.2), ("b", 2, 10, 1.3)]
    line = stops(capsys, qk_decide.main, [str(csv(tmp_path / "steps.csv", rows, "condition,seed,step,bpb"))])
    assert line.startswith("error: the runs are at different steps (step 10: a/1, b/1, b/2; step 20: a/2)"), line
    assert stops(capsys, qk_decide.main, [str(golf(tmp_path)), "--baseline", "pr9"]).startswith(
        "error: condition 'pr9' is not in the files (they hold pr1925, pr1855)")
    assert stops(capsys, qk_decide.main, [str(golf(tmp_path)), "--margin", "-1"]).startswith("error: --margin '-1'")
    assert stops(capsys, qk_decide.main, [str(golf(tmp_path)), "--until_decided", "6"]) == \
        "error: --until_decided and --round plan looks into a design file: add --design FILE"


def test_missing_values_are_named_and_one_run_is_described(tmp_path, capsys):
    rows = [("a", 1, 1.0), ("a", 2, "nan"), ("a", 3, 1.2), ("b", 1, 1.1), ("b", 2, 1.0), ("b", 3, 1.4), ("b", 4, 1.5),
            ("c", 1, 2.0)]
    text, record = decide(capsys, tmp_path, [str(csv(tmp_path / "m.csv", rows)), "--baseline", "b"])
    ab, cb = record["comparisons"]
    assert ab["n"] == 2 and ab["seeds"] == [1, 3] and ab["unpaired_seeds"] == [2, 4] and ab["k"] == 1
    assert (cb["how"], cb["outcome"], cb["n"]) == ("described", "descriptive", 1)
    said = f"bpb: condition a seed 2 is missing ({tmp_path / 'm.csv'} row 3): left out of its pairs"
    assert record["left_out"] == [said] and f"- {said}" in text
    assert "- bpb, a \u2212 b: seed(s) 2, 4 in one condition only, left out of the pairs" in text


def test_conditions_that_share_no_seed_are_compared_unpaired_and_said_so(tmp_path, capsys):
    rows = [("a", 1, 1.0), ("a", 2, 1.1), ("a", 3, 1.2), ("b", 4, 2.0), ("b", 5, 2.1), ("b", 6, 2.2)]
    text, record = decide(capsys, tmp_path, [str(csv(tmp_path / "u.csv", rows))])
    c, = record["comparisons"]
    assert c["how"] == "unpaired (Welch)" and c["outcome"] == "different, beyond the margin"
    assert c["difference"] == pytest.approx(-1.0) and "unpaired (Welch))" in text


def test_primary_metrics_form_the_family_and_the_rest_are_exploratory(tmp_path, capsys):
    rows = [(c, s, 1.0 + 0.01 * s + (0.1 + 0.01 * s * s if c == "a" else 0), 5.0 + 0.02 * s * s) for c in "ab"
            for s in (1, 2, 3)]  # x: a - b spreads; loss: the same in both, no spread
    path = csv(tmp_path / "p.csv", rows, "condition,seed,x,loss")
    _, record = decide(capsys, tmp_path, [str(path)])
    assert {c["family"] for c in record["comparisons"]} == {"one family"} and record["comparisons"][0]["k"] == 1
    assert [c["ci_level"] for c in record["comparisons"]] == [pytest.approx(1 - 0.05)] + [None]  # loss: no spread
    text, record = decide(capsys, tmp_path, [str(path), "--primary", "x"])
    assert [c["family"] for c in record["comparisons"]] == ["primary", "exploratory: loss"]
    assert "## Exploratory: loss (k = 0)" in text
    assert "Exploratory families (one per metric, not stated above): 1" in text


def test_a_design_plans_looks_and_names_a_look_nobody_planned(tmp_path, capsys):
    def runs(n, name):
        rows = [(c, s, 1.0 + 0.001 * ((s * 7919) % 13) + (0.004 if c == "a" else 0)) for c in "ab" for s in range(n)]
        return str(csv(tmp_path / name, rows))
    design = tmp_path / "plans" / "decide_design.json"
    design.parent.mkdir()
    text, record = decide(capsys, tmp_path, [runs(3, "r3.csv"), "--until_decided", "7", "--round", "2",
                                             "--design", str(design)])
    plan = json.loads(design.read_text())
    check(DECIDE_DESIGN_FORMAT, plan)
    assert plan["first_seeds"] == [0, 1, 2] and [x["planned"] for x in plan["looks"]] == [True]
    assert "look 1 of a new design (seeds 3, planned looks at 3, 5, 7 seeds)" in text
    assert record["looks"][0]["alpha"] == pytest.approx(0.05 * 0.05)
    text, _ = decide(capsys, tmp_path, [runs(5, "r5.csv"), "--design", str(design)])
    assert "look 2 of the design, planned at 5 seeds" in text
    plan = json.loads(design.read_text())
    assert [len(x["seeds"]) for x in plan["looks"]] == [3, 5] and plan["looks"][1]["planned"]
    text, _ = decide(capsys, tmp_path, [runs(6, "r6.csv"), "--design", str(design)])
    assert "look 3 at 6 seeds is a look nobody planned (the next planned look is at 7 seeds): decided at the full " \
           "0.05" in text
    line = stops(capsys, qk_decide.main, [runs(6, "r6.csv"), "--design", str(design), "--margin", "1%"])
    assert line.startswith("error: margins is ['1%'], not the [] the design in") and "fixed at its first look" in line
    line = stops(capsys, qk_decide.main, [runs(2, "r2.csv"), "--design", str(design)])
    assert line.startswith("error: seed(s) 2, 3, 4, 5 of the last look are not in the runs now"), line
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "study.json").write_text("{}")
    line = stops(capsys, qk_decide.main, [runs(3, "r3.csv"), "--until_decided", "5", "--design",
                                          str(tmp_path / "run" / "d.json")])
    assert "belongs to a study whose study.json cannot be read" in line and not (tmp_path / "run" / "d.json").exists()


@pytest.mark.parametrize("kind", ["qk_norm", "conditions"])
def test_a_stored_study_is_decided_as_its_combined_json_holds(kind, tmp_path, capsys):
    folder, expected = unpack(kind, tmp_path)
    combined = json.loads(expected["combined.json"])
    _, record = decide(capsys, tmp_path, [str(folder)])
    got = {(c["metric"], f"{c['a']}-{c['b']}"): c for c in record["comparisons"]}
    want = {(q, pair): d for q, pairs in combined["decisions"].items() for pair, d in pairs.items()}
    assert sorted(got) == sorted(want)
    for key, d in want.items():
        c = got[key]
        assert (c["outcome"], c["n"], c["on"]) == (d["outcome"], d["n"], d["on"]), key
        assert c["difference"] == pytest.approx(d["difference"], rel=1e-12)
        assert c["ci"] == pytest.approx(d["ci"], rel=1e-12) and c["ci_level"] == pytest.approx(d["ci_level"])


def test_the_generic_rule_on_a_studys_runs_gives_the_studys_decision(tmp_path, capsys):
    """The conditions study decides each quantity as its own family against baseline QK: its run folders read as
    runs, one metric a call, give the same val_loss decisions through the generic path."""
    folder, expected = unpack("conditions", tmp_path)
    want = json.loads(expected["combined.json"])["decisions"]["val_loss"]
    runs = tmp_path / "runs"
    runs.mkdir()
    for cond in ("QK", "NoQK", "NoQK_clip"):
        (folder / cond).rename(runs / cond)
    _, record = decide(capsys, tmp_path, [str(runs), "--baseline", "QK", "--metric", "val_loss", "--margin",
                                          "0.5%"])
    got = {f"{c['a']}-{c['b']}": c for c in record["comparisons"]}
    assert sorted(got) == sorted(want)
    for pair, d in want.items():
        assert got[pair]["outcome"] == d["outcome"] and got[pair]["ci"] == pytest.approx(d["ci"], rel=1e-12)
        assert math.isclose(got[pair]["ci_level"], d["ci_level"])
