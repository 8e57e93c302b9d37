"""Identity before statistics (research.analysis.identity): runs are paired by seed, never by position, and
compared at one budget of one recipe; what is set aside is said. Study folders are laid out as a user has them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from research import split_panels
from research.analysis.identity import compare, hosts_mixed
from research.analysis.rules import by_seed
from research.analysis.series import seed_mean
from research.results import ResultsError
from research.results.layout import write_study_index
from research.results.schema import cut_at_tokens, validate
from research.results.vocabulary import QK_CONDITIONS
from tests.helpers import stops
from utils.hosts import host_kind, same_paths


def run(tag: str, seed: int | None, pr: list[float], *, step_tokens: int = 125_000, precision: str = "fp32",
        **extra) -> dict:
    """A results dict with the write-ups' fields: one probe per `step_tokens`, key PR `pr`, losses that fall."""
    n = len(pr)
    res = {"tag": tag, "tokens": [i * step_tokens for i in range(n)], "loss": [None] + [4.0 - 0.1 * i for i in
                                                                                       range(1, n)],
           "val_loss": [None] + [4.1 - 0.1 * i for i in range(1, n)], "mean_pr": list(pr),
           "layer_pr": {"0": list(pr), "1": list(pr)}, "gamma_cv": {}, "gamma_final": {},
           "provenance": {"train_precision": precision}, **extra}
    if seed is not None:
        res["seed"] = seed
    return validate(res)


def own(seed: int, cond: str) -> float:
    """A condition's own part of a seed's value: -0.01, 0 or +0.01, summing to 0 over any three seeds in a row and
    different per condition, so per-seed differences between conditions spread (by at most 0.02) around 0."""
    return 0.01 * ((seed + QK_CONDITIONS.index(cond)) % 3 - 1)


def write(folder: Path, runs: dict[str, dict]) -> Path:
    """{relative folder: results dict} as <folder>/<relative folder>/results.json."""
    for where, res in runs.items():
        (folder / where).mkdir(parents=True, exist_ok=True)
        (folder / where / "results.json").write_text(json.dumps(res))
    return folder


def redraw(folder: Path) -> str:
    """The report split_panels.py draws from the folder."""
    split_panels.main([str(folder)])
    return (folder / "report.md").read_text()


def test_by_seed_leaves_out_a_run_without_a_seed():
    runs = [{"seed": 3, "v": 1.0}, {"v": 2.0}, {"config": {"train": {"seed": 5}}, "v": 3.0}]
    assert by_seed(runs, lambda r: r["v"]) == {3: 1.0, 5: 3.0}


def test_files_without_a_seed_are_paired_by_their_seed_folder_not_by_position(tmp_path):
    """QK in seed_1..seed_4, the others in seed_2..seed_5, no `seed` in any file, every condition identical
    within a seed (final PR 40 + 2 * seed): paired by position, A - B would read -2 / 45 = -4.4% at every
    position, beyond the 3% margin, and the verdict "the gain drives key PR". Paired by folder seed (2, 3, 4)
    every difference is 0 give or take 0.02 (own: a spread summing to 0 over seeds 2, 3, 4, since differences with
    no spread at all would read "no spread", not decided)."""
    def pr(seed, c):
        return [60.0, 50.0, 40.0 + 2 * seed + own(seed, c)]
    layout = {f"QK/seed_{s}": run("QK", None, pr(s, "QK")) for s in (1, 2, 3, 4)}
    layout |= {f"{c}/seed_{s}": run(c, None, pr(s, c)) for c in ("QK_frozen", "NoQK") for s in (2, 3, 4, 5)}
    report = redraw(write(tmp_path / "study", layout))
    assert "**the gain drives" not in report
    assert "**neither: QK-norm changes key PR by less than the margin" in report
    assert ("Runs: QK (seeds 1, 2, 3, 4); QK_frozen (seeds 2, 3, 4, 5); NoQK (seeds 2, 3, 4, 5); paired by seed"
            in report)
    assert "| A − B | 3 | +0.00 |" in report  # the three seeds both ran, each difference 0


