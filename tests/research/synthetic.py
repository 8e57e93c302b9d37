"""Hand-built results dicts whose answers are known, for the analysis and plot tests (no torch)."""
from __future__ import annotations

import numpy as np

from research.results import validate
from research.results.vocabulary import QK_CONDITIONS

L, D, P = 6, 64, 5
TOKENS = [0, 250_000, 500_000, 750_000, 1_000_000]
FINAL_LAYER_NORM = [9.0, 9.0, 8.0, 8.0, 7.0, 7.0]  # layers 0,1 end above sqrt(64) = 8, 4,5 below, 2,3 at it
SINK, GATHERER = (4, 0), (1, 1)  # (layer, KV head); the sink ends with sink mass 0.6, every other head 0.1


def _final_head(layer: int, n_kv: int) -> list[tuple[float, float]]:
    """(norm, entropy) of each KV head at the last probe; the layer mean stays FINAL_LAYER_NORM[layer]."""
    m = FINAL_LAYER_NORM[layer]
    out = [(m, 2.0)] * n_kv
    if n_kv == 2 and layer == SINK[0]:
        out = [(12.0, 0.5), (2 * m - 12.0, 2.0)]       # sink: high norm, low entropy
    if n_kv == 2 and layer == GATHERER[0]:
        out = [(2 * m - 5.0, 2.0), (5.0, 3.0)]         # gatherer: low norm, high entropy
    return out


def make_results(tag="QK", *, n_kv=2, n_q=2, qk_norm="learned", seed=0, norm_offset=0.0, norm_drift=0.0,
                 sink_drift=0.0, pr_drop=None, with_config=True) -> dict:
    """A results dict like the probe callback writes: 6 layers, D = 64, 5 probes.

    Key norms go linearly from 8 to their final values; entropies from 3.5 to their final values.
    `norm_offset` is added to every key norm at every probe; `norm_drift` to every key norm in proportion to
    training (all of it at the last probe), `sink_drift` so to the sink's alone: a run's own change.
    pr_drop[layer] is subtracted from the final layer PR (30 for every layer otherwise).
    """
    group = n_q // n_kv
    pr_drop = pr_drop or [0.0] * L
    res = {"tag": tag, "tokens": list(TOKENS), "loss": [None], "val_loss": [None], "mean_pr": [], "layer_pr": {},
           "gamma_cv": {}, "gamma_final": {}, "schema": "qk-keys/results", "schema_version": 1, "seed": seed,
           "config": {"model": {"n_layers": L, "d_model": D * n_q, "n_heads": n_q, "n_kv_heads": n_kv,
                                "qk_norm": qk_norm}} if with_config else None,
           "steps": list(range(P)), "probes": []}
    for p in range(P):
        f = p / (P - 1)
        if p:
            res["loss"].append(8.0 - 2 * f)
            res["val_loss"].append(8.1 - 2 * f)
        layers = []
        for i in range(L):
            fin = _final_head(i, n_kv)
            norm = [8.0 + f * (n - 8.0 + norm_drift + (sink_drift if (i, k) == SINK else 0.0)) + norm_offset
                    for k, (n, _) in enumerate(fin)]
            ent_kv = [3.5 + f * (e - 3.5) for _, e in fin]
            pr = 50.0 - f * (20.0 + pr_drop[i])
            km = {"norm_mean": norm, "norm_std": [0.1] * n_kv, "max_abs": [3.0 + f * (1 + i)] * n_kv,
                  "mean_max_abs": [2.0] * n_kv, "peak_frac": [0.1 + 0.01 * i * f] * n_kv, "std": [1.0] * n_kv,
                  "cos_mean": [0.02 + f * 0.05 * i] * n_kv, "pr_sv": [pr] * n_kv, "pr_var": [5.0] * n_kv,
                  "erank": [56.0 - f * 2 * (i + 1)] * n_kv, "pr_vec": [20.0] * n_kv}
            # query heads of KV head k: entropies e - 0.5 and e + 0.5 when there are two (mean = e)
            spread = [(-0.5 + j / max(group - 1, 1)) if group > 1 else 0.0 for j in range(group)]
            sink = [0.1 + f * (0.5 if (i, k) == SINK and n_kv == 2 else 0.0) for k in range(n_kv)]
            attn = {"entropy": [e + s for e in ent_kv for s in spread],
                    "sink_mass": [m for m in sink for _ in spread], "qk_ratio": [1.0] * n_q}
            gains = (1.0 + f * 0.1 * np.sin(np.arange(D) + i)).tolist()
            gamma = None if qk_norm == "none" else {
                "mean": float(np.mean(gains)), "std": float(np.std(gains)),
                "cv": float(np.std(gains) / abs(np.mean(gains))), "min": min(gains), "max": max(gains),
                "values": gains}
            means = {f"k_norm.{k}": float(np.mean(v)) for k, v in km.items()}
            means.update({f"k_rope.{k}": float(np.mean(v)) for k, v in km.items()})
            means.update({f"attn.{k}": float(np.mean(v)) for k, v in attn.items()})
            layers.append({"layer": i, "k_norm": km, "k_rope": km, "attn": attn, "gamma_k": gamma,
                           "gamma_q": gamma, "means": means})
            res["layer_pr"].setdefault(str(i), []).append(means["k_norm.pr_sv"])
            if gamma:
                res["gamma_cv"].setdefault(str(i), []).append(gamma["cv"])
                res["gamma_final"][str(i)] = gamma["values"]
        res["mean_pr"].append(float(np.mean([r["means"]["k_norm.pr_sv"] for r in layers])))
        res["probes"].append({"step": p, "tokens": TOKENS[p], "layers": layers,
                              "mean_pr": res["mean_pr"][-1], "probe_time_s": 0.1})
    return validate(res)


