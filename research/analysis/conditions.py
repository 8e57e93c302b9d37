"""Decisions of a study of any conditions (a study file, research/study.py): each condition against the baseline,
or every pair of conditions when the study names none, in each quantity below.

Pure functions of results dicts (runs: condition -> one results dict per seed), decided by the procedure of
research.analysis.rules: paired by seed, one family per quantity (its comparisons share one Bonferroni level),
each comparison read off its interval against the margin (losses against the loss margin).

A quantity's final value of a run is the mean over layers at its last probe record (the loss: the last probe's
training and validation loss). research.analysis.identity has already cut every run at the budget they all reached.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from research.analysis.rules import Paired, by_seed, decide, runs_of
from research.analysis.series import nanmean
from research.analysis.stats import mean_ci95
from research.results.read import final_site_mean, last, layer_series, probe_tokens


@dataclass(frozen=True)
class Quantity:
    key: str  # as combined.json and the figure names spell it
    text: str  # for people
    site: str | None  # the probe record's site.metric it is the layer mean of; None: a per-probe top-level field
    metric: str
    loss: bool = False  # read against the loss margin
    decimals: int = 3

    def final(self, res: dict) -> float:
        """Its final value in a run: the layer mean at the last probe record, or the last per-probe value."""
        return last(res, self.metric) if self.site is None else final_site_mean(res, self.site, self.metric)

    def trajectory(self, res: dict) -> np.ndarray:
        """Its value at each probe record (the layer mean)."""
        if self.site is None:
            return np.array([math.nan if v is None else float(v) for v in res.get(self.metric) or []], float)
        layers = layer_series(res, self.metric, self.site)
        return nanmean(layers, axis=1) if layers.size else np.zeros(0)

    def per_layer(self, res: dict) -> np.ndarray:
        """Its value per layer at the last probe record (empty for a loss)."""
        if self.site is None:
            return np.zeros(0)
        layers = layer_series(res, self.metric, self.site)
        return layers[-1] if layers.size else np.zeros(0)


QUANTITIES = (
    Quantity("pr_sv", "key PR (pr_sv)", "k_norm", "pr_sv", decimals=2),
    Quantity("pr_var", "centered key PR (pr_var)", "k_norm", "pr_var", decimals=2),
    Quantity("key_norm", "key norm", "k_norm", "norm_mean"),
    Quantity("max_abs", "largest key component |k_i| (max_abs)", "k_norm", "max_abs"),
    Quantity("logit_max", "largest attention logit", "attn", "logit_max", decimals=2),
    Quantity("entropy", "attention entropy (nats)", "attn", "entropy"),
    Quantity("sink_mass", "attention sink mass", "attn", "sink_mass"),
    Quantity("val_loss", "validation loss", None, "val_loss", loss=True, decimals=4),
    Quantity("loss", "training loss", None, "loss", loss=True, decimals=4),
)


@dataclass(frozen=True)
class ConditionRuns:
    """What the kind decides: the runs by condition, and the condition the others are compared with (None: every
    pair)."""

    runs: dict
    baseline: str | None = None


def comparisons(conditions: list[str], baseline: str | None) -> list[tuple[str, str]]:
    """(x, y) read as x minus y: each condition minus the baseline, else every pair in the study's order."""
    if baseline is not None:
        return [(c, baseline) for c in conditions if c != baseline]
    return list(combinations(conditions, 2))


@dataclass(frozen=True)
class ConditionsAnalysis:
    runs: dict  # condition -> [results dict per seed], as compared
    conditions: list[str]  # in the study's order
    baseline: str | None
    margin: float
    loss_margin: float
    decisions: dict  # quantity key -> {(x, y): Decision}, one family per quantity
    summary: dict  # quantity key -> condition -> {"mean", "ci95", "n"} of the final values
    budget_tokens: float  # the training tokens the final values are taken at (the runs' last probe)


def _summary(values: dict) -> dict:
    x = np.array([v for v in values.values() if math.isfinite(v)], float)
    if not x.size:
        return {"mean": None, "ci95": None, "n": 0}
    mean, half = mean_ci95(x) if x.size > 1 else (float(x[0]), math.nan)
    return {"mean": float(mean), "ci95": None if not math.isfinite(half) else float(half), "n": int(x.size)}


def analyze(inputs: ConditionRuns, margin: float, loss_margin: float) -> ConditionsAnalysis:
    runs = {c: runs_of(inputs.runs, c) for c in inputs.runs if runs_of(inputs.runs, c)}
    conds = list(runs)
    pairs = comparisons(conds, inputs.baseline)  # a baseline with no runs left: its comparisons have no paired values
    decisions, summary = {}, {}
    for q in QUANTITIES:
        finals = {c: by_seed(runs[c], q.final) for c in conds}
        summary[q.key] = {c: _summary(finals[c]) for c in conds}
        family = {(x, y): Paired.of(finals[x], finals.get(y, {})) for x, y in pairs}
        decisions[q.key] = decide(family, loss_margin if q.loss else margin)
    ends = [float(probe_tokens(r)[-1]) for rl in runs.values() for r in rl if probe_tokens(r).size]
    return ConditionsAnalysis(runs, conds, inputs.baseline, margin, loss_margin, decisions, summary,
                              max(ends) if ends else math.nan)
