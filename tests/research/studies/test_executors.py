"""The one executor of every study's runs (research/studies/executors.py): in this process it asks which runs are
finished before any trains, keeps those, trains the rest in order and names a failed or interrupted one; the catalog
runner and the fine-tuning study hand it their runs, so a failed run reads the same in both. (On Ray: test_ray.py.)"""
from __future__ import annotations

import pytest

from research import finetune_keys_study, qk_norm_25m_study
from research.analysis.finetune import CONDITIONS
from research.studies import QK_NORM, executors, finetune, runner
from research.studies.executors import ExecuteOptions, execute, results_paths
from research.studies.study_runs import StudyError, StudyRun
from tests.helpers import STEP_TOKENS, stops
from tests.research.inspection.builders import make_hf_model
from tests.research.studies.test_runner import study_args
from training.errors import RunInterrupted
from utils.errors import ConfigError, Interrupted
from utils.runtime import resolve_runtime

RUNTIME = resolve_runtime("cpu", "fp32")
KEPT = "(finished conditions in {out} are kept; once this is fixed, the same command continues the study)"


def toy_runs(out) -> list[StudyRun]:
    """Two conditions x two seeds, seed by seed as the studies order them: A0, B0, A1, B1."""
    return [StudyRun(c, s, {"lr": 0.1}, out / c / f"seed_{s}") for s in (0, 1) for c in ("A", "B")]


def test_the_executor_keeps_finished_runs_trains_the_rest_in_order_and_names_a_failed_one(tmp_path, capsys):
    events = []

    def finished(run):
        events.append(("asked", run.cond, run.seed))
        return (run.cond, run.seed) == ("A", 0)

    def train(run, runtime):
        events.append(("trained", run.cond, run.seed, runtime))
        if (run.cond, run.seed) == ("B", 1):
            raise ConfigError("boom")
    with pytest.raises(StudyError) as failed:
        execute(toy_runs(tmp_path), tmp_path, train, ExecuteOptions(RUNTIME), finished=finished)
    assert str(failed.value) == f"in condition B, seed 1: boom {KEPT.format(out=tmp_path)}"
    assert events == [("asked", "A", 0), ("asked", "B", 0), ("asked", "A", 1), ("asked", "B", 1),
                      ("trained", "B", 0, RUNTIME), ("trained", "A", 1, RUNTIME), ("trained", "B", 1, RUNTIME)]
    assert capsys.readouterr().out.splitlines() == [
        "A seed 0: finished earlier, kept", f"== B (seed 0) -> {tmp_path / 'B' / 'seed_0'}",
        f"== A (seed 1) -> {tmp_path / 'A' / 'seed_1'}", f"== B (seed 1) -> {tmp_path / 'B' / 'seed_1'}"]
    assert results_paths(toy_runs(tmp_path), tmp_path) == {"A": ["A/seed_0/results.json", "A/seed_1/results.json"],
                                                           "B": ["B/seed_0/results.json", "B/seed_1/results.json"]}


def test_a_refused_run_stops_the_executor_before_any_trains_and_an_interrupted_one_says_where(tmp_path):
    trained = []

    def refuse(run):
        if (run.cond, run.seed) == ("B", 1):  # asked last
            raise ConfigError(f"{run.run_dir} holds a run of other settings")
        return False
    with pytest.raises(ConfigError, match="B/seed_1 holds a run of other settings$"):  # its own words, unwrapped
        execute(toy_runs(tmp_path), tmp_path, lambda run, runtime: trained.append(run), ExecuteOptions(RUNTIME),
                finished=refuse)
    assert trained == []

    def interrupted(run, runtime):
        raise RunInterrupted(run.run_dir, 3, 2, True)
    with pytest.raises(Interrupted) as stop:
        execute(toy_runs(tmp_path), tmp_path, interrupted, ExecuteOptions(RUNTIME))
    assert str(stop.value) == (f"interrupted in condition A, seed 0, at step 3 (its checkpoint at step 2 is kept). "
                               f"Finished conditions in {tmp_path} are kept: run the same command again to continue "
                               f"the study")


@pytest.mark.parametrize("study", ["runner", pytest.param("finetune", marks=pytest.mark.slow)])  # a model: 8 s
def test_a_failed_run_reads_the_same_in_the_runner_and_the_finetuning_study(study, corpus_file, cache_dir, tmp_path,
                                                                            monkeypatch, capsys):
    assert runner.execute is executors.execute and finetune.execute is executors.execute  # the one loop

    def fail(*args, **kwargs):  # each study's own training, failing on a user error
        raise ConfigError("boom")
    out = tmp_path / "study"
    if study == "runner":
        monkeypatch.setattr(runner, "train_run", fail)
        main, first = qk_norm_25m_study.main, QK_NORM.runs()[0][0]
        argv = study_args(corpus_file, cache_dir, out, 4 * STEP_TOKENS, "--seed", "0")
    else:
        monkeypatch.setattr(finetune, "train_one", fail)
        model = make_hf_model("qwen3", tmp_path / "qwen3")
        main, first = finetune_keys_study.main, CONDITIONS[0]
        argv = ["--model", str(model), "--out", str(out), "--tokens", "256", "--batch_size", "2", "--seq_len", "16",
                "--seeds", "0", "--no_progress"]
    assert stops(capsys, main, argv) == f"error: in condition {first}, seed 0: boom {KEPT.format(out=out)}"
    assert not (out / "study.json").exists()
