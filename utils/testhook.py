"""Test-only fault injection: kill or pause this process at a named point.

Nothing happens unless the environment variable QKKEYS_TEST_HOOK is set, which only the tests do
(tests/training/test_kills.py):

    QKKEYS_TEST_HOOK=kill:checkpoint_write:2    SIGKILL itself the 2nd time the point is reached
    QKKEYS_TEST_HOOK=pause:step:1               at the 1st hit write $QKKEYS_TEST_HOOK_DIR/paused,
                                                then wait until $QKKEYS_TEST_HOOK_DIR/go exists

The points ("step", "checkpoint_write", "prune", "replace:<file name>"): docs/layout.md, "Tests".
"""
from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

ENV, DIR_ENV = "QKKEYS_TEST_HOOK", "QKKEYS_TEST_HOOK_DIR"
_hits: Counter = Counter()


def hook(point: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    action, _, rest = spec.partition(":")
    name, _, nth = rest.rpartition(":")
    _hits[point] += 1
    if name != point or _hits[point] != int(nth):
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "pause":
        folder = Path(os.environ[DIR_ENV])
        (folder / "paused").write_text(str(os.getpid()))
        deadline = time.time() + 300
        while not (folder / "go").exists() and time.time() < deadline:
            time.sleep(0.05)
