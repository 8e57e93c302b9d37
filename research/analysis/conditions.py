"""Decisions of a study of any conditions (a study file, research/study.py): each condition against the baseline,
or every pair of conditions when the study names none, in each quantity of QUANTITIES and KV_QUANTITIES.

Pure functions of results dicts (runs: condition -> one results dict per seed), decided by research.analysis.rules,
paired by seed, after research.analysis.identity has cut every run at the budget they all reached. The study's
primary quantities form ONE family; every other quantity is an exploratory family of its own.
A quantity's final value is its mean over layers at the last probe (a key cache's: its results.json section).
The families, the margins (LOGIT_MARGIN, KV_LOSS_MARGIN) and their error rates: docs/decisions.md, "Studies of any
conditions"; the quantities and what a study file may name primary: docs/study_files.md.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from itertools import combinations
from typing import Literal

import numpy as np

from configs.config import ConfigError
from configs.measured import KEY_CACHE, PROBE
from research.analysis.rules import (DIFFERENT, EQUAL, INCONCLUSIVE, UNRESOLVED, WITHIN, Decision, Margin, Paired,
                                     by_seed, compared_on, decide, k_of, runs_of)
from research.analysis.series import nanmean
from research.analysis.stats import mean_ci95
from research.results.read import final_site_mean, kv_layers, kv_series, kv_value, last, layer_series, probe_tokens
from research.results.vocabulary import KV_CACHE
from utils.errors import shown

# The largest attention logit's margin, in logits (docs/decisions.md, "Studies of any conditions", says why 0.25)
LOGIT_MARGIN = 0.25
# The margin of a loss change with quantized keys, itself a share of the loss: 0.1% of it (docs/decisions.md, "Studies
# of any conditions", says why; --loss_margin's 0.5% was 12-50 times every condition's own 4-bit cost)
KV_LOSS_MARGIN = 0.001


@dataclass(frozen=True)
class Quantity:
    key: str  # as combined.json and the figure names spell it
    text: str  # for people
    site: str | None  # the probe record's site.metric it is the layer mean of; None: a per-probe top-level field
    metric: str
    margin: Literal["key", "loss", "logit", "loss_share"] = "key"  # --margin, --loss_margin (shares of the pair's
    #   mean), the absolute logit margin (ConditionRuns.logit_margin), or the key cache's loss margin as an absolute
    #   margin (ConditionRuns.kv_loss_margin: a loss change that is already a share of the loss)
    decimals: int = 3
    unit: str = ""  # of its values and differences, where it has one
    kv: tuple[str, ...] = ()  # where in results.json's kv_cache section it is read (research.results.read.kv_value)

    @property
    def needs(self) -> str:
        """What measures it (configs.measured): the key cache's section, or the probe."""
        return KEY_CACHE if self.kv else PROBE

    @property
    def layered(self) -> bool:
        """Whether it has a value per layer (a probed quantity, or a key cache error; not a loss)."""
        return self.site is not None or (bool(self.kv) and self.kv[0] not in ("loss", "format"))

    def final(self, res: dict) -> float:
        """Its final value in a run: the layer mean at the last probe record, the last per-probe value, or the key
        cache section's value."""
        if self.kv:
            return kv_value(res.get(KV_CACHE), self.kv)
        return last(res, self.metric) if self.site is None else final_site_mean(res, self.site, self.metric)

    def trajectory(self, res: dict) -> np.ndarray:
        """Its value at each probe record (the layer mean)."""
        if self.kv:
            return kv_series(res, self.kv)
        if self.site is None:
            return np.array([math.nan if v is None else float(v) for v in res.get(self.metric) or []], float)
        layers = layer_series(res, self.metric, self.site)
        return nanmean(layers, axis=1) if layers.size else np.zeros(0)

    def per_layer(self, res: dict) -> np.ndarray:
        """Its value per layer at the last probe record (empty for a loss)."""
        if self.kv:
            return kv_layers(res.get(KV_CACHE), self.kv) if self.layered else np.zeros(0)
        if self.site is None:
            return np.zeros(0)
        layers = layer_series(res, self.metric, self.site)
        return layers[-1] if layers.size else np.zeros(0)


