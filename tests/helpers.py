"""Helpers shared by the tests (fixtures live in conftest.py)."""
from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO.parent / "shared" / "reference" / "qk_norm_50m_study"  # the write-ups' own results
STEP_TOKENS = 8 * 32  # debug preset: batch 8 x seq_len 32


def quiet(*args, **kwargs) -> None:
    pass


def losses(out: Path) -> list[float]:
    """Training losses of a run folder's metrics.jsonl, one per logged step."""
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def build_trainer(cfg, out, **kwargs):
    """A single-process Trainer on freshly prepared data, silent and without a progress bar."""
    from data import prepare_data
    from training.trainer import Trainer
    return Trainer(cfg, prepare_data(cfg, log=quiet), out, progress=False, log=quiet, **kwargs)


def md_table(text: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the markdown table whose header row starts with `first_header`, as dicts."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header} |"))
    cells = lambda ln: [c.strip() for c in ln.strip().strip("|").split("|")]  # noqa: E731
    header = cells(lines[start])
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(dict(zip(header, cells(ln))))
    return rows


def bullet(text: str, label: str) -> str:
    """What follows '- <label>: ' on its line of a report."""
    line = next(ln for ln in text.splitlines() if ln.startswith(f"- {label}: "))
    return line[len(f"- {label}: "):]


def labelled_lines(ax) -> dict:
    """{legend label: y data} of an axes' labelled lines."""
    import numpy as np
    return {ln.get_label(): np.asarray(ln.get_ydata(), float) for ln in ax.get_lines()
            if not ln.get_label().startswith("_")}
