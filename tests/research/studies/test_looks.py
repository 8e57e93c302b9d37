"""Studies that add seeds until decided (research.studies.looks): the looks recorded, stopping, resume, the unplanned
look, and every refusal. The looks' loop runs on hand-built QK-norm results (tests/research/synthetic.py) written by a
stand-in trainer, so a study of several looks takes a second; one slow test trains the pilot through its script."""
import argparse
import json
import math

import numpy as np
import pytest

from configs import ConfigError
from research import (finetune_keys_study, head_specialization_study, qk_norm_25m_study, spike_warning_study,
                      split_panels)
from research.analysis.rules import DIFFERENT, LOSS_MARGIN, MARGIN, NO_DATA, Margin, Paired, decide_once
from research.analysis.sequential import FIRST_SHARE, RHO, family_record, plan, undecided
from research.results import ResultsError
from research.results.layout import condition_dir, write_study_index
from research.studies import PILOT
from research.studies.study_runs import StudyRun
from research.studies.kinds import KINDS
from research.studies.looks import Rounds, Until, check_until, run_looks
from research.studies.render import load_and_analyze
from research.studies.runner import run_study
from tests.helpers import STEP_TOKENS, stops
from tests.research.studies.test_runner import study_args
from tests.research.synthetic import qk_run

# (final PR, final loss, own noise) per condition: no difference and a wide spread never settle a size; differences
# of 10 PR and 0.5 nats with almost no spread are settled at the first look
OPEN = {"QK": (50.0, 3.5, 3.0), "QK_frozen": (50.0, 3.5, 3.0), "NoQK": (50.0, 3.5, 3.0)}
CLEAR = {"QK": (40.0, 3.0, 0.0), "QK_frozen": (50.0, 3.5, 0.0), "NoQK": (60.0, 4.0, 0.0)}


def rounds(out, finals, trained, stop_at=None, handed=None, **family):
    """A stand-in for a study: its runs of some seeds, a trainer that writes each run's results (keeping a finished
    run, as the trainer's resume does, and stopping as Ctrl-C would at seed `stop_at`), and its study.json. `handed`
    collects the seeds of each round's runs the loop did not call done."""
    def runs(seeds):
        return [StudyRun(c, s, None, condition_dir(out, c, s, len(seeds) > 1)) for s in seeds for c in finals]

    def train(round_runs, done):
        if handed is not None:
            handed.append(sorted({r.seed for r in round_runs if r.run_dir not in done}))
        for r in round_runs:
            path = r.run_dir / "results.json"
            if path.is_file():
                continue
            if stop_at is not None and r.seed >= stop_at:
                raise KeyboardInterrupt
            r.run_dir.mkdir(parents=True, exist_ok=True)
            pr, loss, noise = finals[r.cond]
            path.write_text(json.dumps(qk_run(r.cond, r.seed, pr, loss, own_noise=noise)))
            trained.append((r.cond, r.seed))

    given = {"margin": MARGIN, "loss_margin": LOSS_MARGIN, **family}  # `family`: a study file's settings changed

    def write_index(seeds, conditions, looks, design):
        write_study_index(out, name="qk_norm_50m_study", kind="qk_norm", seeds=seeds, preset="debug",
                          conditions=conditions, looks=looks, design=design, **given)
    return Rounds(runs, train, write_index, family_record(list(finals), **given))


def index(out):
    return json.loads((out / "study.json").read_text())


