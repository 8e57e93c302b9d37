"""The benchmark's torch.compile check (research.speed.suite.compile_check): two runs each way compared loss by loss
bit for bit, and the compile's pay-back in steps against the README's first command; numbers, no timed assertion."""
from __future__ import annotations

from research.speed import suite
from research.speed.measure import measure_compile


def test_compile_check_compares_the_runs_bit_for_bit_and_counts_the_pay_back(monkeypatch):
    runs = iter([
        {"losses": ["a", "b", "c"], "first_step_s": 0.5, "step_s": 0.10},  # eager, twice: equal
        {"losses": ["a", "b", "c"], "first_step_s": 0.6, "step_s": 0.11},
        {"losses": ["a", "b", "c"], "first_step_s": 8.5, "step_s": 0.08},  # compiled: differ from step 3
        {"losses": ["a", "b", "d"], "first_step_s": 9.0, "step_s": 0.09}])
    monkeypatch.setattr(suite, "in_child", lambda *a, **k: next(runs))
    c = suite.compile_check("tiny", "bf16", 3)
    assert (c["eager_differ_at"], c["compiled_differ_at"]) == (None, 3)
    assert round(c["compile_s"], 6) == 8.02 and round(c["saved_per_step_s"], 6) == 0.02  # 8.42 - 0.40 over a step
    assert round(c["payback_steps"]) == 401
    runs_, per_run = suite.first_command_steps()
    assert c["first_command"] == {"runs": runs_, "steps_per_run": per_run} and runs_ == 12
    assert suite.compile_text(c).endswith(f"compiled differ from step 3, eager bit for bit; step 100.0 ms eager, "
                                          f"80.0 ms compiled; compiling costs 8.0 s and pays back after 401 steps (the "
                                          f"first command: 12 runs x {per_run} steps; not within one run)")


def test_two_eager_runs_repeat_loss_by_loss():
    first, second = (measure_compile("tiny", "fp32", 2, "off") for _ in range(2))
    assert first["losses"] == second["losses"] and not first["compiled"]
