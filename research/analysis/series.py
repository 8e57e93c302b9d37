"""Per-probe series over seeds: alignment, seed means and 95% bands (numpy only).

A condition run with several seeds has one results dict per seed; these helpers turn the
per-probe lists of those dicts into arrays [n_seeds, n_probes] and their column statistics. Seeds are
matched by token count, never by position: a mean over seeds is taken only at the token counts every
seed was probed at (research.analysis.identity names the ones left out in the report).
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from research.analysis.stats import mean_ci95
from research.results.values import as_array


def nanmean(a, axis=None):
    """np.nanmean without the all-NaN warning (all-NaN slices give NaN)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(a, axis=axis)


def _grid(tokens) -> set[float]:
    """A run's token counts (None or NaN, a probe that recorded none, left out)."""
    return {float(t) for t in tokens if t is not None and math.isfinite(t)}


def shared_tokens(grids) -> list[float]:
    """The token counts every grid (a run's `tokens`) holds, ascending: where a mean over the runs is taken."""
    sets = [_grid(g) for g in grids]
    return sorted(set.intersection(*sets)) if sets else []


def left_out(grids) -> list[float]:
    """The token counts some grids hold and others lack, ascending: the points a mean over the runs leaves out."""
    sets = [_grid(g) for g in grids]
    return sorted(set.union(*sets) - set.intersection(*sets)) if sets else []


def on_shared_tokens(curves) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, Y[n_runs, n_tokens, ...]) from (tokens, values) per run, at the token counts every run has.

    Runs are matched by token count, never by position: a run probed at 100k, 200k and 500k tokens and one
    probed at 100k, 300k and 500k meet at 100k and 500k only. `values` is a per-probe list (None -> NaN) or an
    array [n_probes, ...]; None, an empty list or a list shorter than the run's tokens gives NaN there."""
    curves = list(curves)
    tokens = shared_tokens(t for t, _ in curves)
    arrays = [None if v is None or len(v) == 0 else
              np.asarray(v, dtype=float) if isinstance(v, np.ndarray) else as_array(v) for _, v in curves]
    rest = next((a.shape[1:] for a in arrays if a is not None), ())
    y = np.full((len(curves), len(tokens), *rest), np.nan)
    for i, ((grid, _), values) in enumerate(zip(curves, arrays)):
        if values is None:
            continue
        where = {float(t): j for j, t in enumerate(grid) if t is not None and math.isfinite(t)}
        for k, t in enumerate(tokens):
            if where[t] < len(values):
                y[i, k] = values[where[t]]
    return np.asarray(tokens, dtype=float), y


def aligned(runs: list[dict], get) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, Y[n_runs, n_probes, ...]) over the token counts every run has (on_shared_tokens); None -> NaN.

    `get(res)` returns a per-probe list of the run (e.g. res["mean_pr"]) or an array [n_probes, ...]."""
    return on_shared_tokens((r["tokens"], get(r)) for r in runs)


def seed_mean(runs: list[dict], get) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, mean over the runs [n_tokens, ...]) at the token counts every run has, NaN-aware: the curve a
    figure draws for a condition run with several seeds."""
    tokens, y = aligned(runs, get)
    return tokens, (nanmean(y, axis=0) if y.shape[0] else np.zeros(y.shape[1:]))


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
