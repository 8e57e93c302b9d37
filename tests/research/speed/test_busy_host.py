"""research.speed.busy_host: its table reads the medians and ratios off the measurements (numbers, never a verdict),
and one measurement trains in a process of its own with the setting's threads."""
from __future__ import annotations

from research.speed import busy_host


def speed(tokens_per_s: float, threads: int) -> dict:
    return {"tokens_per_s": tokens_per_s, "threads": threads, "why": "", "precision": "bf16"}


def test_the_table_gives_each_setting_against_its_own_quiet_speed_and_every_core_quiet():
    result = {"cpu": "AMD EPYC", "cores": 2, "steps": 30, "repeats": 2, "load_before": [0.1, 0.2, 0.3],
              "load_after": [1.0, 0.5, 0.4],
              "settings": {"cores": {"quiet": [speed(10_000, 2), speed(12_000, 2)],
                                     "busy": [speed(2_500, 2), speed(3_000, 2)]},
                           "auto": {"quiet": [speed(11_000, 2), speed(11_000, 2)],
                                    "busy": [speed(6_050, 1), speed(6_050, 1)]}}}
    lines = busy_host.table(result).splitlines()
    assert lines[0].startswith("AMD EPYC, 2 cores, bf16, 30 steps x 2 repeats; load average before 0.10 0.20 0.30")
    assert lines[2].split()[:7] == ["cores", "2/2", "/", "2/2", "11,000", "2,750", "25%"]
    assert lines[3].split()[:8] == ["auto", "2/2", "/", "1/1", "11,000", "6,050", "55%", "100%"]


def test_one_measurement_runs_in_a_process_of_its_own():
    got = busy_host.measured("one", 1, "fp32", busy=False)
    assert got["threads"] == 1 and got["why"] == "asked (--threads)" and got["tokens_per_s"] > 0