def test_an_open_question_adds_a_seed_per_round_to_max_each_look_at_its_planned_level(tmp_path):
    out, trained, lines, handed = tmp_path / "study", [], [], []
    looks = run_looks(out, [0, 1], Until(4, 1), rounds(out, OPEN, trained, handed=handed),
                      log=lambda s, **_: lines.append(s))
    assert handed == [[0, 1], [2], [3]]  # a round hands the executor its new runs alone
    # plan 2 -> 4 by 1: looks at 2, 3, 4 seeds; 0.05 x 0.05 = 0.0025, then 0.05 (0.05 + 0.95 (1/2)^0.7) - 0.0025 =
    # 0.0292397, the rest (0.0182603)
    assert [look.seeds for look in looks] == [(0, 1), (0, 1, 2), (0, 1, 2, 3)]
    by3 = 0.05 * (0.05 + 0.95 * 0.5 ** 0.7)
    assert [look.alpha for look in looks] == pytest.approx([0.0025, by3 - 0.0025, 0.05 - by3], abs=1e-15)
    recorded = index(out)
    assert recorded["looks"] == [{"seeds": list(look.seeds), "alpha": look.alpha, "planned": True} for look in looks]
    assert recorded["design"] == {"seeds": [0, 1], "max_seeds": 4, "round": 1, "alpha": 0.05, "first": FIRST_SHARE,
                                  "rho": RHO, "calibrated": True,
                                  "family": {"conditions": ["QK", "QK_frozen", "NoQK"], "baseline": None, "primary": [],
                                             "margin": MARGIN, "loss_margin": LOSS_MARGIN, "logit_margin": None,
                                             "kv_loss_margin": None}}
    assert recorded["seeds"] == [0, 1, 2, 3] and sorted(s for _, s in trained) == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert "the next round trains seed(s) 2" in lines[0] and "--until_decided 4 reached" in lines[-1]
    report = load_and_analyze(out).report
    assert "## Looks" in report and "| 2 | 0\u20132 (3) | 0.02924 | yes |" in report
    assert "Stopped at look 3 of at most 3 (4 seeds), the most seeds the design allows" in report


def test_a_question_decided_at_the_first_look_stops_there(tmp_path):
    out, trained, lines = tmp_path / "study", [], []
    looks = run_looks(out, [0, 1, 2], Until(5, 1), rounds(out, CLEAR, trained), log=lambda s, **_: lines.append(s))
    assert [look.seeds for look in looks] == [(0, 1, 2)] and len(trained) == 9
    assert looks[0].alpha == pytest.approx(0.05 * 0.05)  # the first look spends a twentieth of alpha
    assert lines == [f"look 1 of at most 3 (3 seeds: 0\u20132, alpha {looks[0].alpha:.5g}): every primary comparison "
                     f"is decided: stopping"]
    assert "Stopped at look 1 of at most 3 (3 seeds): every primary comparison is decided." in \
        load_and_analyze(out).report


@pytest.mark.parametrize("stop_at", [1, 3])  # inside the first look; between the second and the third
def test_a_study_killed_inside_or_between_looks_continues_with_each_look_recorded_once(tmp_path, stop_at):
    out, trained = tmp_path / "study", []
    with pytest.raises(KeyboardInterrupt):
        run_looks(out, [0, 1], Until(4, 1), rounds(out, OPEN, trained, stop_at=stop_at), log=lambda *a, **k: None)
    assert len(index(out)["looks"]) == (0 if stop_at == 1 else 2) and index(out)["design"]["max_seeds"] == 4
    before, handed = list(trained), []
    looks = run_looks(out, [0, 1], Until(4, 1), rounds(out, OPEN, trained, handed=handed), log=lambda *a, **k: None)
    # the command's first look hands every run of it (the executor checks and keeps the finished ones), then new ones
    assert handed == ([[0, 1], [2], [3]] if stop_at == 1 else [[0, 1, 2], [3]])
    assert [look.seeds for look in looks] == [(0, 1), (0, 1, 2), (0, 1, 2, 3)]
    assert [len(look["seeds"]) for look in index(out)["looks"]] == [2, 3, 4]
    assert not set(before) & set(trained[len(before):])  # no finished run trained again
    # the same command once more: nothing trained, no look added
    n = len(trained)
    run_looks(out, [0, 1], Until(4, 1), rounds(out, OPEN, trained), log=lambda *a, **k: None)
    assert len(trained) == n and len(index(out)["looks"]) == 3


