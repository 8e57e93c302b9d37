"""The telemetry benchmark (python -m research.speed.measure telemetry): a step with and one without per round."""
from research.speed.measure import build_parser
from research.speed.telemetry import measure_telemetry


def test_steps_with_and_without_telemetry_are_timed_in_the_same_rounds():
    result = measure_telemetry(3, preset="debug")
    assert result["steps"] == 3 and result["range"][0] <= result["cost"] <= result["range"][1]
    assert result["step_ms"]["on"] > 0 and result["step_ms"]["off"] > 0 and result["cost"] > -1


def test_the_command_offers_it():
    text = " ".join(build_parser().format_help().split()).replace("per- step", "per-step")  # argparse wraps at "-"
    assert "telemetry: the per-step telemetry's cost" in text
