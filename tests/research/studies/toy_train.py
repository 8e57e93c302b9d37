"""A study's train function that trains nothing, for the executors' tests: a module of its own, light to import,
since a worker process spawned by --parallel imports it (test_parallel.py)."""
from __future__ import annotations

import json
import os
import time

from utils.errors import ConfigError


def toy_train(run, runtime) -> None:
    """Record where the run ran (its cores, process and runtime) after `sleep` seconds, or fail on a user error
    where its settings say `fail`."""
    time.sleep(run.cfg.get("sleep", 0))
    if run.cfg.get("fail"):
        raise ConfigError("boom")
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "where.json").write_text(json.dumps({"cores": sorted(os.sched_getaffinity(0)), "pid": os.getpid(),
                                                        "runtime": runtime}))
