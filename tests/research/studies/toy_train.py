"""A study's train function that trains nothing, for the executors' tests: a module of its own, light to import,
since a worker process spawned by --parallel imports it (test_parallel.py)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from utils.errors import ConfigError


def toy_train(run, runtime) -> None:
    """Record where the run ran (its cores, process and runtime) after `sleep` seconds, or fail on a user error
    where its settings say `fail`; a run's `touch` is a file it creates as it starts, and `wait_for` one it waits
    for (at most a minute) before its sleep: the order of two runs side by side, whatever the host's load."""
    if run.cfg.get("touch"):
        Path(run.cfg["touch"]).touch()
    deadline = time.monotonic() + 60
    while run.cfg.get("wait_for") and not Path(run.cfg["wait_for"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(run.cfg.get("sleep", 0))
    if run.cfg.get("fail"):
        raise ConfigError("boom")
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "where.json").write_text(json.dumps({"cores": sorted(os.sched_getaffinity(0)), "pid": os.getpid(),
                                                        "runtime": runtime}))
