"""Decisions of the QK-norm study: learned gain (A), gain frozen at 1 (B), no QK-norm (C).

Pure functions of results dicts (runs: condition -> one results dict per seed), decided by research.analysis.rules:
`pair_decisions` and `family_decisions` (the three pairs and the difference of the steps, one family),
`triangulate` (the verdict: the gain drives it, the normalization does, both, ...), `decomposition` (A - B split
into the gain's arithmetic and the keys' geometry), `ablation` (the gains replaced by 1 or by their mean),
`layer_effects` (per layer), and `analyze`: all of it, and the write-ups' claims (research.analysis.claims).
"Final" values are the last entry of a run's `mean_pr`, `loss` and `val_loss`.
The verdict table and worked examples: docs/decisions.md, "Verdicts of the QK-norm study".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.claims import claims
from research.analysis.rules import (DESCRIPTIVE, DIFFERENCE, DIFFERENT, EQUAL, FINAL_FIELDS, INCONCLUSIVE, LOSS_MARGIN,
                                     MARGIN, NO_DATA, NO_SPREAD, RATIO, UNRESOLVED, WITHIN, Decision, Paired, by_seed,
                                     compared_on, conditions, decide, final_value, finals, runs_of)
from research.analysis.wording import conflict, effect_text, needed_text, untested_text
from research.analysis.stats import mean_ci95
from research.results.read import d_head_of, final_site_mean, layer_keys, seed_of
from research.results.values import as_float, json_safe
from research.results.vocabulary import ABLATION_MODES, MAIN_SITE, PRE_GAIN_SITES, QK_CONDITIONS, QK_PAIRS, label

PAIRS = QK_PAIRS
STEPS = "steps"  # (A-B) - (B-C) = A - 2B + C: the gain's step minus the normalization's, per seed
STEP = dict(zip(PAIRS + (STEPS,), ("the gain's effect (A\u2212B)", "the normalization's effect (B\u2212C)",
                                   "QK-norm's whole effect (A\u2212C)",
                                   "the difference of the steps ((A\u2212B)\u2212(B\u2212C))")))
# On log ratios the steps are ratios: ln(A/B) - ln(B/C) = ln((A/B) / (B/C)), and ln(A/B) + ln(B/C) = ln(A/C)
STEP_RATIO = dict(zip(PAIRS + (STEPS,), ("the gain's effect (A/B)", "the normalization's effect (B/C)",
                                         "QK-norm's whole effect (A/C)",
                                         "the difference of the steps ((A/B)/(B/C))")))
DRIVER = {PAIRS[0]: "gain", PAIRS[1]: "normalization"}  # the step each pair measures, as the verdict key names it


def step_difference(runs: dict, field: str) -> Paired | None:
    """Per seed that ran A, B and C: (A-B) - (B-C) = A - 2B + C; None unless all three ran. Its scale (the margin
    is a share of it) is A-C's, the mean of A and C: with A-C it tells which step is the larger by the margin
    (|A-B| - |B-C| is the smaller of |A-2B+C| and |A-C| when the two have the same sign as A-B, minus it when
    their signs differ; docs/decisions.md). A ratio quantity (rules.compared_on) takes the same steps on log ratios:
    ln(A/B) - ln(B/C) = ln(A) - 2 ln(B) + ln(C), its difference in units kept beside it."""
    if not all(runs.get(c) for c in QK_CONDITIONS):
        return None
    a, b, c = (finals(runs, x, field) for x in QK_CONDITIONS)
    seeds = [s for s in a if s in b and s in c and all(math.isfinite(v[s]) for v in (a, b, c))]
    xa, xb, xc = (np.array([v[s] for s in seeds], float) for v in (a, b, c))
    on = RATIO if compared_on(field) == RATIO else DIFFERENCE
    if not seeds:
        return Paired(np.zeros(0), math.nan, math.nan, math.nan, on=on)
    units = (xa - xb) - (xb - xc)
    args = (float((xa - xb).mean()), float((xb - xc).mean()), (abs(float(xa.mean())) + abs(float(xc.mean()))) / 2,
            tuple(seeds))
    if on == RATIO:  # the pairs' Paired.of has refused any value 0 or below already
        return Paired(np.log(xa) - 2 * np.log(xb) + np.log(xc), *args, on=RATIO, raw=units)
    return Paired(units, *args)


def family_decisions(runs: dict, field: str, margin: float = MARGIN) -> tuple[dict, Decision | None]:
    """The pairs of conditions present in one final quantity (x minus y), and with all three conditions the
    difference of the steps (STEPS), decided in ONE family: k = 4 then, so the verdict that reads all four is
    right with 95% probability (docs/decisions.md). ({(x, y): Decision}, Decision or None)."""
    family = {(x, y): Paired.of(finals(runs, x, field), finals(runs, y, field), compared_on(field),
                                (f"{x}'s final {field}", f"{y}'s final {field}"))
              for x, y in PAIRS if runs.get(x) and runs.get(y)}
    steps = step_difference(runs, field)
    if steps is not None:
        family[STEPS] = steps
    dec = decide(family, margin)
    return {p: d for p, d in dec.items() if p != STEPS}, dec.get(STEPS)


def pair_decisions(runs: dict, field: str, margin: float = MARGIN) -> dict:
    """{(x, y): Decision} for the pairs of conditions present, in one final quantity (x minus y), decided in the
    family that also holds the difference of the steps (family_decisions)."""
    return family_decisions(runs, field, margin)[0]


@dataclass(frozen=True)
class Verdict:
    # gain / normalization / contribute / both / opposite / small / cancel / neither: a driver, or its absence, is
    # named; inconclusive / qknorm (A and C only) / descriptive / none: it is not
    key: str
    text: str


def describe(pair: tuple, d: Decision) -> str:
    """One step of the verdict with its estimate: "the gain's effect (A-B) -4.9% [-8.1%, -1.6%] lies beyond
    the margin"."""
    what = f"{(STEP_RATIO if d.ratio else STEP)[pair]} {effect_text(d)}"
    return what + {EQUAL: " lies within the margin",
                   WITHIN: " is real but lies within the margin",
                   DIFFERENT: " lies beyond the margin",
                   UNRESOLVED: f" is real, but whether it exceeds the margin is unresolved{needed_text(d)}",
                   INCONCLUSIVE: f" is inconclusive{needed_text(d)}"}.get(d.outcome, "")


