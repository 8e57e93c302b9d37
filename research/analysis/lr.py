"""Decisions of the learning-rate study: how each condition's final loss depends on the learning rate.

Runs are keyed 'condition@multiplier' (research.results.vocabulary.grid_key): every condition trained at each
multiple of the preset's Muon and AdamW learning rates, with several seeds. Per condition and seed, the
learning-rate sensitivity of Wortsman et al. 2023 (a diverged run counts at the initial loss); conditions are
compared by per-seed differences of their sensitivities, and per multiplier each condition's final loss against
QK-norm's and its largest attention logit against its own at 1x (research.analysis.rules).
The sensitivity's definition and the study's design: docs/decisions.md, "Learning-rate sensitivity".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.rules import LOSS_MARGIN, MARGIN, Decision, Paired, decide
from research.analysis.stats import mean_ci95
from research.results.read import last, layer_series, pair_key, probe_tokens
from research.results.values import as_float
from research.results.vocabulary import LR_CONDITIONS, split_grid_key

REFERENCE = "QK"  # the condition the others' losses are compared with, per multiplier
BASE_MULTIPLIER = 1.0
PAIRS = (("QK", "NoQK"), ("QK_frozen", "NoQK"), ("NoQK_clip", "NoQK"), ("QK", "NoQK_clip"))


def max_logit_series(res: dict) -> np.ndarray:
    """[n_probes] the largest attention logit (over layers and query heads) at each probe."""
    out = []
    for probe in res.get("probes") or []:
        values = [as_float(v) for rec in probe["layers"] for v in (rec.get("attn") or {}).get("logit_max", [])]
        out.append(max(values) if values else math.nan)
    return np.array(out, dtype=float)


@dataclass(frozen=True)
class Run:
    """One (condition, multiplier, seed) run, reduced to what the study reports."""

    seed: object  # research.results.read.pair_key: None for a run paired with nothing
    final_loss: float  # NaN when diverged
    init_loss: float
    diverged_step: int | None
    max_logit: float  # at the last probe
    pr: float  # final mean_pr (k_norm pr_sv, mean over layers)
    key_norm: float  # final k_norm norm_mean, mean over layers
    tokens: np.ndarray  # probe tokens
    logit_series: np.ndarray  # max logit per probe

    @staticmethod
    def of(res: dict) -> "Run":
        norms = layer_series(res, "norm_mean")
        diverged = (res.get("diverged") or {}).get("step")
        series = max_logit_series(res)
        return Run(pair_key(res), math.nan if diverged is not None else last(res, "val_loss"),
                   as_float(res.get("init_val_loss")), diverged, float(series[-1]) if res.get("probes") else math.nan,
                   last(res, "mean_pr"), float(np.nanmean(norms[-1])) if norms.size else math.nan, probe_tokens(res),
                   series)

    @property
    def capped_loss(self) -> float:
        """min(final loss, l0), with a diverged run at l0: Wortsman et al.'s per-run term."""
        return self.init_loss if not math.isfinite(self.final_loss) else min(self.final_loss, self.init_loss)


def grid(runs: dict) -> dict[str, dict[float, list[Run]]]:
    """{condition: {multiplier: [Run per seed]}} from {'cond@m': [results dicts]}, conditions in study order."""
    out: dict[str, dict[float, list[Run]]] = {}
    for key, results in runs.items():
        cond, m = split_grid_key(key)
        out.setdefault(cond, {})[m] = [Run.of(r) for r in results]
    order = [c for c in LR_CONDITIONS if c in out] + sorted(c for c in out if c not in LR_CONDITIONS)
    return {c: dict(sorted(out[c].items())) for c in order}


def _capped_by_seed(by_m: dict[float, list[Run]]) -> dict:
    """{seed: [min(final loss, l0) at each multiplier that seed ran]}."""
    per_seed: dict = {}
    for runs in by_m.values():
        for r in runs:
            if r.seed is not None:  # a run without a seed is paired with nothing
                per_seed.setdefault(r.seed, []).append(r.capped_loss)
    return per_seed