def test_runs_with_no_seed_anywhere_are_not_paired_and_the_report_says_why(tmp_path):
    layout = {c: run(c, None, [60.0, 50.0, pr]) for c, pr in zip(QK_CONDITIONS, (40.0, 45.0, 50.0))}
    report = redraw(write(tmp_path / "study", layout))
    assert "none has a seed, so none is paired" in report
    assert "runs without a seed (no `seed` in the file, not in a seed_<n> folder): QK 1, QK_frozen 1, NoQK 1" in report
    assert "| A − B | 0 | n/a |" in report and "no paired values" in report
    assert "descriptive (one seed)" not in report  # the old positional pairing read a difference of -5.0 here


def test_a_longer_run_is_compared_at_the_budget_every_run_reached(tmp_path):
    """QK trained to 2M tokens, the others to 1M; every condition's PR is the same curve, falling 2 per 125k
    tokens. Its last probe would put QK 16 below the others (the gain "driving" key PR); at 1M tokens, the
    last probe all runs share, all three are equal."""
    def curve(n_probes, seed, c):
        return [60.0 - 2 * i + 0.3 * seed + own(seed, c) for i in range(n_probes)]
    layout = {f"QK/seed_{s}": run("QK", s, curve(17, s, "QK")) for s in (0, 1, 2)}
    layout |= {f"{c}/seed_{s}": run(c, s, curve(9, s, c)) for c in ("QK_frozen", "NoQK") for s in (0, 1, 2)}
    report = redraw(write(tmp_path / "study", layout))
    assert "**the gain drives" not in report and "**neither" in report
    assert "final values at 1,000,000 tokens" in report
    assert ("QK (seeds 0, 1, 2) trained to 2,000,000 tokens: every final value is taken at 1,000,000 tokens, the "
            "last probe all runs reached; their later probes are not compared") in report


def test_a_run_trained_in_another_precision_is_set_aside_and_named(tmp_path):
    layout = {f"{c}/seed_{s}": run(c, s, [60.0, 50.0, 40.0 + s], precision="bf16" if (c, s) == ("QK", 2) else "fp32")
              for c in QK_CONDITIONS for s in (0, 1, 2)}
    report = redraw(write(tmp_path / "study", layout))
    assert ("QK (seed 2): bf16 — a different training precision from the other runs (fp32): not compared"
            in report)
    assert "Runs: QK (seeds 0, 1); QK_frozen (seeds 0, 1, 2); NoQK (seeds 0, 1, 2)" in report
    assert "| A − B | 2 |" in report and "| B − C | 3 |" in report


def test_a_study_split_evenly_between_two_recipes_is_refused():
    runs = {"QK": [run("QK", 0, [60.0, 40.0], precision="fp32")], "NoQK": [run("NoQK", 0, [60.0, 40.0],
                                                                              precision="bf16")]}
    with pytest.raises(ResultsError, match=r"differ in training precision, as many runs one way as the other "
                                           r"\(fp32: QK \(seed 0\); bf16: NoQK \(seed 0\)\)"):
        compare(runs)


EPYC = {"cpu": "AMD EPYC", "cpu_native_bf16": True, "cpu_bf16": "AVX512-BF16", "host_kind": "AMD EPYC (AVX512-BF16)"}
XEON = {"cpu": "Intel Xeon", "cpu_native_bf16": True, "cpu_bf16": "AMX", "host_kind": "Intel Xeon (AMX)"}


def hosts_layout(host) -> dict:
    """Three conditions at seeds 0-2, trained in bf16, each run's provenance on host(c, s)."""
    return {f"{c}/seed_{s}": run(c, s, [60.0, 50.0, 40.0 + s + own(s, c)],
                                 provenance={"train_precision": "bf16", **host(c, s)})
            for c in QK_CONDITIONS for s in (0, 1, 2)}


