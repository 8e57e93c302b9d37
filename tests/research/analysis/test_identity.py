"""Identity before statistics (research.analysis.identity): runs are paired by seed, never by position, and
compared at one budget of one recipe; what is set aside is said. Study folders are laid out as a user has them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from research import split_panels
from research.analysis.identity import compare
from research.analysis.rules import by_seed
from research.results import ResultsError
from research.results.schema import cut_at_tokens, validate
from research.results.vocabulary import QK_CONDITIONS


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


def test_a_diverged_run_neither_sets_nor_meets_the_budget():
    """The learning-rate study: a run that diverged at its third probe ends there, and that is its result."""
    ok = run("QK", 0, [60.0, 50.0, 45.0, 40.0])
    diverged = run("QK", 0, [60.0, 50.0], diverged={"step": 7})
    c = compare({"QK@1": [ok], "QK@8": [diverged]})
    assert c.budget == 375_000 and c.runs["QK@1"][0] is ok and c.runs["QK@8"][0] is diverged and not c.set_aside


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
