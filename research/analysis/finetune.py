"""The fine-tuning study's decisions (research/finetune_keys_study.py): does training a pretrained QK-norm model's
q/k norm gains, against freezing them at their pretrained values, change its keys or its loss? No torch.

Conditions TRAINED and FROZEN, paired by seed (research.analysis.rules): the final values TRAINED - FROZEN (key PR
at k_norm and of k_hat, key norm, validation loss); each quantity's change over fine-tuning within a condition;
whether key PR recovers after its lowest point (research.analysis.dips); and, described over seeds, how far the
k gains moved and the largest logit's change split into its log terms.
What the study runs and reports: docs/studies.md, "Fine-tuning a pretrained QK-norm model"; how each number is
decided: docs/decisions.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis import dips
from research.analysis.rules import (DIFFERENCE, LOSS_MARGIN, MARGIN, RATIO_WHERE_POSITIVE, Decision, Paired, by_seed,
                                     compared_on, conditions, decide, runs_of)
from research.analysis.wording import effect_text
from research.analysis.series import aligned, nanmean
from research.analysis.stats import mean_ci95
from research.results.read import final_site_mean, last, seed_of
from research.results.values import as_float

TRAINED, FROZEN = "gains_trained", "gains_frozen"
CONDITIONS = (TRAINED, FROZEN)
# (name, label, site, metric) of the key quantities compared at the end; "val_loss" is decided at the loss margin
KEY_FIELDS = (("pr", "key PR (pr_sv at k_norm)", "k_norm", "pr_sv"),
              ("pr_hat", "PR of the normalized keys before the gain (k_hat)", "k_hat", "pr_sv"),
              ("norm", "key norm at k_norm", "k_norm", "norm_mean"))
LOSS_LABEL = "validation loss (the probe batch)"
LOGIT_TERMS = ("logit_max", "logit_q_norm", "logit_k_norm", "logit_cos", "logit_q_gain", "logit_k_gain")


def site_series(res: dict, site: str, metric: str) -> list[float | None]:
    """The per-probe mean over layers of a site's metric (None where a probe lacks it)."""
    out = []
    for p in res.get("probes") or []:
        values = [layer["means"].get(f"{site}.{metric}") for layer in p["layers"]]
        values = [v for v in values if v is not None]
        out.append(float(np.mean(values)) if values else None)
    return out


def _first(res: dict, site: str, metric: str) -> float:
    s = site_series(res, site, metric)
    return math.nan if not s or s[0] is None else s[0]


def gain_drift(res: dict) -> list[float]:
    """Per layer: |g_last - g_first| / |g_first| of the k_norm gain over the run's probes (empty without gains)."""
    probes = res.get("probes") or []
    if len(probes) < 2:
        return []
    out = []
    for a, b in zip(probes[0]["layers"], probes[-1]["layers"]):
        if not a.get("gamma_k") or not b.get("gamma_k"):
            return []
        g0, g1 = np.asarray(a["gamma_k"]["values"], float), np.asarray(b["gamma_k"]["values"], float)
        out.append(float(np.linalg.norm(g1 - g0) / np.linalg.norm(g0)) if np.linalg.norm(g0) else math.nan)
    return out


def log_terms(res: dict, index: int) -> dict[str, float]:
    """The mean over layers and query heads of the log of each logit term at probe `index` (NaN where absent or not
    positive: a cosine at the largest logit is positive unless every logit is negative)."""
    probe = (res.get("probes") or [])[index]
    out = {}
    for term in LOGIT_TERMS:
        values = [v for layer in probe["layers"] for v in (layer.get("attn") or {}).get(term) or []]
        values = [math.log(v) for v in values if v is not None and v > 0]
        out[term] = float(np.mean(values)) if values else math.nan
    return out