def test_a_study_grown_by_hand_records_an_unplanned_look_and_states_the_bound_that_holds(tmp_path):
    out, trained = tmp_path / "study", []
    run_looks(out, [0, 1, 2], None, rounds(out, OPEN, trained))
    assert index(out)["looks"] == [{"seeds": [0, 1, 2], "alpha": 0.05, "planned": True}]
    assert "## Looks" not in load_and_analyze(out).report  # a fixed study's report, as it always was
    run_looks(out, [0, 1, 2, 3, 4], None, rounds(out, OPEN, trained))
    assert index(out)["looks"][1] == {"seeds": [0, 1, 2, 3, 4], "alpha": 0.05, "planned": False}
    report = load_and_analyze(out).report
    assert "The study was grown by hand" in report and "| 2 | 0\u20134 (5) | 0.05 | no |" in report
    assert "two looks at 5% each: the chance that some outcome of a family is wrong is at most 10%" in report


def test_a_command_that_does_not_continue_the_design_is_refused_before_anything_trains(tmp_path):
    out, trained = tmp_path / "study", []
    run_looks(out, [0, 1, 2], Until(3, 1), rounds(out, CLEAR, trained), log=lambda *a, **k: None)
    n = len(trained)
    for until, seeds, said in ((Until(5, 1), [0, 1, 2], "not --until_decided 5 --round 1 --seeds 0 1 2"),
                               (Until(4, 1), [0, 1, 2, 3], "not --until_decided 4 --round 1 --seeds 0 1 2 3"),
                               (None, [0, 1, 2, 3], "give those options to continue it")):
        with pytest.raises(ConfigError) as e:
            run_looks(out, seeds, until, rounds(out, CLEAR, trained))
        assert "holds a study planned with --until_decided 3 --round 1 --seeds 0 1 2 at its first command" \
               in str(e.value) and said in str(e.value)
    fixed = tmp_path / "fixed"
    run_looks(fixed, [0, 1, 2], None, rounds(fixed, CLEAR, trained))
    with pytest.raises(ConfigError, match="holds a study of fixed seeds \\(0\u20132\\): a sequential design is "
                                        "fixed at a study's first command"):
        run_looks(fixed, [0, 1, 2], Until(5, 1), rounds(fixed, CLEAR, trained))
    assert len(trained) == n + 9


# What defines the families and their outcomes, changed after look 1 (issue 65): each refused as a changed MAX is
@pytest.mark.parametrize("finals,family,said", [
    (OPEN, {"loss_margin": 0.05}, "fixed loss_margin 0.005 at its first command, not 0.05"),
    (OPEN, {"margin": 0.5}, "fixed margin 0.03 at its first command, not 0.5"),
    (OPEN, {"primary": ("val_loss",)}, "fixed primary none at its first command, not val_loss"),
    (OPEN, {"baseline": "QK"}, "fixed baseline none at its first command, not 'QK'"),
    (OPEN, {"kv_loss_margin": 0.01}, "fixed kv_loss_margin none at its first command, not 0.01"),
    ({"QK": OPEN["QK"], "NoQK": OPEN["NoQK"]}, {}, "fixed conditions QK QK_frozen NoQK at its first command, not QK "
                                                   "NoQK"),
])
@pytest.mark.parametrize("finished", [False, True])  # continued after look 1, or a finished study run again
def test_a_change_of_what_defines_the_families_after_look_1_is_refused(tmp_path, finals, family, said, finished):
    out, trained = tmp_path / "study", []
    with pytest.raises(KeyboardInterrupt):  # killed in round 2: look 1 recorded, undecided
        run_looks(out, [0, 1], Until(4, 1), rounds(out, OPEN, trained, stop_at=2), log=lambda *a, **k: None)
    if finished:
        run_looks(out, [0, 1], Until(4, 1), rounds(out, OPEN, trained), log=lambda *a, **k: None)
    before, n = (out / "study.json").read_bytes(), len(trained)
    with pytest.raises(ConfigError) as e:
        run_looks(out, [0, 1], Until(4, 1), rounds(out, finals, trained, **family), log=lambda *a, **k: None)
    assert f"the study's design {said}" in str(e.value) and "\n" not in str(e.value)
    assert "again to continue it" in str(e.value)
    assert (out / "study.json").read_bytes() == before and len(trained) == n


