"""What one trained model can answer of the write-ups' claims about keys (research/pretrained_keys_study.py).

Input: one model's record of research.inspection.key_study. One model is one sample: the unit of uncertainty is
the TEXT BATCH, every comparison is paired by batch and decided by research.analysis.rules, and nothing here is a
seed-level effect. Claims: 1. norm (each layer group's key norm against sqrt(d_head), and by depth); 2. sinks
(the head-specialization taxonomy of the KV heads, and whether sinks have longer keys within a layer); 3. gain
(the k_norm gain's spread and golden dimensions: exact, described); 4. rank (pr_sv against the untrained
architecture's). What a key cache holds is described beside them (research.analysis.key_cache).
How each claim is tested: docs/inspection.md, "The pretrained-key study"; the pairing by batch: docs/decisions.md,
"One model: paired by text batch".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.heads import classify
from research.analysis.key_cache import key_cache_summary
from research.analysis.keys import layer_groups
from research.analysis.rules import MARGIN, Paired, compared_on, decide

GOLDEN_K = 3.0
MAD_TO_SD = 1.4826


def site_of(rec: dict) -> str:
    return "k_norm" if "k_norm" in rec["batches"][0]["keys"] else "k_proj"


def per_batch(rec: dict, metric: str, site: str | None = None, key: str = "keys") -> np.ndarray:
    """[n_batches, L, H] of a key metric (key='keys' or 'init_keys') at a site."""
    site = site or site_of(rec)
    return np.array([b[key][site][metric] for b in rec["batches"]], float)


def attn_per_batch(rec: dict, metric: str) -> np.ndarray:
    """[n_batches, L, Hq]."""
    return np.array([b["attn"][metric] for b in rec["batches"]], float)


def kv_mean(x: np.ndarray, n_kv: int) -> np.ndarray:
    """[..., Hq] -> [..., Hkv]: the mean over the query heads of each KV head (h // group)."""
    g = x.shape[-1] // n_kv
    return x.reshape(*x.shape[:-1], n_kv, g).mean(-1)


def _by_batch(values: np.ndarray) -> dict:
    return {i: float(v) for i, v in enumerate(values)}


def norm_claims(rec: dict, margin: float = MARGIN) -> dict:
    site = site_of(rec)
    norms = per_batch(rec, "norm_mean", site)                      # [N, L, Hkv]
    groups = layer_groups(rec["n_layers"])
    ref = math.sqrt(rec["head_dim"])
    g_means = {g: norms[:, ix].mean(axis=(1, 2)) for g, ix in groups.items()}
    on = compared_on("norm_mean")  # a key norm: per-batch log ratios, ln(norm / sqrt(d_head)), ln(norm_b / norm_a)
    vs_ref = decide({g: Paired.ratio(v, np.full(v.shape, ref), tuple(range(v.size)),
                                     (f"the {g} layers' key norm", "sqrt(d_head)")) for g, v in g_means.items()},
                    margin)
    names = list(groups)
    pairs = ((names[0], names[1]), (names[1], names[2]), (names[0], names[2]))
    # a group is not compared with itself: in a model of 3 layers or fewer, two groups are the same layers
    same = [(a, b) for a, b in pairs if groups[a] == groups[b]]
    depth = decide({f"{b} - {a}": Paired.of(_by_batch(g_means[b]), _by_batch(g_means[a]), on,
                                            (f"the {b} layers' key norm", f"the {a} layers'"))
                    for a, b in pairs if (a, b) not in same}, margin)
    return {"site": site, "sqrt_d_head": ref, "groups": groups, "same_layers": same,
            "group_mean": {g: float(v.mean()) for g, v in g_means.items()},
            "layer_mean": norms.mean(axis=(0, 2)).tolist(), "vs_sqrt_d": vs_ref, "depth": depth}


def sink_claims(rec: dict, margin: float = MARGIN) -> dict:
    site = site_of(rec)
    n_kv = rec["n_kv_heads"]
    sink_q = attn_per_batch(rec, "sink_mass_excl_q0")              # [N, L, Hq]
    ent_q = attn_per_batch(rec, "entropy")
    sink_kv, ent_kv = kv_mean(sink_q, n_kv), kv_mean(ent_q, n_kv)  # [N, L, Hkv]
    tax = classify(sink_kv.mean(0), ent_kv.mean(0))
    tax_q = classify(sink_q.mean(0), ent_q.mean(0))                # query heads: what attention alone shows
    out = {"n_kv": n_kv, "taxonomy": tax, "taxonomy_query_heads": tax_q,
           "counts": {c: int((tax.classes == c).sum()) for c in ("sink", "gatherer", "neither")},
           "counts_query_heads": {c: int((tax_q.classes == c).sum()) for c in ("sink", "gatherer", "neither")},
           "sink_rate": float((sink_q.mean(0) > 0.3).mean()),
           "sink_rate_with_q0": float((attn_per_batch(rec, "sink_mass").mean(0) > 0.3).mean())}
    if n_kv < 2:
        out["why_not"] = "one KV head per layer, whose keys its query heads share"
        return out
    norms = per_batch(rec, "norm_mean", site)
    top = sink_kv.mean(0).argmax(axis=1)                           # [L]: the layer's most sink-like KV head
    others = np.ones(sink_kv.shape[1:], bool)
    others[np.arange(len(top)), top] = False
    # per batch, the mean over layers of the top-sink head's key norm against that of the others' mean: a ratio of
    # key norms, decided on per-batch log ratios; their difference is the mean over layers of the differences
    top_norm = np.array([np.mean([norms[b, i, top[i]] for i in range(len(top))]) for b in range(norms.shape[0])])
    rest = np.array([np.mean([norms[b, i][others[i]].mean() for i in range(len(top))])
                     for b in range(norms.shape[0])])
    out["top_sink"] = decide({"top-sink KV head - the others": Paired.ratio(
        top_norm, rest, tuple(range(top_norm.size)), ("the top-sink heads' key norm", "the others'"))}, margin)
    layers = [i for i in range(rec["n_layers"])
              if (tax.classes[i] == "sink").any() and (tax.classes[i] == "gatherer").any()]
    out["layers"] = layers
    if not layers:
        out["why_not"] = "no layer holds both a sink and a gatherer KV head"
        return out
    def mean_of(kind: str) -> np.ndarray:  # per batch, the mean over those layers of the kind's mean key norm
        return np.array([np.mean([norms[b, i][tax.classes[i] == kind].mean() for i in layers])
                         for b in range(norms.shape[0])])
    sinks = mean_of("sink")
    out["within_layer"] = decide({"sink - gatherer key norm": Paired.ratio(
        sinks, mean_of("gatherer"), tuple(range(sinks.size)), ("the sinks' key norm", "the gatherers'"))}, margin)
    return out


def golden_dims(gain: np.ndarray, k: float = GOLDEN_K) -> list[int]:
    """Dimensions whose gain lies above median + k robust SDs (1.4826 x MAD) of the vector's gains. The
    median and MAD ignore a few huge gains, which a mean and SD would chase."""
    med = float(np.median(gain))
    sd = MAD_TO_SD * float(np.median(np.abs(gain - med)))
    return [int(i) for i in np.nonzero(gain > med + k * sd)[0]]  # sd 0 (most gains equal): any gain above them


def gain_claims(rec: dict) -> dict | None:
    rows = (rec.get("gains") or {}).get("k_norm")
    if not rows:
        return None
    layers = []
    for g in map(lambda r: np.asarray(r, float), rows):
        gold = golden_dims(g)
        layers.append({"mean": float(g.mean()), "mean_abs": float(np.abs(g).mean()),
                       "cv": float(g.std(ddof=1) / abs(g.mean())) if g.mean() else math.nan,
                       "min": float(g.min()), "max": float(g.max()), "negative": int((g < 0).sum()),
                       "golden": gold, "golden_energy": float((g[gold] ** 2).sum() / (g ** 2).sum()) if gold else 0.0})
    return {"layers": layers, "golden_k": GOLDEN_K}


def rank_claims(rec: dict, margin: float = MARGIN) -> dict | None:
    if "init_keys" not in rec["batches"][0]:
        return None
    site = site_of(rec)
    out = {"site": site, "d_head": rec["head_dim"]}
    groups = layer_groups(rec["n_layers"])
    for metric in ("pr_sv", "pr_var", "erank"):
        trained, init = per_batch(rec, metric, site), per_batch(rec, metric, site, key="init_keys")
        out[metric] = {"layer_trained": trained.mean(axis=(0, 2)).tolist(),
                       "layer_init": init.mean(axis=(0, 2)).tolist()}
    trained, init = per_batch(rec, "pr_sv", site), per_batch(rec, "pr_sv", site, key="init_keys")
    out["groups"] = decide({g: Paired.of(_by_batch(trained[:, ix].mean(axis=(1, 2))),
                                         _by_batch(init[:, ix].mean(axis=(1, 2))), compared_on("pr_sv"),
                                         (f"the trained {g} layers' pr_sv", "the untrained"))
                            for g, ix in groups.items()}, margin)
    return out


@dataclass(frozen=True)
class ModelKeys:
    """One model's answers, decided over its text batches."""

    record: dict  # the model's record in pretrained_keys.json (what it is, the text, every per-batch number)
    norm: dict  # claim 1 (norm_claims)
    sinks: dict  # claim 2 (sink_claims)
    gain: dict | None  # claim 3 (gain_claims); None without k_norm
    rank: dict | None  # claim 4 (rank_claims); None without an untrained reference
    loss: tuple[float, float]  # the loss on the text: mean, sd over batches (NaN with one batch)
    n_batches: int
    kv: dict | None = None  # what a key cache holds (research.analysis.key_cache); None without kv sections


@dataclass(frozen=True)
class PretrainedAnalysis:
    """Everything the figures and the report of the pretrained-keys study draw from."""

    file: dict  # pretrained_keys.json, checked (research.results.pretrained): command, provenance, wall time
    models: dict  # model name -> ModelKeys, in the file's order
    margin: float


def analyze(rec: dict, margin: float = MARGIN) -> ModelKeys:
    losses = np.array([b["loss"] for b in rec["batches"]], float)
    loss = (float(losses.mean()), float(losses.std(ddof=1)) if losses.size > 1 else math.nan)
    return ModelKeys(rec, norm_claims(rec, margin), sink_claims(rec, margin), gain_claims(rec),
                     rank_claims(rec, margin), loss, len(rec["batches"]), key_cache_summary(rec))


def analyze_file(res: dict, margin: float | None = None) -> PretrainedAnalysis:
    """Every model of a checked pretrained_keys.json, at `margin` (None: the margin the study ran with, else
    research.analysis.rules.MARGIN)."""
    margin = (res.get("margin") or MARGIN) if margin is None else margin
    return PretrainedAnalysis(res, {name: analyze(rec, margin) for name, rec in res["models"].items()}, margin)