def _confirms(ac: Decision, step: Decision) -> bool:
    """A-C is real and has the sign of the step that drives it."""
    return ac.significant and np.sign(ac.est) == np.sign(step.est)


def _larger(driver: tuple, dec: dict, steps: Decision | None) -> bool | None:
    """Whether the driver's step (PAIRS[0]: the gain, PAIRS[1]: the normalization) is shown larger than the other
    step by the margin. |A-B| - |B-C| is min(|A-2B+C|, |A-C|) when A-2B+C and A-C share a sign and minus it when
    they do not, so: True when both lie beyond the margin, A-C with the driver's sign and A-2B+C with it for the
    gain, against it for the normalization; False when A-2B+C lies inside the margin (the steps differ by less
    than it; the driver's step being beyond it, the other step then has its sign); None otherwise."""
    ac, step = dec[PAIRS[2]], dec[driver]
    if steps is None or not steps.tested:
        return None
    sign = np.sign(step.est) * (1 if driver == PAIRS[0] else -1)
    if steps.differs and ac.differs and np.sign(steps.est) == sign and np.sign(ac.est) == np.sign(step.est):
        return True
    return False if steps.same else None


def triangulate(dec: dict, what: str = "it", steps: Decision | None = None) -> Verdict:
    """Which of the gain (A-B) and the normalization (B-C) moves `what`, read off the three pairs' intervals
    and that of the difference of the steps (`steps`, (A-B) - (B-C), decided in the pairs' family;
    family_decisions); docs/decisions.md has the table and a worked example of each verdict.

    A single driver is named only when its step lies beyond the margin, the other step inside it, and its step
    is shown larger than the other by the margin (A-2B+C and A-C beyond it, with the driver's signs). Steps
    that differ by less than the margin: both contribute. Every text carries the estimates."""
    ab, bc, ac = (dec.get(p) for p in PAIRS)
    if not (ab and bc):
        return _without_frozen(ac, what)
    margin = (f"\u00b1{ab.share:.1%} of the pair's mean, on log ratios" if ab.ratio and ab.share is not None else
              f"\u00b1{ab.margin / ab.scale:.1%}" if ab.scale and math.isfinite(ab.scale) else "the margin")
    shown = list(zip(PAIRS, (ab, bc, ac))) + ([(STEPS, steps)] if steps is not None else [])
    text = "; ".join(describe(p, d) for p, d in shown)

    def verdict(key: str, head: str) -> Verdict:
        return Verdict(key, f"{head}; margin {margin}: {text}")
    if not (ab.tested and bc.tested):
        outcomes = (ab.outcome, bc.outcome)
        return verdict("descriptive", "no verdict, " + ("one seed per condition (descriptive only)"
                                                        if DESCRIPTIVE in outcomes else
                                                        "a step with no spread (every seed differs by the same "
                                                        "amount: no interval)" if NO_SPREAD in outcomes else
                                                        "no seed that A, B and C all ran"))
    if not (ab.decided and bc.decided):
        return verdict("inconclusive", "inconclusive: the size of " + " and of ".join(
            STEP[p].split(" (")[0] for p, d in zip(PAIRS, (ab, bc)) if not d.decided) + " is not settled")
    single = _single_driver(dec, steps, what, verdict)
    if single is not None:
        return single
    if ab.differs and bc.differs:
        if np.sign(ab.est) != np.sign(bc.est):
            return verdict("opposite", f"both the gain and the normalization change {what}, in opposite directions"
                           + (", and cancel" if ac.same else ""))
        if _confirms(ac, ab):
            return verdict("both", f"both the gain and the normalization drive {what}, in the same direction")
        return verdict("inconclusive", "inconclusive: A\u2212B and B\u2212C point to both, but A\u2212C "
                                       "does not confirm it")
    # both steps lie within the margin
    if ac.differs:
        return verdict("small", f"QK-norm as a whole changes {what} beyond the margin, but neither the gain nor the "
                                f"normalization alone does")
    if not ac.decided:
        return verdict("inconclusive", "inconclusive: neither step exceeds the margin, but whether QK-norm as a "
                                       "whole does is not settled")
    if ab.significant and bc.significant and np.sign(ab.est) != np.sign(bc.est):
        return verdict("cancel", f"the gain and the normalization change {what} a little, in opposite directions, "
                                 f"and cancel")
    return verdict("neither", f"neither: QK-norm changes {what} by less than the margin")