def test_a_run_trained_on_another_host_kind_is_set_aside_and_named(tmp_path):
    """Two runs' provenance differs only in the CPU kind: bf16 numerics differ between them, so one is not compared."""
    report = redraw(write(tmp_path / "study", hosts_layout(lambda c, s: XEON if (c, s) == ("QK", 2) else EPYC)))
    assert ("QK (seed 2): Intel Xeon (AMX) \u2014 a different host kind from the other runs (AMD EPYC (AVX512-BF16)): "
            "not compared (bf16 numerics differ between host kinds; the study's command run again with --mix_hosts "
            "combines them") in report
    assert ("Runs: QK (seeds 0, 1); QK_frozen (seeds 0, 1, 2); NoQK (seeds 0, 1, 2); paired by seed; final values at "
            "250,000 tokens; training precision bf16, host kind AMD EPYC (AVX512-BF16).") in report
    assert "| A − B | 2 |" in report and "| B − C | 3 |" in report


def test_a_study_made_with_mix_hosts_combines_its_host_kinds_and_says_how_many(tmp_path):
    folder = write(tmp_path / "study", hosts_layout(lambda c, s: XEON if s == 2 else EPYC))
    conditions = {c: [f"{c}/seed_{s}/results.json" for s in (0, 1, 2)] for c in QK_CONDITIONS}
    index = {"name": "qk_norm_50m_study", "kind": "qk_norm", "seeds": [0, 1, 2], "preset": "tiny",
             "conditions": conditions, "margin": 0.03, "loss_margin": 0.005}
    write_study_index(folder, **index)
    assert "not compared (bf16 numerics differ" in redraw(folder)  # seed 2 of every condition set aside
    write_study_index(folder, **index, mix_hosts=True)
    report = redraw(folder)
    assert "Set aside" not in report and "| A − B | 3 |" in report
    assert ("; training precision bf16; trained on 2 host kinds (AMD EPYC (AVX512-BF16): QK (seeds 0, 1), QK_frozen "
            "(seeds 0, 1), NoQK (seeds 0, 1); Intel Xeon (AMX): QK (seed 2), QK_frozen (seed 2), NoQK (seed 2)), "
            "combined: the study was made with --mix_hosts.") in report


def test_a_study_split_evenly_between_two_host_kinds_is_refused_naming_mix_hosts():
    runs = {"QK": [run("QK", 0, [60.0, 40.0], provenance=EPYC)], "NoQK": [run("NoQK", 0, [60.0, 40.0],
                                                                           provenance=XEON)]}
    with pytest.raises(ResultsError, match=r"differ in host kind, as many runs one way as the other .*--mix_hosts"):
        compare(runs)
    with hosts_mixed(True):
        assert "trained on 2 host kinds" in compare(runs).compared


def test_older_files_read_their_host_kind_from_cpu_and_native_bf16_as_before():
    """Files written before the host kind was recorded: `cpu` and `cpu_native_bf16` (or nothing at all)."""
    old = {"cpu": "AMD EPYC", "cpu_native_bf16": True}
    runs = {c: [run(c, s, [60.0, 40.0 + s], provenance=old if s < 2 else EPYC) for s in (0, 1, 2)]
            for c in ("QK", "NoQK")}
    c = compare(runs)  # older runs of the same CPU model with native bf16 take the newer runs' path: one kind
    assert c.set_aside == () and c.compared.endswith("host kind AMD EPYC (AVX512-BF16).")
    avx2 = {"cpu": "AMD EPYC", "cpu_native_bf16": False}
    runs["NoQK"][0] = run("NoQK", 0, [60.0, 40.0], provenance=avx2)
    assert "NoQK (seed 0): AMD EPYC (no native bf16) \u2014 a different host kind" in compare(runs).set_aside[0]
    bare = {c: [run(c, s, [60.0, 40.0 + s]) for s in (0, 1)] for c in ("QK", "NoQK")}  # no host recorded
    assert compare(bare).set_aside == () and "host kind" not in compare(bare).compared
    assert host_kind({"gpu": "NVIDIA H200", "device": "cuda:0", "cpu": "AMD EPYC"}) == "NVIDIA H200"
    old = host_kind({"cpu": "X", "cpu_native_bf16": True})
    assert old == "X (native bf16, path not recorded)"
    assert same_paths([old, "X (AMX)", "X (AVX512-BF16)"])[0] == old  # which: unknown
    assert same_paths([old, "Y (AMX)"]) == [old, "Y (AMX)"]  # another model's path says nothing of X's


