"""Per-probe series over seeds: alignment, seed means and 95% bands (numpy only).

A condition run with several seeds has one results dict per seed; these helpers turn the
per-probe lists of those dicts into arrays [n_seeds, n_probes] and their column statistics.
"""
from __future__ import annotations

import warnings

import numpy as np

from research.analysis.stats import mean_ci95
from research.results.values import as_array, as_float


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


def aligned(runs: list[dict], get) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, Y[n_runs, n_probes]) over the token counts every run has; None -> NaN.

    `get(res)` returns a per-probe list of the run (e.g. res["mean_pr"])."""
    if not runs:
        return np.zeros(0), np.zeros((0, 0))
    common = set(runs[0]["tokens"])
    for r in runs[1:]:
        common &= set(r["tokens"])
    tokens = sorted(common)
    y = np.full((len(runs), len(tokens)), np.nan)
    for i, r in enumerate(runs):
        values = get(r)
        if values is None:
            continue
        where = {t: j for j, t in enumerate(r["tokens"])}
        for k, t in enumerate(tokens):
            j = where[t]
            if j < len(values):
                y[i, k] = as_float(values[j])
    return np.asarray(tokens, dtype=float), y


def mean_band(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column-wise mean and 95% CI half width of Y[n_runs, n_probes] (half width NaN where fewer
    than 2 finite values); a single run is its own mean, with no band."""
    if y.shape[0] <= 1:
        return (y[0] if y.shape[0] else np.zeros(y.shape[1])), np.full(y.shape[1], np.nan)
    mean = np.full(y.shape[1], np.nan)
    half = np.full(y.shape[1], np.nan)
    for k in range(y.shape[1]):
        mean[k], half[k] = mean_ci95(y[:, k])
    return mean, half