def _without_frozen(ac: Decision | None, what: str) -> Verdict:
    """triangulate's verdict without the frozen-gain run (B): QK-norm as a whole (A-C) at most."""
    if not ac:
        return Verdict("none", "no verdict: the gain and the normalization are separated only with all three "
                               "conditions (QK, QK_frozen, NoQK)")
    if not ac.tested:
        why = {DESCRIPTIVE: "one seed per condition (descriptive only)", NO_DATA: NO_DATA}.get(ac.outcome) or \
            untested_text(ac, 2)
        return Verdict("descriptive", f"no verdict, {why}: {describe(PAIRS[2], ac)}; without the frozen-gain "
                                      f"run (B) gain and normalization cannot be separated")
    head = {DIFFERENT: f"QK-norm changes {what}", EQUAL: f"QK-norm changes {what} by less than the margin",
            WITHIN: f"QK-norm changes {what} by less than the margin"}.get(ac.outcome)
    return Verdict("qknorm" if head else "inconclusive",
                   f"{head or 'inconclusive'}: {describe(PAIRS[2], ac)}; without the frozen-gain run (B) gain "
                   f"and normalization cannot be separated")


def _single_driver(dec: dict, steps: Decision | None, what: str, verdict) -> Verdict | None:
    """triangulate's verdict where one step lies beyond the margin and the other within it (the gain or the
    normalization drives `what`, both contribute, or inconclusive); None where no step alone is beyond it."""
    ac = dec.get(PAIRS[2])
    for driver, other in ((PAIRS[0], PAIRS[1]), (PAIRS[1], PAIRS[0])):
        if not (dec[driver].differs and dec[other].same):
            continue
        key, other_key = DRIVER[driver], DRIVER[other]  # "gain", "normalization"
        larger = _larger(driver, dec, steps)
        if larger:
            return verdict(key, f"the {key} drives {what}: its step is larger than the {other_key}'s by at least "
                                f"the margin")
        if not _confirms(ac, dec[driver]):
            return verdict("inconclusive", f"inconclusive: A\u2212B and B\u2212C point to the {key}, but A\u2212C "
                                           f"does not confirm it")
        if larger is False:
            return verdict("contribute", f"both the {key} and the {other_key} contribute to {what}, in the same "
                                         f"direction: the {key}'s step lies beyond the margin and the {other_key}'s "
                                         f"within it, but the two differ by less than the margin")
        return verdict("inconclusive", f"inconclusive: the {key}'s step lies beyond the margin and the {other_key}'s "
                                       f"within it, but the {key}'s is not shown larger than the {other_key}'s by the "
                                       f"margin")
    return None