@dataclass(frozen=True)
class Recovery:
    """Does a condition's key PR fall and then rise again (research.analysis.dips)? The probe of the minimum is
    chosen on the `choose` seeds and the fall to it and the rise after it are tested on the `test` seeds only."""

    choose: list  # seeds whose mean series picks the probe of the minimum (every other seed from the second)
    test: list  # the other seeds: fall and rise are decided on them
    tokens: float  # training tokens at the chosen probe (NaN when none was chosen)
    fall: Decision | None  # ln(first / the chosen probe), per test seed (positive: PR fell to it)
    rise: Decision | None  # ln(last / the chosen probe), per test seed (positive: PR rose after it)
    why_not: str = ""  # why it is not tested ("" when it is)
    start: float = math.nan  # the test seeds' mean at the first probe: what the fall is a share of

    @property
    def status(self) -> str:
        """dips.RISES (both beyond the margin and positive), dips.NO_RISE (a settled size says otherwise),
        dips.OPEN, or dips.UNTESTED."""
        if self.fall is None or self.rise is None or not (self.fall.tested and self.rise.tested):
            return dips.UNTESTED
        return dips.shape(self.fall, self.rise)


def recovery(per: dict, margin: float) -> dict:
    """condition -> Recovery of its key PR (pr_sv at k_norm): one family over the conditions' falls and rises."""
    ys, xs, split, why = {}, {}, {}, {}
    for c, rl in per.items():
        runs = dips.in_seed_order(rl)
        seeds = [seed_of(r) for r in runs]
        xs[c], y = aligned(runs, lambda r: site_series(r, "k_norm", "pr_sv"))
        choose, test = dips.split_seeds(len(runs))
        split[c] = ([seeds[i] for i in choose], [seeds[i] for i in test])
        why[c] = "a run has no seed, so the seeds cannot be split" if None in seeds else dips.enough(y)
        if not why[c]:
            ys[c] = y
    decided, where = dips.dip_decisions(ys, margin, compared_on("pr_sv"), "key PR")
    out = {}
    for c in per:
        if c in where:
            out[c] = Recovery(*split[c], float(xs[c][where[c]]), decided[(c, "fall")], decided[(c, "rise")],
                              start=dips.start(ys[c]))
        else:
            out[c] = Recovery(*split[c], math.nan, None, None, why[c] or "no key PR values")
    return out


def seeds_of(runs: list[dict]) -> tuple | None:
    """The runs' seeds in order, None unless every run has one."""
    seeds = tuple(seed_of(r) for r in runs)
    return None if None in seeds else seeds


def start_val_loss(res: dict) -> float:
    """The held-out loss at the first probe: the step-0 probe keeps it as `init_val_loss`, its val_loss is null."""
    first = as_float((res.get("val_loss") or [None])[0])
    return first if math.isfinite(first) else as_float(res.get("init_val_loss"))


def loss_change(per: dict, loss_margin: float) -> dict:
    """condition -> Decision of the held-out loss at the last probe minus at the first (the probe of step 0, kept as
    `init_val_loss`), per seed (one family)."""
    family = {}
    for c, rl in per.items():
        first = [start_val_loss(r) for r in rl]
        family[c] = Paired.one_sample([last(r, "val_loss") - f for r, f in zip(rl, first)],
                                      abs(float(nanmean(np.array(first, float)))))
    return decide(family, loss_margin)


@dataclass(frozen=True)
class FinetuneAnalysis:
    conditions: list[str]
    seeds: dict  # condition -> seeds
    final: dict  # (TRAINED, FROZEN) decisions: name -> Decision (KEY_FIELDS names and "val_loss")
    change: dict  # (condition, name) -> Decision of last - first within the condition
    series: dict  # condition -> {name: (tokens, Y[n_seeds, n_probes])}
    drift: dict  # condition -> [(mean, half width over seeds) of the k gains' relative change, per layer]
    drift_mean: dict  # condition -> (mean, half width over seeds) of that change's mean over layers
    logit_split: dict  # condition -> {term: (mean, half width over seeds) of the change of its mean log}
    margin: float
    loss_margin: float
    verdict: str
    runs: dict  # the runs decided (condition -> results per seed): what the report's header reads
    loss_change: dict  # condition -> Decision of the held-out loss, last probe minus first (loss margin)
    recovery: dict  # condition -> Recovery of key PR after its lowest point


def _series(runs: list[dict]) -> dict:
    out = {name: aligned(runs, lambda r, s=site, m=metric: site_series(r, s, m))
           for name, _, site, metric in KEY_FIELDS}
    out["val_loss"] = aligned(runs, lambda r: r["val_loss"])
    out["loss"] = aligned(runs, lambda r: r["loss"])
    return out


