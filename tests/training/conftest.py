"""What the train_llm tests share: a debug run's arguments and the one-line stop they expect."""
from __future__ import annotations

import pytest

from tests.helpers import cli_args, stops


@pytest.fixture
def args(corpus_file, cache_dir, tmp_path):
    """args(steps, *extra): train_llm arguments for the run folder tmp_path/run."""
    return lambda steps, *extra: cli_args(corpus_file, cache_dir, tmp_path / "run", steps, *extra)


@pytest.fixture
def fails(capsys):
    """fails(argv): run train_llm expecting it to stop with one line naming the problem (no traceback), exit status 2;
    that line."""
    import train_llm
    return lambda argv: stops(capsys, train_llm.main, argv)
