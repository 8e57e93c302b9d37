"""The prepared GPU session on CPU: its CUDA steps skip, its runner records each way a step can end and keeps to
its budget, and every measurement step's options are ones the commands accept (a typo would cost a GPU lease); an
earlier session's record is never replaced, and a folder of another owner is refused."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from configs import apply_overrides, get_preset
from configs.cli import start_from_args
from research.speed.gpu import build_parser
from research.results.published import check_file
from research.speed.gpu_session import (CUDA_TEST_FILES, SessionError, Step, last_result, main, run_session,
                                        session_folder, session_steps)


def test_without_cuda_every_step_is_skipped_and_the_summary_written(tmp_path):
    session = run_session(session_steps(tmp_path, None), tmp_path, 480, cuda=False)
    assert session["device"] == "no CUDA"
    assert {r["status"] for r in session["steps"].values()} == {"skipped"}
    assert json.loads((tmp_path / "gpu_session.json").read_text()) == session
    assert list(session["steps"])[:3] == ["cuda_tests", "project_88m", "project_1b"]  # the priority


def test_the_runner_records_ran_failed_timeout_and_a_spent_budget(tmp_path):
    py = lambda code: (sys.executable, "-c", code)  # noqa: E731
    steps = [Step("ok", py('print("x"); print(\'{"tokens_per_s": 5}\')'), 30, needs_cuda=False, tokens=100),
             Step("bad", py("raise SystemExit(3)"), 30, needs_cuda=False),
             Step("slow", py("import time; time.sleep(30)"), 2, needs_cuda=False),
             Step("late", py("print(1)"), 30, needs_cuda=False),
             Step("gpu", py("print(1)"), 30)]
    session = run_session(steps, tmp_path, budget_s=12, cuda=False)
    s = session["steps"]
    assert s["ok"]["status"] == "ran" and s["ok"]["result"] == {"tokens_per_s": 5}
    assert s["ok"]["aggregate_tokens_per_s"] > 0
    assert s["bad"]["status"] == "failed (exit 3)" and s["slow"]["status"] == "timeout (2 s)"
    assert s["late"]["status"] == "ran"  # a step after a timeout still runs while the budget lasts
    assert s["gpu"] == {"status": "skipped", "why": "no CUDA"}
    assert (tmp_path / "ok.log").read_text().splitlines()[1] == "x"
    assert run_session(steps[:1], tmp_path / "again", budget_s=3, cuda=False)["steps"]["ok"]["status"].startswith(
        "skipped")


def test_last_result_reads_json_lines_and_the_seed_scripts_result_line():
    assert last_result('log\n{"a": 1}\nRESULT {"b": 2}\ndone') == {"b": 2}
    assert last_result("{not json\nnothing") is None


def test_every_measurement_steps_options_are_accepted():
    for step in session_steps(Path("out"), None):
        if step.argv[1:3] == ("-m", "research.speed.gpu"):
            args = build_parser(list(step.argv[3:])).parse_args(list(step.argv[3:]))
            preset, overrides = start_from_args(args, "1b")
            apply_overrides(get_preset(preset), overrides)  # raises on a value the config refuses


def test_the_variant_steps_are_the_declared_timed_values():
    """What configs/config.py declares to time is what the variants benchmark and the session run: one step each."""
    from research.speed.variants import variants
    steps = {s.name: s.argv[-2:] for s in session_steps(Path("out"), None) if s.name.startswith("variant_")}
    want = {f"variant_{k.replace('=', '_')}": (f"--{k.split('=')[0]}", k.split("=")[1]) for k in variants()
            if k != "default"}
    assert steps == want and len(want) >= 8 and "variant_attn_softcap_15" in steps


def test_the_cuda_test_files_are_every_file_with_a_gpu_mark():
    root = Path(__file__).resolve().parents[3]
    marked = {str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
              if "pytest.mark.gpu" in p.read_text() and p != Path(__file__).resolve()}
    assert marked == set(CUDA_TEST_FILES)


def test_a_budget_that_is_not_a_positive_number_is_refused_before_anything_is_written(tmp_path, capsys):
    """nan, inf, 0 and -1 were accepted, and nan and inf written into gpu_session.json, which strict JSON parsers
    refuse (issue 65): argparse's usage error, exit 2, no folder."""
    import pytest

    from research.speed.gpu_session import main
    for value in ("nan", "inf", "-inf", "0", "-1", "1e999"):
        with pytest.raises(SystemExit) as stop:
            main(["--out", str(tmp_path / "s"), f"--budget_s={value}"])
        assert stop.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            f"error: argument --budget_s: expected a finite number above 0, got '{value}'")
    assert not (tmp_path / "s").exists()


def test_the_session_file_is_strict_json_whatever_a_step_printed(tmp_path):
    """A step that prints NaN in its result line: recorded as null, never as NaN (json.loads reads both)."""
    step = Step("nan", (sys.executable, "-c", 'print(\'{"tokens_per_s": NaN, "ok": 1}\')'), 30, needs_cuda=False)
    run_session([step], tmp_path, budget_s=30, cuda=False)
    text = (tmp_path / "gpu_session.json").read_text()
    strict = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert strict["steps"]["nan"]["result"] == {"tokens_per_s": None, "ok": 1}


def test_a_second_session_into_one_folder_keeps_the_first_record(tmp_path, capsys):
    """The issue's case: a CPU session into the folder of a GPU session's record writes session_2/, the record and
    its logs kept byte for byte; a third writes session_3/. Each record validates against its published schema."""
    first = json.dumps({"device": "NVIDIA H200", "torch": "2.5", "budget_s": 480.0,
                        "steps": {"cuda_tests": {"status": "ran", "seconds": 60.0, "result": None}}}, indent=1)
    (tmp_path / "gpu_session.json").write_text(first)
    (tmp_path / "cuda_tests.log").write_text("12 passed\n")
    main(["--out", str(tmp_path), "--budget_s", "60"])
    main(["--out", str(tmp_path), "--budget_s", "60"])
    assert (tmp_path / "gpu_session.json").read_text() == first
    assert (tmp_path / "cuda_tests.log").read_text() == "12 passed\n"
    second, third = (json.loads((tmp_path / f"session_{n}" / "gpu_session.json").read_text()) for n in (2, 3))
    assert (second["session"], third["session"], second["device"]) == (2, 3, "no CUDA")
    assert f"this one (session 2) writes {tmp_path / 'session_2'}" in capsys.readouterr().out
    for record in (json.loads(first), second, third):
        check_file("gpu_session.schema.json", record)


def test_a_folder_with_only_an_earlier_sessions_log_is_not_written_over(tmp_path):
    (tmp_path / "cuda_tests.log").write_text("killed before its record\n")
    assert session_folder(tmp_path) == (tmp_path / "session_2", 2)
    assert session_folder(tmp_path / "new") == (tmp_path / "new", 1)


def test_the_runner_refuses_a_folder_holding_a_record(tmp_path):
    (tmp_path / "gpu_session.json").write_text("{}")
    with pytest.raises(SessionError, match="earlier session's record, never replaced"):
        run_session([], tmp_path, 10, cuda=False)
    assert (tmp_path / "gpu_session.json").read_text() == "{}"


def test_a_studys_folder_is_refused_before_anything_is_written(tmp_path, capsys):
    (tmp_path / "study.json").write_text(json.dumps({"kind": "qk_norm", "study": "qk_norm_25m_study"}))
    with pytest.raises(SystemExit) as refused:
        main(["--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and len(err.splitlines()) == 1
    assert "the study 'qk_norm_25m_study' (kind qk_norm)" in err and "nothing was written" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.json"]