def test_runs_that_share_no_probe_after_the_first_are_refused():
    runs = {"QK": [run("QK", 0, [60.0, 50.0, 40.0], step_tokens=100)],
            "NoQK": [run("NoQK", 0, [60.0, 50.0, 40.0], step_tokens=150)]}
    with pytest.raises(ResultsError, match="share no probe after their first"):
        compare(runs)


def test_different_probe_grids_that_end_together_are_noted():
    runs = {"QK": [run("QK", 0, [60.0, 50.0, 45.0, 40.0], step_tokens=100)],
            "NoQK": [run("NoQK", 0, [60.0, 40.0], step_tokens=300)]}
    c = compare(runs)
    assert c.budget == 300 and c.runs["QK"][0] is runs["QK"][0]
    assert c.set_aside == ("the runs were probed at different token counts: trajectories are compared only where "
                           "they share probes",)


def on_grid(tag: str, seed: int, tokens: list[int], pr: list[float], **extra) -> dict:
    res = run(tag, seed, pr, **extra)
    return validate(res | {"tokens": tokens})


def test_probes_not_in_every_run_of_a_condition_are_named():
    """Seed 0 probed at 100k, 200k, 500k tokens, seed 1 at 100k, 300k, 500k: the curves average the seeds at
    100k and 500k, and the report names 200k and 300k and which seed lacks which."""
    runs = {"QK": [on_grid("QK", 0, [100_000, 200_000, 500_000], [80.0, 60.0, 50.0]),
                   on_grid("QK", 1, [100_000, 300_000, 500_000], [70.0, 58.0, 40.0])],
            "NoQK": [on_grid("NoQK", s, [100_000, 200_000, 500_000], [80.0, 60.0, 50.0]) for s in (0, 1)]}
    c = compare(runs)
    assert c.budget == 500_000
    tokens, pr = seed_mean(c.runs["QK"], lambda r: r["mean_pr"])  # (80 + 70) / 2, (50 + 40) / 2
    assert list(tokens) == [100_000, 500_000] and list(pr) == [75.0, 45.0]  # by position: 75, 59, 45
    assert c.set_aside == ("QK: the probes at 200,000 and 300,000 tokens are not in every run (seed 0 has no "
                           "probe at 300,000 tokens; seed 1 has no probe at 200,000 tokens): its curves average the "
                           "seeds at the 2 token counts all of them share",)


def test_many_probes_left_out_are_counted_and_runs_past_the_budget_still_noted():
    """Seed 0 probed every 100k tokens to 1M (11 probes), seed 1 at 0, 500k and 1M, seed 2 every 100k to 1.5M:
    seed 2 is cut at 1M, then 8 token counts (100k..400k, 600k..900k) are not in seed 1's run."""
    every = [i * 100_000 for i in range(11)]
    runs = {"QK": [on_grid("QK", 0, every, [50.0] * 11), on_grid("QK", 1, [0, 500_000, 1_000_000], [50.0] * 3),
                   on_grid("QK", 2, [i * 100_000 for i in range(16)], [50.0] * 16)]}
    c = compare(runs)
    assert c.budget == 1_000_000 and len(c.set_aside) == 2
    assert c.set_aside[1] == ("QK: the probes at 8 token counts (100,000, 200,000, 300,000, ...) are not in every "
                              "run (seed 1 has none of them): its curves average the seeds at the 3 token counts "
                              "all of them share")
    five = [on_grid("QK", s, [0, 500], [50.0] * 2) for s in range(1, 6)]  # five seeds lack all four: three named
    (note,) = compare({"QK": [on_grid("QK", 0, [0, 100, 200, 300, 400, 500], [50.0] * 6), *five]}).set_aside
    assert note == ("QK: the probes at 100, 200, 300 and 400 tokens are not in every run (seed 1 has none of them; "
                    "seed 2 has none of them; seed 3 has none of them; 2 more runs lack some of them): its curves "
                    "average the seeds at the 2 token counts all of them share")