def writeups_only(res: dict) -> dict:
    """The same run as the write-ups' schema holds it: top-level fields only, no probes."""
    return validate({k: res[k] for k in ("tag", "tokens", "loss", "val_loss", "mean_pr", "layer_pr",
                                         "gamma_cv", "gamma_final")})


# Each condition's own part of the seed noise: the per-seed differences A - B, B - C, A - C and A - 2B + C spread
# by 0.01-0.03 (PR; a hundredth of that in the loss), far inside every margin, 0 for seed 0 alone and summing to 0
# over seeds 0, 1, 2 (_own), so one seed and the mean of three keep their exact values
SPREAD = {"QK_frozen": 0.01, "NoQK": 0.03}
# Seeds also differ inside the trajectory (at most +-0.05 at mid-training), so a trajectory's fall and rise spread
WIGGLE = 0.05


def _own(seed: int) -> int:
    """Seeds 0, 1, 2 -> 0, +1, -1 (and on in threes)."""
    return (0, 1, -1)[seed % 3]


def qk_run(tag, seed, final_pr, final_loss, *, shape="u", layers=4, probes=8, learned=None, own_noise=0.0):
    """A results dict with only the write-ups' fields (+ seed): mean_pr ends exactly at final_pr + seed noise.

    The seed noise ((seed - 1) * 0.2) is shared by every condition of a seed, as a shared initialisation and
    data order would make it; a condition's own part (SPREAD[tag] * _own(seed)) gives the per-seed
    differences between conditions a small spread (a difference with none is "no spread", not decided) while
    their mean over seeds 0, 1, 2 stays exact; `own_noise` adds noise of that size that belongs to this
    (condition, seed) alone."""
    noise = (seed - 1) * 0.2 + SPREAD.get(tag, 0.0) * _own(seed)  # seeds 0, 1, 2 -> -0.2, 0, +0.2: mean is exact
    noise += own_noise * np.random.default_rng([seed, sum(map(ord, tag))]).normal()
    t = np.linspace(0, 1, probes)
    if shape == "u":   # 80 -> dip to 0.6 * final at 30% of training -> final
        pr = np.where(t < 0.3, 80 + (0.6 * final_pr - 80) * t / 0.3, 0.6 * final_pr + 0.4 * final_pr * (t - 0.3) / 0.7)
    else:              # monotone fall to final
        pr = 80 + (final_pr - 80) * t
    pr = pr + noise + WIGGLE * _own(seed) * 4 * t * (1 - t)  # the first and last probes keep their exact values
    loss = [None] + list(final_loss + 2.0 * (1 - t[1:]) + noise / 100)
    val = [None] + list(final_loss - 0.1 + 2.0 * (1 - t[1:]) + noise / 100)
    qk = tag != "NoQK" if learned is None else learned
    res = {"tag": tag, "tokens": [int(x) for x in t * 1_000_000], "loss": loss, "val_loss": val,
           "mean_pr": list(pr), "layer_pr": {str(i): list(pr + (i - layers / 2)) for i in range(layers)},
           "gamma_cv": ({str(i): list((0.0 if tag == "QK_frozen" else 0.1) * t) for i in range(layers)}
                        if qk else {}),
           "seed": seed}
    return validate(res)


def qk_runs(prs, losses, seeds=3, shape="u", own_noise=0.0):
    return {c: [qk_run(c, s, pr, lo, shape=shape, own_noise=own_noise) for s in range(seeds)]
            for c, pr, lo in zip(QK_CONDITIONS, prs, losses)}


def with_final_probe(res: dict, means: dict, batch=(64, 128)) -> dict:
    """`res` with one probe record at its last probe whose every layer has `means` ({"k_norm.pr_sv": ...})."""
    out = dict(res)
    layers = [{"layer": i, "means": dict(means)} for i in range(len(res["layer_pr"]))]
    out["probes"] = [{"step": len(res["tokens"]) - 1, "tokens": res["tokens"][-1], "layers": layers,
                      "batch": list(batch)}]
    return out


def drop_probes(res: dict, *drop: int) -> dict:
    """`res` without the probes at indices `drop`, in every per-probe field: the same run probed on another grid."""
    def keep(values):
        return None if values is None else [v for i, v in enumerate(values) if i not in drop]
    out = {k: keep(v) if k in ("tokens", "loss", "val_loss", "mean_pr", "steps", "probes") else v
           for k, v in res.items()}
    for field in ("layer_pr", "gamma_cv"):
        if res.get(field):
            out[field] = {layer: keep(v) for layer, v in res[field].items()}
    return validate(out)