def sensitivity(by_m: dict[float, list[Run]]) -> dict:
    """{seed: Wortsman et al.'s learning-rate sensitivity} over the seeds that ran every multiplier."""
    return {s: float(np.mean(v) - np.min(v)) for s, v in _capped_by_seed(by_m).items() if len(v) == len(by_m)}


def best_loss(by_m: dict[float, list[Run]]) -> dict:
    """{seed: the best final loss over the grid}."""
    return {s: float(np.min(v)) for s, v in _capped_by_seed(by_m).items()}


def highest_stable(by_m: dict[float, list[Run]]) -> float | None:
    """The largest multiplier at which no seed diverged."""
    stable = [m for m, runs in by_m.items() if runs and all(r.diverged_step is None for r in runs)]
    return max(stable) if stable else None


def _per_seed(runs: list[Run], attr: str) -> dict:
    return {r.seed: getattr(r, attr) for r in runs if r.seed is not None}


def onset(by_m: dict[float, list[Run]], reference: dict[float, list[Run]] | None, margin: float,
          loss_margin: float) -> tuple[dict, dict]:
    """({m: Decision} final loss vs the reference condition's, {m: Decision} final max logit vs this condition's
    own at 1x): where the loss degrades and where the logits grow, each family Bonferroni-corrected."""
    loss = {m: Paired.of(_per_seed(runs, "capped_loss"), _per_seed(reference[m], "capped_loss"))
            for m, runs in by_m.items() if reference and m in reference}
    base = by_m.get(BASE_MULTIPLIER)
    logits = {m: Paired.of(_per_seed(runs, "max_logit"), _per_seed(base, "max_logit"))
              for m, runs in by_m.items() if base and m != BASE_MULTIPLIER}
    return decide(loss, loss_margin), decide(logits, margin)


@dataclass(frozen=True)
class LRAnalysis:
    grid: dict  # condition -> multiplier -> [Run]
    multipliers: list[float]
    sensitivity: dict  # condition -> {seed: value}
    sensitivity_ci: dict  # condition -> (mean, CI half width)
    best: dict  # condition -> {seed: best final loss}
    decisions: dict  # (x, y) -> Decision on sensitivity
    highest_stable: dict  # condition -> multiplier or None
    loss_onset: dict  # condition -> {m: Decision vs QK}
    logit_onset: dict  # condition -> {m: Decision vs its own 1x}
    margin: float
    loss_margin: float

    def first(self, decisions: dict[float, Decision], sign: int) -> float | None:
        """The smallest multiplier whose difference lies beyond the margin with the given sign."""
        hits = [m for m, d in decisions.items() if d.differs and np.sign(d.diff) == sign]
        return min(hits) if hits else None

    @staticmethod
    def undecided(decisions: dict[float, Decision]) -> list[float]:
        """The multipliers whose comparison has no settled size: inconclusive, size unresolved, or one seed."""
        return [m for m, d in decisions.items() if not d.decided]


def analyze(runs: dict, margin: float = MARGIN, loss_margin: float = LOSS_MARGIN) -> LRAnalysis:
    g = grid(runs)
    sens = {c: sensitivity(by_m) for c, by_m in g.items()}
    best = {c: best_loss(by_m) for c, by_m in g.items()}
    family = {}
    for x, y in PAIRS:
        if sens.get(x) and sens.get(y):
            p = Paired.of(sens[x], sens[y])
            scale = float(np.mean([*best[x].values(), *best[y].values()]))  # margins are shares of the best loss
            family[(x, y)] = Paired(p.diffs, p.mean_a, p.mean_b, scale, p.seeds)
    # the reference is not compared with itself
    onsets = {c: onset(by_m, None if c == REFERENCE else g.get(REFERENCE), margin, loss_margin)
              for c, by_m in g.items()}
    return LRAnalysis(grid=g, multipliers=sorted({m for by_m in g.values() for m in by_m}), sensitivity=sens,
                      sensitivity_ci={c: mean_ci95(list(v.values())) for c, v in sens.items()}, best=best,
                      decisions=decide(family, loss_margin),
                      highest_stable={c: highest_stable(b) for c, b in g.items()},
                      loss_onset={c: o[0] for c, o in onsets.items() if c != REFERENCE},
                      logit_onset={c: o[1] for c, o in onsets.items()}, margin=margin, loss_margin=loss_margin)