def test_a_redraw_at_other_margins_of_a_planned_study_is_refused_and_writes_nothing(tmp_path, capsys):
    out, trained = tmp_path / "study", []
    run_looks(out, [0, 1], Until(3, 1), rounds(out, OPEN, trained), log=lambda *a, **k: None)
    assert load_and_analyze(out, margin=MARGIN).report  # the design's own margin: drawn
    line = stops(capsys, split_panels.main, [str(out), "--loss_margin", "0.05", "--out", str(tmp_path / "redraw")])
    assert line == (f"error: --loss_margin 0.05: {out} holds a study whose design fixed loss_margin 0.005 at its "
                    f"first command, and its outcomes are read against that alone: leave --loss_margin out to draw it "
                    f"(nothing was written)")
    assert not (tmp_path / "redraw").exists()


def test_a_comparison_with_no_paired_values_is_undecided():
    family = {"x": Paired(np.zeros(0), math.nan, math.nan, math.nan, ()),
              "y": Paired(np.array([1.0, 1.1, 0.9]), 1.0, 0.0, 1.0, (0, 1, 2))}
    decisions = decide_once(family, Margin(0.1, absolute=True))
    assert decisions["x"].outcome == NO_DATA and decisions["y"].outcome == DIFFERENT
    assert undecided(decisions) == ["x"]


def _edit(out, change):
    """study.json with `change(index)` applied, as a hand edit would leave it; returns the text written."""
    index = json.loads((out / "study.json").read_text())
    change(index)
    text = json.dumps(index, indent=2)
    (out / "study.json").write_text(text)
    return text


def _set_alpha(i):
    i["looks"][0]["alpha"] = 0.5


def _drop_last_look(i):
    i["looks"].pop()


def _drop_first_look(i):
    i["looks"].pop(0)


def _wider_margin(i):
    i["loss_margin"] = 0.05


def _extra_look(i):
    i["looks"].append({"seeds": [0, 1, 2, 3], "alpha": 0.05, "planned": True})


def _unplanned(i):
    i["looks"][1]["planned"] = False


# study.json's looks against its design's plan and its runs: every edit refused on a redraw and on a rerun
@pytest.mark.parametrize("change,said", [
    (_set_alpha, "look 1 (seeds 0 1, alpha 0.5, planned true) is not its design's (seeds 0 1, alpha 0.0025, "
                 "planned)"),
    (_drop_last_look, "seeds 0 1 2 are not its last look's (0 1)"),
    (_drop_first_look, "look 1 (seeds 0 1 2, alpha 0.0475, planned true) is not its design's (seeds 0 1, alpha "
                       "0.0025, planned)"),
    (_unplanned, "look 2 (seeds 0 1 2, alpha 0.0475, planned false) is not its design's"),
    (_extra_look, "3 looks recorded, more than the 2 its design plans"),
    (_wider_margin, "loss_margin is 0.05, not the 0.005 its design fixed at the study's first command"),
])
def test_an_edited_study_json_is_refused_as_edited_on_a_redraw_and_a_rerun(tmp_path, capsys, change, said):
    out, trained = tmp_path / "study", []
    run_looks(out, [0, 1], Until(3, 1), rounds(out, OPEN, trained), log=lambda *a, **k: None)
    text, n = _edit(out, change), len(trained)
    fix = ("the file was edited or damaged; fix: restore study.json from a copy, or run the study again into another "
           "--out (its runs stay in their folders)")
    line = stops(capsys, split_panels.main, [str(out)])
    assert said in line and line.endswith(fix), line
    with pytest.raises(ResultsError) as e:
        run_looks(out, [0, 1], Until(3, 1), rounds(out, OPEN, trained), log=lambda *a, **k: None)
    assert said in str(e.value) and "\n" not in str(e.value)
    assert (out / "study.json").read_text() == text and len(trained) == n


def test_a_look_of_a_fixed_study_at_another_alpha_or_a_missing_run_is_refused(tmp_path, capsys):
    out, trained = tmp_path / "fixed", []
    run_looks(out, [0, 1, 2], None, rounds(out, CLEAR, trained))
    _edit(out, lambda i: i["looks"][0].update(alpha=0.5))
    assert "look 1 (alpha 0.5, planned true) is not a look of a study without a design (the first planned, every " \
           "look at alpha 0.05)" in stops(capsys, split_panels.main, [str(out)])
    _edit(out, lambda i: i["looks"][0].update(alpha=0.05))
    (out / "NoQK" / "seed_2" / "results.json").unlink()
    assert "condition NoQK has no results file of seed(s) 2 of its last look" in \
        stops(capsys, split_panels.main, [str(out)])


