"""--threads (TrainConfig.threads, declared results=False): torch's CPU threads for a run, a runtime setting that is
never part of a run's identity, so a resume (and a study's recorded run) may differ in it; 0 follows the cores the
process may use and OMP_NUM_THREADS (utils.runtime.local_cpu_threads)."""
from __future__ import annotations

import pytest
import torch

import train_llm
from configs import ConfigError, apply_overrides, get_preset
from configs.cli import start_from_args
from tests.helpers import cli_args, losses
from training.resume import RESUMABLE_CHANGES, config_differences
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


def test_torch_threads_follow_the_option_else_the_cores_and_omp_num_threads(monkeypatch, kept_threads):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert set_cpu_threads(0, 1) == 3 and torch.get_num_threads() == 3  # the three cores it may use
    assert set_cpu_threads(2, 1) == 2 and torch.get_num_threads() == 2  # asked
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert set_cpu_threads(0, 1) == 1 and torch.get_num_threads() == 1  # the outside budget caps the default
    assert set_cpu_threads(2, 1) == 2 and torch.get_num_threads() == 2  # an asked count is taken as asked


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
