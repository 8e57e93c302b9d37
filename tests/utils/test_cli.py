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