def test_the_report_names_the_probes_its_curves_leave_out(tmp_path):
    layout = {f"{c}/seed_{s}": on_grid(c, s, [0, 250_000, 500_000] if (c, s) == ("QK", 1) else [0, 125_000, 500_000],
                                       [60.0, 50.0, 40.0 + s]) for c in QK_CONDITIONS for s in (0, 1, 2)}
    report = redraw(write(tmp_path / "study", layout))
    assert ("- QK: the probes at 125,000 and 250,000 tokens are not in every run (seed 0 has no probe at 250,000 "
            "tokens; seed 1 has no probe at 125,000 tokens; seed 2 has no probe at 250,000 tokens): its curves "
            "average the seeds at the 2 token counts all of them share") in report


def test_a_diverged_run_neither_sets_nor_meets_the_budget():
    """The learning-rate study: a run that diverged at its third probe ends there, and that is its result."""
    ok = run("QK", 0, [60.0, 50.0, 45.0, 40.0])
    diverged = run("QK", 0, [60.0, 50.0], diverged={"step": 7})
    c = compare({"QK@1": [ok], "QK@8": [diverged]}, divergence_is_a_result=True)
    assert c.budget == 375_000 and c.runs["QK@1"][0] is ok and c.runs["QK@8"][0] is diverged and not c.set_aside


def test_a_diverged_run_is_set_aside_and_named_in_what_was_compared(tmp_path):
    """Not in the learning-rate grid: NoQK seed 2 diverged at step 120, its last probe at 125,000 tokens (2 probes
    of 125,000), while every other run reached 375,000 (4 probes). Its last PR is not at the budget the others are
    compared at, so it is set aside, and the report says so; NoQK keeps seeds 0 and 1."""
    layout = {f"{c}/seed_{s}": run(c, s, [60.0, 50.0, 45.0, 40.0 + s]) for c in QK_CONDITIONS for s in (0, 1, 2)}
    layout["NoQK/seed_2"] = run("NoQK", 2, [60.0, 50.0], diverged={"step": 120})
    note = ("NoQK (seed 2) diverged at step 120 (its loss became non-finite), its last probe at 125,000 tokens: set "
            "aside, since it never reached the budget the other runs are compared at; NoQK is compared on its other "
            "seeds, and no comparison counts that it diverged")
    c = compare({cond: [layout[f"{cond}/seed_{s}"] for s in (0, 1, 2)] for cond in QK_CONDITIONS})
    assert c.set_aside == (note,) and c.budget == 375_000 and [r["seed"] for r in c.runs["NoQK"]] == [0, 1]
    report = redraw(write(tmp_path / "study", layout))
    assert f"- {note}" in report
    assert "Runs: QK (seeds 0, 1, 2); QK_frozen (seeds 0, 1, 2); NoQK (seeds 0, 1); paired by seed" in report
    alone = compare({"QK": [layout["QK/seed_2"]], "NoQK": [layout["NoQK/seed_2"]]})
    assert list(alone.runs) == ["QK"] and alone.set_aside[0].endswith("budget the other runs are compared at; no run "
                                                                      "of NoQK is left to compare")
    with pytest.raises(ResultsError, match="every run of this study diverged"):
        compare({"NoQK": [layout["NoQK/seed_2"]]})


def test_a_run_whose_last_values_are_not_finite_is_named():
    """QK seed 0's validation loss and key norm became NaN (null) at its last probe, after finite values at probes 1
    and 2: it keeps its other values, and the report says which it lacks."""
    layers = [{"layer": 0, "means": {"k_norm.norm_mean": v, "k_norm.pr_sv": 40.0}} for v in (8.0, 9.0, None)]
    probes = [{"step": i, "tokens": i * 125_000, "layers": [layer]} for i, layer in enumerate(layers)]
    bad = run("QK", 0, [60.0, 50.0, 40.0], probes=probes)
    bad["val_loss"][-1] = None  # [None, 4.0, None]: step 0 has none by design, the last lost its value
    c = compare({"QK": [bad, run("QK", 1, [60.0, 50.0, 40.0])], "NoQK": [run("NoQK", s, [60.0, 50.0, 40.0])
                                                                          for s in (0, 1)]})
    assert c.set_aside == ("QK (seed 0): its last probe at 250,000 tokens holds no finite val_loss, k_norm.norm_mean "
                           "(NaN or infinity, written as null), which its earlier probes had: it has no final value "
                           "of them to compare",)
    assert c.runs["QK"][0] is bad


