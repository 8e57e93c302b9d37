"""The spike-warning study's folder: redrawn by split_panels from results.json and metrics.jsonl written by hand, and
a damaged metrics.jsonl told in one line that keeps what was drawn."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from research import split_panels
from research.results.layout import condition_dir, write_study_index
from research.studies import SPIKE_WARNING
from research.studies.kinds import KINDS
from tests.research.analysis.test_spikes import SEEDS, _rows, onsets_of
from tests.research.synthetic import make_results

NAME = "NoQK@16"


def _study(tmp_path: Path) -> Path:
    """12 seeds of NoQK@16: seeds 0-5 calibrate, 6-11 evaluate (2 spikes a run, at steps of their own); logit_max
    rises 5 steps before each spike."""
    folder = tmp_path / SPIKE_WARNING.name
    paths = []
    for seed in SEEDS:
        run = condition_dir(folder, NAME, seed, several_seeds=True)
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(make_results(NAME, qk_norm="none", seed=seed)))
        rows = _rows(seed, onsets_of(seed), 100.0)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str((run / "results.json").relative_to(folder)))
    write_study_index(folder, name=SPIKE_WARNING.name, kind="spikes", seeds=SEEDS, preset="tiny",
                      conditions={NAME: paths}, margin=0.03, loss_margin=0.005)
    return folder


@pytest.mark.slow
def test_the_kind_redraws_a_synthetic_folder(tmp_path, capsys):
    folder = _study(tmp_path)
    split_panels.main([str(folder)])
    written = [Path(w).name for w in capsys.readouterr().out.split() if w != "wrote"]
    assert written == KINDS["spikes"].outputs([NAME]) == ["1_signals_at_spikes.png", "2_hit_vs_false_alarms.png",
                                                          "report.md", "report.html"]
    assert SPIKE_WARNING.outputs() == ["study.json", *written]
    report = (folder / "report.md").read_text()
    assert "- In NoQK, logit_max, logit_growth warn; inconclusive:" in report
    assert ("- logit_max at threshold 17.2, logit_growth at threshold 90 in NoQK: warns (p 0.0014 with the runs paired "
            "and 6.0e-14 with each run's alarms shifted in time, both \u2264 0.0062); 12 of 12 held-out spikes hit, "
            "2.0 expected with the runs paired") in report  # 1 of the 6 runs' alarms hits a spike
    assert report.startswith("# Do the keys warn before the loss spikes?\n\n## In short\n\n- no QK-norm (NoQK), 12 "
                             "held-out spike(s): **warns**: logit_max (hit rate 1.00 [1.00, 1.00] against 0.17 [0.17, "
                             "0.17] by chance), logit_growth (")
    assert "4 signal(s) tested" in report  # logit_max, its growth, grad_norm, entropy (the probes'): 0.025 / 4
    assert ("evaluated only on the other seeds (6, 7, 8, 9, 10, 11)") in report
    assert "![each signal and the loss around every spike, aligned at its onset](1_signals_at_spikes.png)" in report
    assert "| loss_rise (check) |" in report and "| late_loss_rise (check) |" in report and "step_only" not in report
    assert "| logit_max | 17.2 | 1.00 [1.00, 1.00] (12 of 12) | 0.17 [0.17, 0.17] | 0.07 | 0.0014, 6.0e-14 |" in report


@pytest.mark.parametrize("damage, problem", [
    ('{"step": 1, "tokens": 512, "loss": 4.0}\n{"step": 2, "lo', "corrupted: line 2 is not JSON (Unterminated "
                                                                 "string starting at), damaged or cut off"),
    ('[1, 2]\n', 'line 1 is not a training log line (a JSON object with an integer "step"): not a metrics.jsonl '
                 "of this project's trainer"),
    (None, "no metrics.jsonl beside the run's results (the per-step log this study reads)"),
    ('{"step": 1, "loss": 4.0}\n{"step": 11, "loss": 4.0}\n', "logged steps 1..11 with a gap of 10 (--log_every "
                                                                "above 1, or lines lost); the spike rule reads every "
                                                                "step"),
])
def test_a_damaged_metrics_jsonl_is_one_line_and_keeps_the_report(tmp_path, capsys, damage, problem):
    folder = _study(tmp_path)
    (folder / "report.md").write_text("drawn before\n")
    log = condition_dir(folder, NAME, 6, several_seeds=True) / "metrics.jsonl"
    log.unlink() if damage is None else log.write_text(damage)
    with pytest.raises(SystemExit) as stop:
        split_panels.main([str(folder)])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err == (f"error: {log}: {problem}; fix: train that run again: delete its folder and run the same study "
                   f"command, which trains only the runs that are missing (with --log_every 1)\n")
    assert (folder / "report.md").read_text() == "drawn before\n"
    assert sorted(p.name for p in folder.iterdir()) == ["NoQK", "report.md", "study.json"]


def test_every_step_is_logged_on_any_preset_and_the_grid_is_the_catalogs():
    from research.studies.runner import base_config
    assert {p: base_config(SPIKE_WARNING, p, {}).train.log_every for p in ("tiny", "88m")} == {"tiny": 1, "88m": 1}
    assert [name for name, _ in SPIKE_WARNING.runs()] == ["QK@128", "QK@256", "NoQK@128", "NoQK@256"]
    assert SPIKE_WARNING.default_seeds == tuple(range(12))  # 6 calibrate, 6 evaluate


def test_a_run_that_diverged_before_logging_needs_no_metrics_jsonl(tmp_path):
    from research.studies.kinds import read
    from research.results.layout import read_study_index
    folder = _study(tmp_path)
    run = condition_dir(folder, NAME, 11, several_seeds=True)
    res = json.loads((run / "results.json").read_text())
    (run / "results.json").write_text(json.dumps({**res, "diverged": {"step": 1}}))
    (run / "metrics.jsonl").unlink()
    kind, inputs = read(folder, read_study_index(folder))
    assert [len(r["metrics_steps"]) for r in inputs.runs[NAME]] == [200] * 11 + [0]
