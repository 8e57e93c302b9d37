"""Shared figure style: one colour and one label per condition across every figure.

Imports matplotlib (Agg backend) and numpy only; never torch.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# Conditions keep their colour in every figure of every study.
CONDITION_COLORS = {
    "QK": "#1f77b4",         # blue: QK-norm with learned gain
    "QK_frozen": "#ff7f0e",  # orange: QK-norm with gain frozen at 1
    "NoQK": "#2ca02c",       # green: no QK-norm
}
CONDITION_LABELS = {
    "QK": "QK-norm, learned gain",
    "QK_frozen": "QK-norm, gain frozen at 1",
    "NoQK": "no QK-norm",
}
# Aliases used by the pilot's combined_results.json.
CONDITION_COLORS.update(qk_norm=CONDITION_COLORS["QK"], no_qk_norm=CONDITION_COLORS["NoQK"])
CONDITION_LABELS.update(qk_norm=CONDITION_LABELS["QK"], no_qk_norm=CONDITION_LABELS["NoQK"])

# Layer groups (early / middle / final) keep theirs.
GROUP_COLORS = {"early": "#4c72b0", "middle": "#dd8452", "final": "#c44e52"}

plt.rcParams.update({
    "figure.dpi": 110, "savefig.dpi": 130, "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10,
    "legend.fontsize": 9, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
    "axes.spines.right": False,
})


def color(condition: str) -> str:
    return CONDITION_COLORS.get(condition, "#7f7f7f")


def label(condition: str) -> str:
    return CONDITION_LABELS.get(condition, condition)


def tokens_axis(ax, tokens) -> np.ndarray:
    """x values in millions of tokens, with the axis labelled accordingly."""
    ax.set_xlabel("training tokens (millions)")
    return np.asarray(tokens, dtype=float) / 1e6


def smooth(y, window: int) -> np.ndarray:
    """Centered moving average that keeps the length (shorter windows at the ends); None -> nan."""
    y = np.array([np.nan if v is None else v for v in y], dtype=float)
    if window <= 1 or len(y) < 3:
        return y
    out = np.empty_like(y)
    h = window // 2
    for i in range(len(y)):
        out[i] = np.nanmean(y[max(0, i - h): i + h + 1])
    return out


def save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def as_array(values) -> np.ndarray:
    """A list of numbers (None allowed) as a float array, None -> nan."""
    return np.array([math.nan if v is None else float(v) for v in (values or [])], dtype=float)


def nanmean(a, axis=None):
    """np.nanmean without the all-NaN warning (all-NaN slices give NaN)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(a, axis=axis)


def mean_over_seeds(series) -> np.ndarray:
    """Probe-by-probe mean of one series per seed (arrays, or lists with None), cut to the shortest
    run, NaN-aware. Empty input gives an empty array."""
    arrays = [a if isinstance(a, np.ndarray) else as_array(a) for a in series]
    arrays = [a for a in arrays if a.size]
    if not arrays:
        return np.zeros((0, 0))
    n = min(a.shape[0] for a in arrays)
    return nanmean(np.stack([a[:n] for a in arrays]), axis=0)


def fmt_num(v, nd: int = 3) -> str:
    """A number for a report table; None and NaN read as n/a."""
    return "n/a" if v is None or not np.isfinite(v) else f"{v:.{nd}f}"


def fmt_tokens(t: float) -> str:
    """Token counts as 12.3M / 456k / 789."""
    if not np.isfinite(t):
        return "?"
    if t >= 1e6:
        return f"{t / 1e6:.3g}M"
    if t >= 1e3:
        return f"{t / 1e3:.3g}k"
    return f"{t:.0f}"


def message_figure(path: str | Path, title: str, text: str, size=(8, 4)) -> Path:
    """A figure that says why there is nothing to draw (instead of a missing or blank file)."""
    fig, ax = plt.subplots(figsize=size)
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=11, transform=ax.transAxes)
    return save(fig, path)