# ---------------------------------------------------------------------------------------------------------
# The gain's arithmetic against the normalized keys' geometry, and the trained models with the gain replaced


def decomposition(runs: dict, margin: float = MARGIN, headline: dict | None = None) -> dict:
    """The final A - B difference of a key metric split per seed into
    gain:     A's keys minus A's pre-gain keys (what multiplying by the learned gain does), and
    geometry: A's pre-gain keys minus B's keys (how the normalized keys themselves differ),
    for pr_sv and pr_var at k_norm and after RoPE. {(site, metric): {"total"|"gain"|"geometry": Decision}},
    empty without pre-gain records (files written before they existed, or no QK / QK_frozen run).

    The gain part is the gain applied to A's OWN normalized keys: whatever the gain does differently on A's
    geometry than it would on B's (their interaction) is counted in it. At k_norm the total is the headline
    A - B comparison itself (`headline`: field -> pair decisions), so it is decided once; the parts are a
    family of two. After RoPE the total, not shown elsewhere, joins its parts in a family of three."""
    a_runs, b_runs = runs_of(runs, "QK"), runs_of(runs, "QK_frozen")
    if not a_runs or not b_runs:
        return {}
    headline = headline or {}
    out = {}
    for site, pre in PRE_GAIN_SITES.items():
        for metric in ("pr_sv", "pr_var"):
            a = by_seed(a_runs, lambda r: final_site_mean(r, site, metric))
            a_hat = by_seed(a_runs, lambda r: final_site_mean(r, pre, metric))
            b = by_seed(b_runs, lambda r: final_site_mean(r, site, metric))
            if not any(math.isfinite(v) for v in a_hat.values()):
                continue
            on = compared_on(metric)  # on log ratios the parts add up too: ln(A/B) = ln(A/A_hat) + ln(A_hat/B)
            parts = {"gain": Paired.of(a, a_hat, on, (f"QK's final {metric} at {site}", f"QK's at {pre}")),
                     "geometry": Paired.of(a_hat, b, on, (f"QK's final {metric} at {pre}", f"QK_frozen's at {site}"))}
            field = {"pr_sv": "mean_pr", "pr_var": "mean_pr_var"}[metric]
            total = (headline.get(field) or {}).get(PAIRS[0]) if site == MAIN_SITE else None
            if total is None:
                total = Paired.of(a, b, on, (f"QK's final {metric} at {site}", f"QK_frozen's at {site}"))
                out[(site, metric)] = decide({"total": total, **parts}, margin)
            else:
                out[(site, metric)] = {"total": total, **decide(parts, margin)}
    return out


def ablation(runs: dict, margin: float = MARGIN, loss_margin: float = LOSS_MARGIN) -> dict:
    """Per learned-gain run, the gain ablations (research.probing.ablation): {quantity: {mode: Decision}} of
    the trained model with gains replaced (k_ones, q_ones, qk_ones, k_mean, ...) minus the model as trained,
    for the validation loss and the mean PR, over the modes every such run recorded; empty when none did.
    It measures how much the trained model relies on its trained gains, not whether learning them matters."""
    qk = [r for r in runs_of(runs, "QK") if r.get("gain_ablation")]
    if not qk:
        return {}
    modes = [m for m in ABLATION_MODES[1:] if all(m in r["gain_ablation"] for r in qk)]

    def values(mode: str, quantity: str) -> dict:
        return by_seed(qk, lambda r: as_float(r["gain_ablation"][mode][quantity]))
    def paired(mode: str, quantity: str) -> Paired:
        return Paired.of(values(mode, quantity), values("learned", quantity), compared_on(quantity),
                         (f"QK's {quantity} with {mode}", f"QK's {quantity} as trained"))
    return {quantity: decide({mode: paired(mode, quantity) for mode in modes},
                             loss_margin if quantity == "val_loss" else margin)
            for quantity in ("val_loss", "mean_pr")}