def _ci(values) -> tuple[float, float]:
    x = [v for v in values if v is not None and math.isfinite(v)]
    if not x:
        return math.nan, math.nan
    return (x[0], math.nan) if len(x) == 1 else mean_ci95(x)


def verdict_text(final: dict, margin: float, loss_margin: float) -> str:
    """One sentence per decided quantity, each with its estimate; never more than the interval shows."""
    if not final:
        return "No comparison: the study needs both conditions (gains trained and frozen) with a common seed."
    parts = []
    for name, label, *_ in (*KEY_FIELDS, ("val_loss", LOSS_LABEL)):
        d: Decision = final[name]
        m = loss_margin if name == "val_loss" else margin
        if d.outcome == "equal":
            said = f"about equal, within \u00b1{m:.1%} of the mean"
        elif d.outcome == "different, within the margin":
            said = f"different, but by less than \u00b1{m:.1%} of the mean"
        elif d.outcome == "different, beyond the margin":
            said = f"{'higher' if d.est > 0 else 'lower'} with trained gains, by more than {m:.1%} of the mean"
        elif d.outcome == "different, size unresolved":
            said = f"{'higher' if d.est > 0 else 'lower'} with trained gains, by an amount not pinned down"
        elif d.outcome == "inconclusive":
            said = "inconclusive: no difference shown, none excluded"
        else:
            said = d.outcome
        parts.append(f"{label} {effect_text(d)}, {said}")
    return ("Trained minus frozen q/k norm gains, at the end of fine-tuning, paired by seed: " + "; ".join(parts)
            + ".")


def analyze(runs: dict, margin: float = MARGIN, loss_margin: float = LOSS_MARGIN) -> FinetuneAnalysis:
    conds = conditions(runs)
    per = {c: runs_of(runs, c) for c in conds}
    final: dict = {}
    if TRAINED in per and FROZEN in per:
        keys = {name: Paired.of(by_seed(per[TRAINED], lambda r, s=site, m=metric: final_site_mean(r, s, m)),
                                by_seed(per[FROZEN], lambda r, s=site, m=metric: final_site_mean(r, s, m)),
                                compared_on(metric), (f"{TRAINED}'s final {label}", f"{FROZEN}'s"))
                for name, label, site, metric in KEY_FIELDS}
        final = {**decide(keys, margin),
                 **decide({"val_loss": Paired.of(by_seed(per[TRAINED], lambda r: last(r, "val_loss")),
                                                  by_seed(per[FROZEN], lambda r: last(r, "val_loss")))}, loss_margin)}
    change_family = {}
    for c in conds:
        for name, label, site, metric in KEY_FIELDS:
            first = np.array([_first(r, site, metric) for r in per[c]], float)
            end = np.array([final_site_mean(r, site, metric) for r in per[c]], float)
            on = compared_on(metric)  # a positive quantity's change: the log ratio of its last value to its first
            change_family[(c, name)] = (
                Paired.one_sample(end - first, abs(nanmean(first))) if on == DIFFERENCE else
                Paired.ratio(end, first, seeds_of(per[c]), (f"{c}'s last {label}", "its first"),
                             fallback=on == RATIO_WHERE_POSITIVE))
    change = decide(change_family, margin)
    drift, drift_mean, split = {}, {}, {}
    for c in conds:
        layers = [gain_drift(r) for r in per[c]]
        if layers and all(layers):
            y = np.array(layers, float)  # [seeds, layers]
            drift[c] = [_ci(y[:, i]) for i in range(y.shape[1])]
            drift_mean[c] = _ci(nanmean(y, axis=1))
        ends = [(log_terms(r, 0), log_terms(r, -1)) for r in per[c] if len(r.get("probes") or []) >= 2]
        deltas = [{t: last_[t] - first_[t] for t in LOGIT_TERMS} for first_, last_ in ends]
        split[c] = {t: _ci([d[t] for d in deltas]) for t in LOGIT_TERMS}
    return FinetuneAnalysis(conds, {c: [r.get("seed") for r in per[c]] for c in conds}, final, change,
                            {c: _series(per[c]) for c in conds}, drift, drift_mean, split, margin, loss_margin,
                            verdict_text(final, margin, loss_margin), runs, loss_change(per, loss_margin),
                            recovery(per, margin))
