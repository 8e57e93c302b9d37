"""Every study run ends with one line of where its wall time went and records it in summary.json; the study sums
them, with its figures, into study.json and ends with its own line (utils.time_split)."""
import json
import re

import pytest

from research.studies import QK_NORM
from research.studies.runner import run_study
from tests.helpers import STEP_TOKENS
from tests.research.studies.test_runner import study_args
from utils.time_split import PHASES, is_record

LINE = re.compile(r"time: (\d+\.\d) s: training steps .* besides the steps and the probes (\d+\.\d)%")


@pytest.mark.slow
def test_each_run_and_the_study_say_and_record_where_their_time_went(corpus_file, cache_dir, tmp_path, capsys):
    out = tmp_path / "study"
    run_study(QK_NORM, study_args(corpus_file, cache_dir, out, 4 * STEP_TOKENS, "--seed", "0"))
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if LINE.fullmatch(line)]) == 3  # one per run
    assert re.fullmatch(r"qk_norm_50m_study time \(3 runs summed\): \d+\.\d s: .*%", lines[-1])
    runs = {c: json.loads((out / c / "summary.json").read_text())["time_split"] for c in ("QK", "QK_frozen", "NoQK")}
    for cond, record in runs.items():
        assert is_record(record), cond
        assert sum(record[p] for p in PHASES) == pytest.approx(record["wall_s"], rel=1e-6)
        assert record["train_steps"] > 0 and record["probes"] > 0 and record["writing"] > 0, cond
        assert record["figures"] == 0  # drawn once, by the study
    assert runs["QK"]["gain_ablation"] > 100 * max(runs["NoQK"]["gain_ablation"], runs["QK_frozen"]["gain_ablation"])
    study = json.loads((out / "study.json").read_text())["time_split"]
    assert study["runs"] == 3 and study["figures"] > 0
    for phase in ("train_steps", "probes", "validation", "gain_ablation", "writing"):
        assert study[phase] == pytest.approx(sum(r[phase] for r in runs.values()))
    assert study["wall_s"] >= sum(r["wall_s"] for r in runs.values()) + study["figures"]
