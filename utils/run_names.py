"""The names of what a run writes into its folder, and how to tell a run's config.json: no torch here, so that
readers that must stay light (research.results, split_panels) use the same names as training.run_files."""
from __future__ import annotations

import json
from pathlib import Path

CONFIG, METRICS, SUMMARY, RESULTS, TOKENIZER, CHECKPOINTS = (
    "config.json", "metrics.jsonl", "summary.json", "results.json", "tokenizer", "checkpoints")
ATOMIC_FILES = (CONFIG, METRICS, SUMMARY, RESULTS)  # written atomically (utils.io); results.json: the key probe's
RUN_DIRS = (TOKENIZER, "tensorboard", "wandb", "trackio")  # folders besides checkpoints/: the tokenizer, the trackers'
RUN_FILES = (*ATOMIC_FILES, CHECKPOINTS, *RUN_DIRS)  # any of them makes a folder a run's


def is_own_run(path: Path) -> bool:
    """Whether `path` is a training folder of this project: its config.json is a run config (sections model,
    train and data); other model folders have a config.json too."""
    try:
        d = json.loads((Path(path) / CONFIG).read_text())
    except (OSError, ValueError):  # ValueError: not JSON, or not UTF-8
        return False
    return isinstance(d, dict) and {"model", "train", "data"} <= set(d)
