"""The pilot's numbers: QK-norm against no QK-norm (conditions "qk_norm" and "no_qk_norm").

Reads only the write-ups' top-level fields (tokens, loss, val_loss, mean_pr, layer_pr,
gamma_cv), so the curves can be redrawn from combined_results.json alone; there every per-probe
value is the mean over seeds at a token count every seed was probed at (never by position). The
differences between the conditions (final mean PR, losses, and each layer's PR) are decided per seed
by research.analysis.rules, which needs the per-seed results files: from a combined file alone they
are descriptive. The conditions "QK"/"NoQK" of the other
studies are accepted as the pair too; with other names the first two conditions are compared
(first minus second).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.rules import LOSS_MARGIN, MARGIN, Paired, by_seed, compared_on, decide, finals
from research.analysis.series import seed_mean, shared_tokens
from research.results.values import as_array, as_float

_QK_NAMES = ("qk_norm", "QK")
_NOQK_NAMES = ("no_qk_norm", "NoQK")


def _jsonable(a: np.ndarray) -> list:
    return [None if not np.isfinite(v) else float(v) for v in a]


def _seed_mean(results: list[dict], get) -> list:
    """A series' mean over seeds at the token counts all of them share (empty when no seed recorded it)."""
    return _jsonable(seed_mean(results, get)[1]) if any(get(r) for r in results) else []


def combined_from_runs(runs: dict[str, list[dict]]) -> dict:
    """{condition: {tag, n_seeds, seeds, tokens, train_loss, val_loss, mean_pr, layer_pr, gamma_cv}}:
    combined_results.json, the write-ups' pilot format. train_loss is the results' `loss`; with
    several seeds, values are means over seeds at the token counts every seed was probed at (never by
    position: research.analysis.series.seed_mean); a series no seed recorded stays empty."""
    out = {}
    for cond, results in runs.items():
        if not results:
            continue
        if len(results) == 1 and "n_seeds" in results[0]:  # came from a combined file: keep its seed count
            n_seeds, seeds = results[0]["n_seeds"], results[0].get("seeds", [None])
        else:
            n_seeds, seeds = len(results), [r.get("seed") for r in results]
        entry = {"tag": cond, "n_seeds": n_seeds, "seeds": seeds,
                 "tokens": [int(t) for t in shared_tokens(r["tokens"] for r in results)]}
        for key, src in (("train_loss", "loss"), ("val_loss", "val_loss"), ("mean_pr", "mean_pr")):
            entry[key] = _seed_mean(results, lambda r, src=src: r.get(src))
        for key in ("layer_pr", "gamma_cv"):
            layers = sorted(set().union(*[(r.get(key) or {}).keys() for r in results]), key=int)
            entry[key] = {layer: _seed_mean(results, lambda r, key=key, layer=layer: (r.get(key) or {}).get(layer))
                          for layer in layers}
        out[cond] = entry
    return out


def pair(conditions) -> tuple[str | None, str | None]:
    """(QK-norm condition, no-QK-norm condition) among the names; delta = first - second."""
    names = list(conditions)
    qk = next((n for n in _QK_NAMES if n in names), None)
    noqk = next((n for n in _NOQK_NAMES if n in names), None)
    if qk and noqk:
        return qk, noqk
    rest = [n for n in names if n not in (qk, noqk)]
    a = qk or (rest.pop(0) if rest else None)
    b = noqk or (rest.pop(0) if rest else None)
    return a, b


def final(values) -> float:
    """The value at the last probe (NaN where that probe has none: never an earlier probe's value)."""
    a = as_array(values)
    return float(a[-1]) if a.size else math.nan


@dataclass(frozen=True)
class PilotCondition:
    combined: dict  # this condition's combined_results.json entry (seed means)
    final_layer: dict  # layer (int) -> final PR
    final_pr: float
    final_loss: float
    final_val: float
    tokens: float


@dataclass(frozen=True)
class PilotAnalysis:
    conditions: dict  # condition -> PilotCondition, in the runs' order
    a: str | None  # QK-norm side of the difference
    b: str | None  # no-QK-norm side
    layers: list[int]  # layers both sides have
    delta: dict  # layer -> final PR of a minus b (difference of the seed means)
    ranked: list[int]  # layers by |delta|, largest first (finite deltas only); descriptive
    decisions: dict  # "mean_pr" / "loss" / "val_loss" -> Decision of a minus b, per seed
    layer_decisions: dict  # layer -> Decision of a's final layer PR minus b's (Bonferroni over the layers)
    margin: float
    loss_margin: float

    @property
    def differing(self) -> list[int]:
        """The layers whose final PR differs beyond the margin (decided per seed), largest |difference| first."""
        hits = [i for i, d in self.layer_decisions.items() if d.differs]
        return sorted(hits, key=lambda i: -abs(self.layer_decisions[i].est))


def analyze(runs: dict[str, list[dict]], margin: float = MARGIN, loss_margin: float = LOSS_MARGIN) -> PilotAnalysis:
    comb = combined_from_runs(runs)
    conds = {}
    for cond, e in comb.items():
        layers = sorted(e["layer_pr"], key=int)
        conds[cond] = PilotCondition(combined=e, final_layer={int(l): final(e["layer_pr"][l]) for l in layers},
                                     final_pr=final(e["mean_pr"]), final_loss=final(e["train_loss"]),
                                     final_val=final(e["val_loss"]), tokens=final(e["tokens"]))
    a, b = pair(conds)
    if a is None or b is None:
        return PilotAnalysis(conds, a, b, [], {}, [], {}, {}, margin, loss_margin)
    sa, sb = conds[a], conds[b]
    layers = sorted(set(sa.final_layer) & set(sb.final_layer))
    delta = {i: sa.final_layer[i] - sb.final_layer[i] for i in layers}
    ranked = sorted((i for i in layers if np.isfinite(delta[i])), key=lambda i: -abs(delta[i]))
    decisions = {f: decide({f: Paired.of(finals(runs, a, f), finals(runs, b, f), compared_on(f),
                                         (f"{a}'s final {f}", f"{b}'s final {f}"))},
                           margin if f == "mean_pr" else loss_margin)[f] for f in ("mean_pr", "loss", "val_loss")}

    def final_layer(cond: str, layer: int) -> dict:
        return by_seed(runs[cond], lambda r: as_float(((r.get("layer_pr") or {}).get(str(layer)) or [None])[-1]))
    layer_decisions = decide({i: Paired.of(final_layer(a, i), final_layer(b, i), compared_on("layer_pr"),
                                           (f"{a}'s final PR of layer {i}", f"{b}'s")) for i in layers}, margin)
    return PilotAnalysis(conds, a, b, layers, delta, ranked, decisions, layer_decisions, margin, loss_margin)
