"""What the train_llm tests share: a debug run's arguments and the one-line stop they expect."""
from __future__ import annotations

import pytest

from tests.helpers import cli_args


@pytest.fixture
def args(corpus_file, cache_dir, tmp_path):
    """args(steps, *extra): train_llm arguments for the run folder tmp_path/run."""
    return lambda steps, *extra: cli_args(corpus_file, cache_dir, tmp_path / "run", steps, *extra)


@pytest.fixture
def fails(capsys):
    """fails(argv): run train_llm expecting it to stop with one line naming the problem (no traceback)."""
    import train_llm

    def run(argv) -> str:
        with pytest.raises(SystemExit) as stop:
            train_llm.main(argv)
        msg = str(stop.value.code)
        assert msg.startswith(("error: ", "config error: ")) and "\n" not in msg, msg
        return msg
    return run