def probe_bias(runs: dict) -> dict | None:
    """What isotropic keys would read as pr_var at the probe batch used: D / (1 + D / N) for N tokens
    (the finite-sample bias of the covariance spectrum), and the shortfall from D."""
    for r in (r for c in conditions(runs) for r in runs_of(runs, c)):
        probes, d = r.get("probes") or [], d_head_of(r)[0]
        if probes and d and probes[-1].get("batch"):
            n = int(np.prod(probes[-1]["batch"]))
            isotropic = d / (1 + d / n)
            return {"tokens": n, "d_head": d, "isotropic_pr_var": isotropic, "shortfall": 1 - isotropic / d}
    return None


# ---------------------------------------------------------------------------------------------------------
# Tables and per-layer effects


SUMMARY_NAME = {"mean_pr": "final_pr", "mean_pr_var": "final_pr_var", "loss": "final_loss",
                "val_loss": "final_val_loss"}  # a final field -> its name in summary() (combined.json)


def summary(runs: dict) -> dict:
    """condition -> final PR / train loss / val loss: mean over seeds, 95% CI half width, per-seed values.

    Keys per condition: n, seeds, tokens (final tokens per seed), and for each of final_pr, final_pr_var,
    final_loss, final_val_loss: the mean, `<name>_ci95` (half width; None with one seed) and `<name>_per_seed`.
    Undefined values are None so the dict can go straight into combined.json."""
    out = {}
    for c in conditions(runs):
        rl = runs_of(runs, c)
        entry = {"tag": c, "label": label(c), "n": len(rl), "seeds": [seed_of(r) for r in rl],
                 "tokens": [r["tokens"][-1] if r["tokens"] else None for r in rl]}
        for field, name in SUMMARY_NAME.items():
            values = [final_value(r, field) for r in rl]  # every run, paired or not: a description
            mean, half = mean_ci95(values)
            entry[name] = json_safe(mean)
            entry[f"{name}_ci95"] = json_safe(half)
            entry[f"{name}_per_seed"] = [json_safe(v) for v in values]
        out[c] = entry
    return out


def layer_matrix(run_list: list[dict], layers: list[str], probe: int) -> tuple[np.ndarray, float]:
    """Y[n_runs, n_layers] of layer_pr at the common probe `probe` (-1: last, 0: first); tokens there."""
    tokens = sorted(set.intersection(*(set(r["tokens"]) for r in run_list))) if run_list else []
    if not tokens:
        return np.full((len(run_list), len(layers)), np.nan), math.nan
    t = tokens[probe]
    y = np.full((len(run_list), len(layers)), np.nan)
    for i, r in enumerate(run_list):
        j = r["tokens"].index(t)
        for k, layer in enumerate(layers):
            values = (r.get("layer_pr") or {}).get(layer)
            if values is not None and j < len(values):
                y[i, k] = as_float(values[j])
    return y, float(t)


@dataclass(frozen=True)
class LayerEffect:
    """Per layer, the final layer PR of one condition minus another's, decided per layer (Bonferroni over layers)."""

    a: str
    b: str
    kind: str  # gain (A-B), normalization (B-C) or total (A-C, when B is missing)
    decisions: list  # one Decision per layer (research.plots.common.shown_effect prints each on its own scale)


@dataclass(frozen=True)
class LayerEffects:
    layers: list[str]
    effects: list[LayerEffect]  # empty when fewer than two of the three conditions ran
    one_run_each: bool


def layer_effects(runs: dict, margin: float = MARGIN) -> LayerEffects:
    """The causal decomposition per layer: A-B (gain) and B-C (normalization); A-C when B is missing."""
    have = [c for c in QK_CONDITIONS if runs.get(c)]
    pairs = []
    if "QK" in have and "QK_frozen" in have:
        pairs.append(("QK", "QK_frozen", "gain"))
    if "QK_frozen" in have and "NoQK" in have:
        pairs.append(("QK_frozen", "NoQK", "normalization"))
    if not pairs and "QK" in have and "NoQK" in have:
        pairs.append(("QK", "NoQK", "total"))
    layers = layer_keys([r for c in have for r in runs_of(runs, c)])

    def final_layer(cond: str, layer: str) -> dict:
        return by_seed(runs_of(runs, cond), lambda r: as_float(((r.get("layer_pr") or {}).get(layer) or [None])[-1]))
    effects = []
    for a, b, kind in (pairs if layers else []):
        dec = decide({layer: Paired.of(final_layer(a, layer), final_layer(b, layer), compared_on("layer_pr"),
                                       (f"{a}'s final layer_pr of layer {layer}", f"{b}'s"))
                      for layer in layers}, margin)
        effects.append(LayerEffect(a, b, kind, [dec[layer] for layer in layers]))
    return LayerEffects(layers, effects, all(len(runs_of(runs, c)) == 1 for c in have))


# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QkNormAnalysis:
    """Everything the figures and the report of the QK-norm study draw from."""

    conditions: list[str]
    margin: float  # equivalence margin of key metrics, a share of the mean
    loss_margin: float  # that of losses
    decisions: dict  # field (FINAL_FIELDS) -> {(x, y): Decision}
    steps: dict  # field -> Decision of (A-B) - (B-C), decided in the pairs' family (None without all three)
    verdict: Verdict  # on the final key PR, pr_sv (the write-ups' uncentered PR)
    verdict_pr_var: Verdict  # on the final centered PR, pr_var
    loss_verdict: Verdict  # on the final validation loss
    train_loss_verdict: Verdict  # on the final training loss, shown beside it
    claims: dict  # letter -> Claim
    summary: dict  # combined.json's per-condition finals
    decomposition: dict
    ablation: dict
    layer_effects: LayerEffects
    probe_bias: dict | None
    runs: dict  # the runs decided (condition -> results per seed): the curves the figures draw

    @property
    def descriptive(self) -> bool:
        """One seed per condition: no test, no verdict."""
        return all(not d.tested for d in self.decisions["mean_pr"].values())

    @property
    def undecided(self) -> list:
        """Every (field, pair) whose size the procedure left unsettled (inconclusive or size unresolved)."""
        return [(f, p) for f, ds in self.decisions.items() for p, d in ds.items()
                if d.outcome in (INCONCLUSIVE, UNRESOLVED)]

    def _pr_pairs(self) -> list:
        """The pairs tested in pr_sv and pr_var whose outcomes differ."""
        sv, var = self.decisions["mean_pr"], self.decisions["mean_pr_var"]
        return [p for p in sv if p in var and sv[p].tested and var[p].tested and sv[p].outcome != var[p].outcome]

    @property
    def pr_disagreements(self) -> list:
        """The pairs on which pr_sv and pr_var disagree: their outcomes differ in kind (wording.conflict: one beyond
        the margin and the other inside it, or opposite signs both real), never merely in their intervals."""
        sv, var = self.decisions["mean_pr"], self.decisions["mean_pr_var"]
        return [p for p in self._pr_pairs() if conflict(sv[p], var[p])]

    @property
    def pr_differences(self) -> list:
        """The pairs whose outcomes differ between pr_sv and pr_var without disagreeing: one settles what the other
        leaves open (one decided and the other open, or one real and the other not shown to be)."""
        sv, var = self.decisions["mean_pr"], self.decisions["mean_pr_var"]
        return [p for p in self._pr_pairs() if not conflict(sv[p], var[p])]


def analyze(runs: dict, margin: float = MARGIN, loss_margin: float = LOSS_MARGIN) -> QkNormAnalysis:
    families = {field: family_decisions(runs, field, margin if field.startswith("mean_pr") else loss_margin)
                for field in FINAL_FIELDS}
    decisions = {field: pairs for field, (pairs, _) in families.items()}
    steps = {field: step for field, (_, step) in families.items()}

    def verdict(field: str, what: str) -> Verdict:
        return triangulate(decisions[field], what, steps[field])
    pr, loss = verdict("mean_pr", "key PR"), verdict("val_loss", "the validation loss")
    return QkNormAnalysis(
        conditions=conditions(runs), margin=margin, loss_margin=loss_margin, decisions=decisions, steps=steps,
        verdict=pr, verdict_pr_var=verdict("mean_pr_var", "the centered key PR"), loss_verdict=loss,
        train_loss_verdict=verdict("loss", "the training loss"),
        claims=claims(runs, decisions, pr, loss, margin), summary=summary(runs),
        decomposition=decomposition(runs, margin, decisions), ablation=ablation(runs, margin, loss_margin),
        layer_effects=layer_effects(runs, margin), probe_bias=probe_bias(runs), runs=runs)