QUANTITIES = (
    Quantity("pr_sv", "key PR (pr_sv)", "k_norm", "pr_sv", decimals=2),
    Quantity("pr_var", "centered key PR (pr_var)", "k_norm", "pr_var", decimals=2),
    Quantity("key_norm", "key norm", "k_norm", "norm_mean"),
    Quantity("max_abs", "largest key component |k_i| (max_abs)", "k_norm", "max_abs"),
    Quantity("logit_max", "largest attention logit", "attn", "logit_max", margin="logit", decimals=2, unit="logits"),
    Quantity("entropy", "attention entropy (nats)", "attn", "entropy", unit="nats"),
    Quantity("sink_mass", "attention sink mass", "attn", "sink_mass"),
    Quantity("val_loss", "validation loss", None, "val_loss", margin="loss", decimals=4, unit="nats"),
    Quantity("loss", "training loss", None, "loss", margin="loss", decimals=4, unit="nats"),
)
# What a key cache costs (docs/probing.md): the keys' rank at 90% energy after RoPE, their energy in rotary pairs too
# slow to turn within the training context, the loss change with every key quantized per token before RoPE at 4 and 3
# bits (a share of the unquantized loss: its margin is KV_LOSS_MARGIN, absolute), the logits' error with 4-bit keys,
# and the loss change with every key in each key-cache format engines ship (the same share and margin).
KV_QUANTITIES = (
    Quantity("rank90", "key rank at 90% energy after RoPE (rank90)", "k_rope", "rank90", decimals=2),
    Quantity("low_freq_share", "keys' energy share in low rotary frequencies", "k_norm", "low_freq_share"),
    Quantity("kv_loss_4bit", "loss change with 4-bit keys (share of the loss)", None, "kv_loss_4bit",
             margin="loss_share", decimals=4, kv=("loss", "4")),
    Quantity("kv_loss_3bit", "loss change with 3-bit keys (share of the loss)", None, "kv_loss_3bit",
             margin="loss_share", decimals=4, kv=("loss", "3")),
    Quantity("kv_logit_error_4bit", "logit error with 4-bit keys", None, "kv_logit_error_4bit",
             kv=("quantized", "pre_rope", "per_token", "4", "logit_error")),
    # the formats engines ship (research.probing.key_formats), every key in it after RoPE, as the engines cache it
    *(Quantity(f"kv_loss_{f}", f"loss change with {f} keys (share of the loss)", None, f"kv_loss_{f}",
               margin="loss_share", decimals=4, kv=("format", f))
      for f in ("fp8_e4m3", "fp8_e5m2", "nvfp4", "mxfp4", "q8_0", "q4_0", "nvfp4+keep32", "q4_0+keep32")),
)
ALL_QUANTITIES = QUANTITIES + KV_QUANTITIES
KEYS = tuple(q.key for q in ALL_QUANTITIES)
# How a message lists them: the formats' loss changes as one entry (docs/probing.md, "Key-cache formats")
KEYS_TEXT = ", ".join([k for k in KEYS if not (k.startswith("kv_loss_") and not k.endswith("bit"))]
                      + ["kv_loss_<format> of the key-cache formats"])


def primary_needs(primary) -> dict[str, str]:
    """{'primary quantity <key>': what measures it} of a study's primary quantities: what its runs' configs must
    measure (configs.measured.check_measured)."""
    return {f"primary quantity {q.key}": q.needs for q in ALL_QUANTITIES if q.key in primary}


def check_primary(value) -> tuple[str, ...]:
    """A study's primary quantities (a non-empty list of distinct keys of QUANTITIES) as a tuple; ConfigError (one
    line: what is wrong and the fix) otherwise. The one check of a study file's `primary` and of study.json's."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"primary: expected a non-empty list of quantity keys ({KEYS_TEXT}), found "
                          f"{shown(value, 60)}. Fix: e.g. primary: [logit_max, val_loss], or leave primary out")
    for key in value:
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, n=1)
            raise ConfigError(f"primary: {shown(key, 40)} is not a quantity of the study ({KEYS_TEXT})"
                              + (f"; did you mean {close[0]!r}?" if close else ".") + " Fix: name quantities of "
                              "that list")
    twice = sorted({k for k in value if value.count(k) > 1}, key=KEYS.index)
    if twice:
        raise ConfigError(f"primary: {', '.join(twice)} named more than once. Fix: name each quantity once")
    return tuple(value)


@dataclass(frozen=True)
class ConditionRuns:
    """What the kind decides: the runs by condition, and the study file's settings that travel with them in
    study.json (research.results.layout.write_study_index)."""

    runs: dict
    baseline: str | None = None  # the condition the others are compared with (None: every pair)
    primary: tuple[str, ...] = ()  # the quantities read as one family and stated as findings (check_primary)
    logit_margin: float | None = None  # the largest logit's margin in logits (None: LOGIT_MARGIN)
    kv_loss_margin: float | None = None  # a quantized-key loss change's margin, a share of the loss (KV_LOSS_MARGIN)


def comparisons(conditions: list[str], baseline: str | None) -> list[tuple[str, str]]:
    """(x, y) read as x minus y: each condition minus the baseline, else every pair in the study's order."""
    if baseline is not None:
        return [(c, baseline) for c in conditions if c != baseline]
    return list(combinations(conditions, 2))


# How "In short" reads a tested comparison (an untested one reads as its outcome: rules.UNTESTED)
BEYOND, INSIDE, REAL, OPEN = ("differs beyond the margin", "lies within the margin",
                              "differs, by a size the margin does not settle", "is not decided")
READING = {DIFFERENT: BEYOND, EQUAL: INSIDE, WITHIN: INSIDE, UNRESOLVED: REAL, INCONCLUSIVE: OPEN}


def reading(d: Decision) -> str:
    """What a comparison's line in "In short" says of it: BEYOND, INSIDE, REAL, OPEN, or its untested outcome."""
    return READING.get(d.outcome, d.outcome)


