"""--threads (TrainConfig.threads, declared results=False): torch's CPU threads for a run, a runtime setting that is
never part of a run's identity, so a resume (and a study's recorded run) may differ in it; 0 follows OMP_NUM_THREADS,
else the cores free at the process's first run (utils.threads). The choice is printed and recorded, and --threads
with the recorded count trains the same run bit for bit."""
from __future__ import annotations

import json

import pytest
import torch

import train_llm
from configs import ConfigError, apply_overrides, get_preset
from configs.cli import start_from_args
from tests.helpers import cli_args, losses
from training.resume import RESUMABLE_CHANGES, config_differences
from utils import threads as thread_rule
from utils.runtime import set_cpu_threads


@pytest.fixture
def kept_threads():
    """This process's torch threads, put back after the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_option_parses_into_the_config_and_is_checked():
    args = train_llm.build_parser(["--threads", "3"]).parse_args(["--threads", "3", "--out", "x"])
    assert start_from_args(args, "tiny")[1]["threads"] == 3
    assert get_preset("debug").train.threads == 0  # the default: follow the cores
    for bad in (-1, 1025):
        with pytest.raises(ConfigError, match=rf"^threads={bad} must be in \[0, 1024\]"):
            apply_overrides(get_preset("debug"), {"threads": bad})


def test_threads_are_not_part_of_a_runs_identity():
    old = get_preset("debug")
    assert "threads" in RESUMABLE_CHANGES
    assert config_differences(old, apply_overrides(old, {"threads": 2})) == []


def test_torch_threads_follow_the_option_else_omp_num_threads_else_the_free_cores(monkeypatch, kept_threads):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(thread_rule, "busy_at_start", lambda ids: 0.1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert set_cpu_threads(0, 1).threads == 3 and torch.get_num_threads() == 3  # the three cores it may use
    monkeypatch.setattr(thread_rule, "busy_at_start", lambda ids: 1.2)
    assert set_cpu_threads(0, 1) == thread_rule.ThreadChoice(2, "free cores: 2 of 3 (others kept 1.2 busy)")
    assert torch.get_num_threads() == 2
    assert set_cpu_threads(3, 1).threads == 3 and torch.get_num_threads() == 3  # asked: the load is not looked at
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert set_cpu_threads(0, 1) == thread_rule.ThreadChoice(1, "OMP_NUM_THREADS=1")  # the outside budget caps it
    assert set_cpu_threads(2, 1).threads == 2 and torch.get_num_threads() == 2  # an asked count is taken as asked


def test_the_choice_is_printed_recorded_and_reproduced_by_asking_for_it(corpus_file, cache_dir, tmp_path, capsys,
                                                                       monkeypatch, kept_threads):
    """A run whose threads followed a busy host records why; the same command with --threads and the recorded count
    trains it again bit for bit (bf16, where the count can move the values)."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(thread_rule, "busy_at_start", lambda ids: 0.9)  # another process on one of the two cores
    def args(out, *extra):  # the debug run of tests.helpers in bf16
        given = cli_args(corpus_file, cache_dir, tmp_path / out, 3, "--log_every", "1", *extra)
        given[given.index("--precision") + 1] = "bf16"
        return given
    train_llm.main(args("followed"))
    assert "threads=1 (free cores: 1 of 2 (others kept 0.9 busy)) " in capsys.readouterr().out
    prov = json.loads((tmp_path / "followed" / "results.json").read_text())["provenance"]
    assert (prov["cpu_threads"], prov["cpu_threads_why"]) == (1, "free cores: 1 of 2 (others kept 0.9 busy)")
    monkeypatch.setattr(thread_rule, "busy_at_start", lambda ids: 0.0)  # quiet now: asked, it is not looked at
    train_llm.main(args("asked", "--threads", str(prov["cpu_threads"])))
    assert "threads=1 (asked (--threads)) " in capsys.readouterr().out
    assert losses(tmp_path / "asked") == losses(tmp_path / "followed")


def test_a_resume_with_other_threads_is_accepted_and_trains_on_them(corpus_file, cache_dir, tmp_path, capsys,
                                                                     kept_threads):
    out = tmp_path / "run"
    train_llm.main(cli_args(corpus_file, cache_dir, out, 2, "--threads", "1", "--log_every", "1"))
    assert torch.get_num_threads() == 1
    assert "threads=1 " in capsys.readouterr().out
    train_llm.main(cli_args(corpus_file, cache_dir, out, 4, "--threads", "2", "--log_every", "1", "--resume"))
    assert torch.get_num_threads() == 2
    assert "threads=2 " in capsys.readouterr().out
    assert len(losses(out)) == 4  # steps 1-2 on one thread, 3-4 on two
