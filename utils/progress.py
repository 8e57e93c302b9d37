"""One switch for the progress bars the Hugging Face libraries draw, set by --no_progress:

    with library_progress(progress):     # prepare_data and load_model take `progress` (train_run passes it on)
        ...

`library_progress(False)` turns off the bars of datasets, huggingface_hub and transformers for the block and puts
back each library's own setting after it. datasets is not imported here: the code that imports it calls
`quiet_imported()` after the import. Which bars, and what still wins: docs/training.md, "What a run writes".
"""
from __future__ import annotations

import sys
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator

_blocks: list[list[Callable[[], None]]] = []  # per library_progress(False) block running: what turns bars back on


def _switches(name: str) -> tuple[Callable[[], bool], Callable[[], None], Callable[[], None]] | None:
    """(bars on?, turn off, turn on) of an imported library; None while it is not imported."""
    if name not in sys.modules:
        return None
    if name == "datasets":
        import datasets
        return datasets.is_progress_bar_enabled, datasets.disable_progress_bars, datasets.enable_progress_bars
    if name == "huggingface_hub":
        from huggingface_hub import utils
        return (lambda: not utils.are_progress_bars_disabled()), utils.disable_progress_bars, utils.enable_progress_bars
    from transformers.utils import logging  # transformers' own bars; turning them off turns off the hub's too
    return logging.is_progress_bar_enabled, logging.disable_progress_bar, logging.enable_progress_bar


_LIBRARIES = ("datasets", "huggingface_hub", "transformers")  # the hub before transformers: see _switches


@contextmanager
def library_progress(enabled: bool) -> Iterator[None]:
    """Within the block, the libraries' progress bars are drawn only if `enabled`; after it, as before."""
    if enabled:
        yield
        return
    import huggingface_hub.utils  # noqa: F401 - imported to be switched off (see the module docstring)
    import transformers.utils.logging  # noqa: F401
    _blocks.append([])
    try:
        quiet_imported()
        yield
    finally:
        for turn_on in reversed(_blocks.pop()):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # an environment variable that forbids it wins, unsaid
                turn_on()


def quiet_imported() -> None:
    """Inside a library_progress(False) block, turn off the bars of every library imported by now (the block's
    end turns them back on); outside one, nothing. Call it after importing datasets."""
    if not _blocks:
        return
    for name in _LIBRARIES:
        switches = _switches(name)
        if switches is None or not switches[0]():
            continue
        is_on, turn_off, turn_on = switches
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # HF_DATASETS_DISABLE_PROGRESS_BARS=0 and the like win, unsaid
            turn_off()
        if not is_on():
            _blocks[-1].append(turn_on)