@dataclass(frozen=True)
class ConditionsAnalysis:
    runs: dict  # condition -> [results dict per seed], as compared
    conditions: list[str]  # in the study's order
    baseline: str | None
    margin: float
    loss_margin: float
    decisions: dict  # quantity key -> {(x, y): Decision}
    summary: dict  # quantity key -> condition -> {"mean", "ci95", "n"} of the final values
    budget_tokens: float  # the training tokens the final values are taken at (the runs' last probe)
    logit_margin: float  # the largest logit's margin, in logits
    primary: tuple[str, ...]  # the quantities read as one family (in ALL_QUANTITIES order); () for none
    family_k: dict  # quantity key -> the k of the family its comparisons were decided in (the primaries share one)
    quantities: tuple[Quantity, ...] = QUANTITIES  # those decided: QUANTITIES, and the KV_QUANTITIES runs hold
    kv_loss_margin: float = KV_LOSS_MARGIN  # a quantized-key loss change's margin, a share of the loss

    def margin_of(self, q: Quantity) -> Margin:
        return quantity_margin(q, self.margin, self.loss_margin, self.logit_margin, self.kv_loss_margin)

    @property
    def stated(self) -> tuple[Quantity, ...]:
        """The quantities "In short" states findings about: the primary ones, else all (each its own family)."""
        return tuple(q for q in self.quantities if q.key in self.primary) if self.primary else self.quantities

    @property
    def exploratory(self) -> tuple[Quantity, ...]:
        """With primary quantities, the others: decided in their own families, not stated as findings."""
        return tuple(q for q in self.quantities if q.key not in self.primary) if self.primary else ()

    @property
    def baseline_set_aside(self) -> bool:
        """The study names a baseline whose runs were all set aside (research.analysis.identity)."""
        return self.baseline is not None and self.baseline not in self.conditions

    def reference(self, pair: tuple[str, str]) -> str:
        """The condition a difference is given as a share of: the baseline, else the first condition named."""
        return pair[1] if self.baseline is not None else pair[0]

    def of_reference(self, pair: tuple[str, str], d: Decision) -> float:
        """The difference as a share of the reference condition's mean over the paired seeds; NaN at 0, and NaN
        where the margin is absolute and the reference lies inside it (a loss change of 0.0001 against a margin of
        0.005: "+223% of QK" would be a share of noise). Decided on log ratios, the ratio's: x/y - 1 of the baseline
        y, 1 - y/x of the first condition x."""
        if d.ratio:
            return math.expm1(d.est) if self.baseline is not None else -math.expm1(-d.est)
        ref = d.mean_b if self.baseline is not None else d.mean_a
        if not ref or not math.isfinite(ref) or (d.share is None and abs(ref) <= d.margin):
            return math.nan
        return d.diff / abs(ref)

    def in_short(self) -> dict:
        """{(x, y): [(Quantity, Decision)]}: what "In short" states, per comparison, about the stated quantities;
        research.simulations.conditions counts its error rates from this."""
        return {p: [(q, self.decisions[q.key][p]) for q in self.stated] for p in next(iter(self.decisions.values()),
                                                                                      {})}


def quantity_margin(q: Quantity, margin: float, loss_margin: float, logit_margin: float,
                    kv_loss_margin: float = KV_LOSS_MARGIN) -> Margin:
    """The margin a quantity's comparisons are read against."""
    return {"key": Margin(margin), "loss": Margin(loss_margin), "logit": Margin(logit_margin, absolute=True),
            "loss_share": Margin(kv_loss_margin, absolute=True)}[q.margin]


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
    families, summary, held = {}, {}, []
    for q in ALL_QUANTITIES:
        finals = {c: by_seed(runs[c], q.final) for c in conds}
        if q in QUANTITIES or q.key in inputs.primary or any(math.isfinite(v) for f in finals.values()
                                                                 for v in f.values()):
            held.append(q)
            summary[q.key] = {c: _summary(finals[c]) for c in conds}
            families[q.key] = {(x, y): Paired.of(finals[x], finals.get(y, {}), compared_on(q.metric),
                                                 (f"{x}'s final {q.key}", f"{y}'s final {q.key}")) for x, y in pairs}
    primary = tuple(q.key for q in held if q.key in inputs.primary)
    k_primary = sum(k_of(families[key]) for key in primary)  # Bonferroni over every comparison of every primary
    family_k = {q.key: k_primary if q.key in primary else k_of(families[q.key]) for q in held}
    logit_margin = LOGIT_MARGIN if inputs.logit_margin is None else inputs.logit_margin
    kv_loss_margin = KV_LOSS_MARGIN if inputs.kv_loss_margin is None else inputs.kv_loss_margin
    decisions = {q.key: decide(families[q.key], quantity_margin(q, margin, loss_margin, logit_margin, kv_loss_margin),
                               k=family_k[q.key]) for q in held}
    ends = [float(probe_tokens(r)[-1]) for rl in runs.values() for r in rl if probe_tokens(r).size]
    return ConditionsAnalysis(runs, conds, inputs.baseline, margin, loss_margin, decisions, summary,
                              max(ends) if ends else math.nan, logit_margin, primary, family_k, tuple(held),
                              kv_loss_margin)
