"""One spelling per option: underscores; a hyphenated spelling is refused with the right one named."""
import pytest

from utils.cli import ArgumentParser


def parser():
    p = ArgumentParser(prog="tool")
    p.add_argument("--loss_margin", type=float)
    p.add_argument("--output")
    return p


def test_the_underscore_spelling_is_the_only_one(capsys):
    assert parser().parse_args(["--loss_margin", "0.1"]).loss_margin == 0.1
    with pytest.raises(SystemExit):
        parser().parse_args(["--loss-margin", "0.1"])
    err = capsys.readouterr().err
    assert "--loss-margin is spelled --loss_margin" in err


def test_no_hint_for_an_option_that_does_not_exist(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--no-such-thing"])
    assert "spelled" not in capsys.readouterr().err


def test_no_prefix_matching(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--out", "x"])  # argparse's default would take it for --output
    assert "unrecognized arguments: --out" in capsys.readouterr().err


def test_an_option_given_once_refuses_a_second_use_with_its_reason():
    """argparse keeps the last of an option given twice, silently: an option made with `once` is refused in one line
    naming both values (a list as it was written) and its own reason (issue 50)."""
    from utils.cli import once
    from utils.errors import ConfigError
    p = parser()
    p.add_argument("--alarm", action=once("a run has one alarm"))
    p.add_argument("--seeds", type=int, nargs="+", action=once("every seed goes after one --seeds"))
    assert vars(p.parse_args(["--alarm", "a", "--seeds", "0", "1", "--output", "x"])) == \
        {"loss_margin": None, "output": "x", "alarm": "a", "seeds": [0, 1]}
    with pytest.raises(ConfigError) as e:
        p.parse_args(["--alarm", "grad_norm:5", "--alarm", "logit_max:30"])
    assert str(e.value) == ("--alarm given twice (grad_norm:5, then logit_max:30): a run has one alarm. Fix: give "
                            "--alarm once")
    with pytest.raises(ConfigError, match=r"^--seeds given twice \(0 1, then 2\): every seed goes after one --seeds"):
        p.parse_args(["--seeds", "0", "1", "--seeds", "2"])


@pytest.mark.parametrize("added, argv, message", [
    ({}, ["--output", "x", "--output", "y"], "--output given twice (x, then y): it takes one value. Fix: give --output "
                                             "once"),
    # the default given again is a second use too (a small int is the default object itself)
    ({"type": int, "default": 5}, ["--n", "5", "--n", "5"], "--n given twice (5, then 5): it takes one value. Fix: "
                                                             "give --n once"),
    ({"type": int, "nargs": "+"}, ["--n", "1", "2", "--n", "3"], "--n given twice (1 2, then 3): its values go after "
                                                                 "one --n. Fix: give --n once"),
    ({"action": "store_true"}, ["--n", "--n"], "--n given twice: it is a switch. Fix: give --n once"),
    ({"choices": ["a", "b"]}, ["--n", "a", "--n", "b"], "--n given twice (a, then b): it takes one value. Fix: give "
                                                        "--n once"),
])
def test_every_storing_option_is_refused_when_given_twice(added, argv, message):
    """Every option of ArgumentParser that stores (a value, a list, a switch), in an argument group too, is refused
    the second time in one line: argparse would keep the last without a word (issue 65)."""
    from utils.errors import ConfigError
    for grouped in (False, True):
        p = parser()
        (p.add_argument_group("g") if grouped else p).add_argument("--n", **added)
        with pytest.raises(ConfigError) as e:
            p.parse_args(argv)
        assert str(e.value) == message
        p.parse_args(argv[:len(argv) // 2])  # once is fine, and a parser parses again from scratch
        p.parse_args(argv[:len(argv) // 2])


def test_an_appending_option_may_be_given_again():
    p = parser()
    p.add_argument("--tag", action="append")
    p.add_argument("-v", action="count")
    assert p.parse_args(["--tag", "a", "--tag", "b", "-v", "-v"]).tag == ["a", "b"]


def test_a_usage_error_shows_at_most_500_characters_of_what_was_given(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--loss_margin", "x" * 100_000])  # argparse's message quotes the value whole
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("tool: error: argument --loss_margin: invalid float value: 'xxx") and len(line) <= 520


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999", "0", "-0.0", "-1", "x", ""])
def test_a_positive_number_is_finite_and_above_zero(value, capsys):
    """The one type of a budget, a rate or a share given on the command line: float() reads nan and inf, and nan
    passes every comparison a later check would make (issue 65)."""
    from utils.cli import positive_number
    p = parser()
    p.add_argument("--budget_s", type=positive_number)
    assert p.parse_args(["--budget_s", "0.5"]).budget_s == 0.5
    with pytest.raises(SystemExit) as stop:
        p.parse_args([f"--budget_s={value}"])
    assert stop.value.code == 2
    assert "argument --budget_s: expected a " in capsys.readouterr().err


def test_the_study_and_simulation_rates_refuse_nan():
    from research.simulations.sequential import build_parser as simulation
    from research.studies import LR_SENSITIVITY
    from research.studies.runner import build_parser as study
    for parser, argv in ((study(LR_SENSITIVITY, argv=["--device", "cpu"]), ["--lr_multipliers", "1", "nan"]),
                         (simulation(), ["--rho", "nan"])):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
