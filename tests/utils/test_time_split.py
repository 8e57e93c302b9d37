"""utils.time_split: nested phases count once, the phases and the rest add up to the wall time, resumed sessions
add up, and the declared record."""
import time

import pytest

from utils.formats import FormatError, check
from utils.time_split import PHASES, TIME_SPLIT, TimeSplit, add_records, is_record, overhead_share, split_line


def test_an_inner_phase_counts_there_alone():
    times = TimeSplit()
    with times.phase("probes"):
        time.sleep(0.02)
        with times.phase("validation"):
            time.sleep(0.03)
    times.add("train_steps", 1.0)
    assert times.seconds["validation"] >= 0.03
    assert 0.02 <= times.seconds["probes"] < 0.03 + times.seconds["validation"] - 0.01
    record = times.record()
    assert list(record) == ["wall_s", *PHASES]
    # the steps were timed elsewhere (added as 1 s of a wall time shorter than that): rest is never negative
    assert record["rest"] == 0.0 and is_record(record)


def test_the_phases_and_the_rest_add_up_to_the_wall_time():
    times = TimeSplit()
    with times.phase("writing"):
        time.sleep(0.01)
    time.sleep(0.01)
    record = times.record()
    assert sum(record[p] for p in PHASES) == pytest.approx(record["wall_s"], rel=1e-9)
    assert record["rest"] >= 0.01


def test_a_resumed_run_adds_what_its_checkpoint_recorded():
    earlier = {"wall_s": 10.0, **dict.fromkeys(PHASES, 1.0)}
    times = TimeSplit()
    times.restore(earlier)
    times.restore(None)
    record = times.record()
    assert record["wall_s"] >= 10.0 and record["probes"] == 1.0 and record["figures"] == 1.0


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="no phase 'probe'"):
        with TimeSplit().phase("probe"):
            pass


def test_records_sum_and_say_themselves_in_one_line():
    one = {"wall_s": 100.0, "train_steps": 60.0, "probes": 20.0, "validation": 5.0, "gain_ablation": 1.0,
           "writing": 2.0, "figures": 0.0, "rest": 12.0}
    total = add_records([one, one])
    assert total["wall_s"] == 200.0 and total["rest"] == 24.0
    assert overhead_share(total) == pytest.approx(0.2)
    line = split_line(one)
    assert line.startswith("100.0 s: training steps 60.0 s (60%), probes 20.0 s (20%)")
    assert line.endswith("besides the steps and the probes 20.0%") and "the rest 12.0 s (12%)" in line


def test_the_declared_record_refuses_negative_and_missing_seconds():
    good = {"wall_s": 1.0, **dict.fromkeys(PHASES, 0.0)}
    check(TIME_SPLIT, good)
    with pytest.raises(FormatError, match="probes"):
        check(TIME_SPLIT, {**good, "probes": -1.0})
    assert not is_record({k: v for k, v in good.items() if k != "rest"})