def test_two_runs_of_one_seed_in_a_condition_are_refused(tmp_path, capsys):
    """Two NoQK runs in seed_1 folders, neither file naming its seed: paired by seed, one would replace the other in
    by_seed's {seed: value}. Refused as the folder is read, naming both files; and by compare, for runs that reach
    it otherwise."""
    folder = write(tmp_path / "study", {f"{c}/{sub}seed_1": run(c, None, [60.0, 50.0]) for c, sub in
                                        (("QK", ""), ("NoQK", ""), ("NoQK", "old/"))})
    (folder / "study.json").write_text(json.dumps({"kind": "conditions", "conditions": {
        "QK": ["QK/seed_1/results.json"], "NoQK": ["NoQK/seed_1/results.json", "NoQK/old/seed_1/results.json"]}}))
    assert stops(capsys, split_panels.main, [str(folder)]) == (
        f"error: {folder / 'NoQK/old/seed_1/results.json'}: seed: seed 1 again ({folder / 'NoQK/seed_1/results.json'} "
        f"is seed 1 of NoQK too): the seed would count twice; fix: remove one of the two runs (and its study.json "
        f"entry)")
    with pytest.raises(ResultsError, match=r"^NoQK holds 2 runs of seed 1: paired by seed, one would stand for the "
                                           r"other unsaid; fix: remove all but one of them"):
        compare({"QK": [run("QK", 1, [60.0, 50.0])], "NoQK": [run("NoQK", 1, [60.0, 50.0]),
                                                              run("NoQK", 1, [60.0, 45.0])]})


def test_cut_at_tokens_keeps_the_probes_up_to_the_budget():
    ablated = {mode: {"val_loss": 4.0, "mean_pr": 40.0} for mode in ("learned", "k_ones")}
    probes = [{"step": i, "tokens": i * 10, "layers": [{"layer": 0, "gamma_k": {"values": [1.0 + i]}}]}
              for i in range(4)]
    res = run("QK", 0, [60.0, 50.0, 45.0, 40.0], step_tokens=10, steps=[0, 1, 2, 3], probes=probes,
              gamma_final={"0": [4.0]}, gain_ablation={"step": 3, **ablated}, gamma_cv={"0": [0.0, 0.1, 0.2, 0.3]})
    cut = cut_at_tokens(res, 20)
    assert cut["tokens"] == [0, 10, 20] and cut["mean_pr"] == [60.0, 50.0, 45.0] and cut["steps"] == [0, 1, 2]
    assert cut["layer_pr"]["0"] == [60.0, 50.0, 45.0] and cut["gamma_cv"]["0"] == [0.0, 0.1, 0.2]
    assert cut["gamma_final"] == {"0": [3.0]}  # the gains at the last probe kept, not at the run's end
    assert "gain_ablation" not in cut  # measured at step 3, after the budget
    assert res["tokens"] == [0, 10, 20, 30]  # the run read is not changed
    assert cut_at_tokens(res, 30) is res


def test_runs_on_several_cpu_thread_counts_are_compared_and_the_report_says_which_had_which():
    def on(threads: int, device: str = "cpu") -> dict:
        return {"train_precision": "bf16", "device": device, "cpu_threads": threads}
    runs = {"QK": [run("QK", 0, [5, 6], provenance=on(2)), run("QK", 1, [5, 6], provenance=on(1))],
            "NoQK": [run("NoQK", 0, [5, 7], provenance=on(2)), run("NoQK", 1, [5, 7], provenance=on(2))]}
    c = compare(runs)
    assert [len(rl) for rl in c.runs.values()] == [2, 2]  # none set aside
    assert c.compared.endswith("; trained on CPU threads 1 (QK (seed 1)) and 2 (QK (seed 0), NoQK (seeds 0, 1)), "
                               "compared together: bf16 values move with the thread count in the last bits (about "
                               "7e-5 relative).")
    runs["QK"][1]["provenance"] = on(2)
    assert "CPU threads" not in compare(runs).compared  # one count: nothing to say
    runs["QK"][1]["provenance"] = on(8, "cuda:0")
    assert "CPU threads" not in compare(runs).compared  # a GPU's threads move no value
