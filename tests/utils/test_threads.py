"""utils.threads: the thread count's rule by hand (asked, OMP_NUM_THREADS, the cores other processes leave free),
and the busy cores read from /proc/stat."""
from __future__ import annotations

import pytest

from utils import threads
from utils.threads import ThreadChoice, choose_threads, omp_budget


@pytest.mark.parametrize("asked, cores, world, budget, busy, expected", [
    (3, 2, 1, 1, 2.0, ThreadChoice(3, "asked (--threads)")),  # asked wins over the budget and the load
    (0, 2, 1, 1, 0.0, ThreadChoice(1, "OMP_NUM_THREADS=1")),  # a budget from outside: the load is not looked at
    (0, 8, 2, 64, None, ThreadChoice(4, "OMP_NUM_THREADS=64")),  # ... and caps nothing below the cores' share
    (0, 2, 1, None, 0.05, ThreadChoice(2, "free cores: 2 of 2")),  # quiet: every core
    (0, 2, 1, None, 0.49, ThreadChoice(2, "free cores: 2 of 2")),  # a core busy less than half its time is free
    (0, 2, 1, None, 1.0, ThreadChoice(1, "free cores: 1 of 2 (others kept 1.0 busy)")),  # one spinning process
    (0, 2, 1, None, 5.0, ThreadChoice(1, "free cores: 1 of 2 (others kept 5.0 busy)")),  # never fewer than one
    (0, 8, 2, None, 2.6, ThreadChoice(2, "free cores: 5 of 8 (others kept 2.6 busy)")),  # shared by torchrun's 2
    (0, 4, 1, None, None, ThreadChoice(4, "cores: 4 (load not readable)")),  # no /proc/stat: every core
    (0, 1, 1, None, None, ThreadChoice(1, "cores: 1")),
])
def test_the_rule(asked, cores, world, budget, busy, expected):
    assert choose_threads(asked, cores, world, budget, busy) == expected


def test_omp_num_threads_is_a_positive_count_or_nothing():
    assert [omp_budget(e) for e in ({}, {"OMP_NUM_THREADS": "2"}, {"OMP_NUM_THREADS": "4,2"},
                                     {"OMP_NUM_THREADS": "0"}, {"OMP_NUM_THREADS": "many"})] == [None, 2, 4, None, None]


def test_busy_cores_are_read_from_proc_stat_for_this_processs_cores(monkeypatch):
    """Two reads of /proc/stat: core 0 idle all the time, core 1 busy 3/4 of it, core 2 not this process's."""
    reads = iter(["cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 10 0 0 100 0 0 0 0 0 0\ncpu1 10 0 0 100 0 0 0 0 0 0\n"
                  "cpu2 0 0 0 0 0 0 0 0 0 0\n",
                  "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 10 0 0 200 0 0 0 0 0 0\ncpu1 70 0 15 120 5 0 0 0 0 0\n"
                  "cpu2 100 0 0 0 0 0 0 0 0 0\n"])
    monkeypatch.setattr(threads, "open", lambda *a, **k: _Text(next(reads)), raising=False)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    assert threads.busy_cores({0, 1}) == pytest.approx(0.75)


def test_busy_cores_are_not_known_without_proc_stat(monkeypatch):
    def missing(*a, **k):
        raise FileNotFoundError("/proc/stat")
    monkeypatch.setattr(threads, "open", missing, raising=False)
    assert threads.busy_cores({0}) is None


class _Text:
    def __init__(self, text: str):
        self.text = text

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read(self) -> str:
        return self.text