def test_a_design_whose_max_is_below_its_seeds_is_one_line(tmp_path, capsys):
    out, trained = tmp_path / "study", []
    run_looks(out, [0, 1, 2], Until(4, 1), rounds(out, CLEAR, trained), log=lambda *a, **k: None)
    text = _edit(out, lambda i: i["design"].update(max_seeds=2))
    said = ("design: --until_decided 2 --round 1 over 3 first seeds plans no looks (a MAX of at least the seeds, a "
            "first look of 2 or more): the file was edited or damaged")
    assert said in stops(capsys, split_panels.main, [str(out)])
    with pytest.raises(ResultsError, match="plans no looks"):
        run_looks(out, [0, 1, 2], Until(4, 1), rounds(out, CLEAR, trained))
    assert (out / "study.json").read_text() == text


def _args(until=None, round_=None):
    return argparse.Namespace(until_decided=until, round=round_)


@pytest.mark.parametrize("args,kind,seeds,primary,said", [
    (_args(3), "qk_norm", [0, 1, 2, 3], (), "--until_decided 3 is below the 4 seeds given (--seeds 0 1 2 3): give a "
                                            "MAX of at least 4, or fewer --seeds (nothing was trained)"),
    (_args(8, 0), "qk_norm", [0, 1], (), "--round 0: give 1 or more seeds per round (nothing was trained)"),
    (_args(8, -2), "qk_norm", [0, 1], (), "--round -2: give 1 or more seeds per round"),
    (_args(8), "qk_norm", [0], (), "--until_decided needs at least 2 --seeds at its first look"),
    (_args(None, 2), "qk_norm", [0, 1], (), "--round 2 sets the seeds each round of --until_decided adds: add "
                                            "--until_decided MAX, or leave --round out"),
    (_args(8), "heads", [0, 1], (), "--until_decided: s: a study of kind heads names no primary comparison to "
                                    "decide; leave --until_decided out to train the --seeds alone"),
    (_args(8), "spikes", [0, 1], (), "--until_decided: s: its seeds are split into calibration"),
    (_args(8), "conditions", [0, 1], (), "--until_decided: s names no primary quantities to decide: add `primary: "
                                         "[...]` to the study file"),
    # the seeds a later look adds follow the largest given: one past 2**63 - 1 failed after look 1 (issue 65)
    (_args(8), "qk_norm", [0, 2 ** 63 - 5], (), f"--until_decided 8 would add seeds up to {2 ** 63 + 1}, past the "
                                                f"largest a run takes ({2 ** 63 - 1}, 2**63 - 1): give --seeds below "
                                                f"{2 ** 63 - 6}, or a smaller MAX (nothing was trained)"),
])
def test_each_refusal_is_one_line_naming_the_fix(args, kind, seeds, primary, said):
    with pytest.raises(ConfigError) as e:
        check_until(args, KINDS[kind], seeds, "s", primary)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_the_options_pass_where_they_fit():
    assert check_until(_args(), KINDS["qk_norm"], [0], "s") is None
    assert check_until(_args(8), KINDS["qk_norm"], [0, 1, 2, 3], "s") == Until(8, 2)
    assert check_until(_args(4, 1), KINDS["conditions"], [0, 1], "s", ("val_loss",)) == Until(4, 1)
    assert check_until(_args(8), KINDS["qk_norm"], [0, 2 ** 63 - 7], "s") == Until(8, 2)  # its last seed: 2**63 - 1


@pytest.mark.parametrize("main,argv,said", [
    (qk_norm_25m_study.main, ["--until_decided", "3"], "--until_decided 3 is below the 4 seeds given"),
    (qk_norm_25m_study.main, ["--until_decided", "8", "--round", "0"], "--round 0: give 1 or more seeds per round"),
    (head_specialization_study.main, ["--until_decided", "8"], "a study of kind heads names no primary comparison"),
    (spike_warning_study.main, ["--until_decided", "14"], "its seeds are split into calibration"),
    (finetune_keys_study.main, ["--until_decided", "2"], "--until_decided 2 is below the 3 seeds given"),
    (qk_norm_25m_study.main, ["--seeds", "0", str(2 ** 63 - 2), "--until_decided", "4"],
     f"--until_decided 4 would add seeds up to {2 ** 63}, past the largest a run takes"),
])
def test_the_study_scripts_refuse_before_anything_is_written(capsys, tmp_path, main, argv, said):
    line = stops(capsys, main, [*argv, "--out", str(tmp_path / "out")])
    assert said in line and not (tmp_path / "out").exists()


def test_plan_prints_the_rounds_and_their_worst_case(capsys, tmp_path):
    qk_norm_25m_study.main(["--preset", "debug", "--until_decided", "8", "--plan", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert ("until decided: looks at 4, 6, 8 seeds; round 1 trains 12 runs (4 seed(s)); round 2 trains 6 runs (2 "
            "seed(s)); round 3 trains 6 runs (2 seed(s)). Worst case (every round trained): 24 runs, 2.0 times the "
            "first round's wall time") in out
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_the_pilot_adds_seeds_until_decided_through_its_script(corpus_file, cache_dir, tmp_path, capsys):
    # margins too narrow to settle at two seeds: a second round trains seed 2, and the study stops at MAX
    out = tmp_path / "pilot"
    run_study(PILOT, study_args(corpus_file, cache_dir, out, 2 * STEP_TOKENS, "--seeds", "0", "1", "--margin", "1e-6",
                                "--loss_margin", "1e-6", "--until_decided", "3", "--round", "1"))
    log = capsys.readouterr().out
    looks, design = index(out)["looks"], plan(2, 3, 1)
    assert [look["seeds"] for look in looks] == [[0, 1], [0, 1, 2]] and index(out)["seeds"] == [0, 1, 2]
    assert [look["alpha"] for look in looks] == pytest.approx(design.levels, abs=1e-15)  # 0.05 x 0.05, the rest
    assert "look 1 of at most 2 (2 seeds: 0 1, alpha 0.0025): undecided: " in log
    assert "the next round trains seed(s) 2" in log and "== qk_norm (seed 2) -> " in log
    assert "Stopped at look 2 of at most 2 (3 seeds)" in (out / "report.md").read_text()
    family = index(out)["design"]["family"]
    assert (family["conditions"], family["margin"], family["loss_margin"]) == (["qk_norm", "no_qk_norm"], 1e-6, 1e-6)
    before = (out / "study.json").read_bytes()  # the finished study run again with a wider loss margin: refused
    with pytest.raises(ConfigError, match="the study's design fixed loss_margin 1e-06 at its first command, "
                                          "not 0.01"):
        run_study(PILOT, study_args(corpus_file, cache_dir, out, 2 * STEP_TOKENS, "--seeds", "0", "1", "--margin",
                                    "1e-6", "--loss_margin", "0.01", "--until_decided", "3", "--round", "1"))
    assert (out / "study.json").read_bytes() == before


@pytest.mark.slow
def test_the_fine_tuning_study_adds_seeds_in_rounds_and_its_rerun_trains_nothing(tmp_path, capsys):
    from tests.research.inspection.builders import make_hf_model
    model, out = make_hf_model("qwen3", tmp_path / "qwen3"), tmp_path / "study"
    argv = ["--model", str(model), "--out", str(out), "--tokens", "256", "--batch_size", "2", "--seq_len", "16",
            "--seeds", "0", "1", "--no_progress", "--margin", "1e-6", "--loss_margin", "1e-6", "--until_decided", "3",
            "--round", "1"]
    assert finetune_keys_study.main(argv) == 0
    assert [look["seeds"] for look in index(out)["looks"]] == [[0, 1], [0, 1, 2]]
    assert all((out / c / "seed_2" / "results.json").is_file() for c in ("gains_trained", "gains_frozen"))
    capsys.readouterr()
    assert finetune_keys_study.main(argv) == 0
    log = capsys.readouterr().out
    assert log.count("finished earlier, kept") == 6 and len(index(out)["looks"]) == 2
