"""What a key cache would cost one trained model, from its kv_cache sections (research.probing.kv_cache's form, one per
text batch of the pretrained-key study) and its keys' rank and rotary use: descriptive summaries, no decision (one
model is one sample; the batches give the spread of the text). No torch.

    summary = key_cache_summary(rec)          # rec: one model of pretrained_keys.json, or None without kv sections
"""
from __future__ import annotations

import numpy as np

from research.analysis.keys import layer_groups
from research.analysis.rules import LOSS_MARGIN
from research.analysis.stats import mean_ci95

RANKS = ("rank90", "rank99")


def usable_k_bits(losses_by_bits: dict[int, float], base_loss: float, margin: float = LOSS_MARGIN) -> int | None:
    """The fewest bits b whose loss, and the loss of every larger b measured, lies within margin x base_loss of
    base_loss (the unquantized loss; margin a share, as the studies' loss margin, docs/decisions.md); None when the
    largest b measured does not. A fluke at few bits below a larger b outside the margin is not counted."""
    usable = None
    for b in sorted(losses_by_bits, reverse=True):
        if not abs(losses_by_bits[b] - base_loss) <= margin * abs(base_loss):
            break
        usable = b
    return usable


def _site_before_rope(batch: dict) -> str:
    return "k_norm" if "k_norm" in batch["keys"] else "k_proj"


def has_rope(rec: dict) -> bool:
    """Whether the model rotates its queries and keys: the key study measures their rotary use (the keys'
    low_freq_share at the site before RoPE, the queries' q_low_freq_share) exactly where the model has RoPE
    (research.inspection.key_study), so a record without them is of a model without it (GPT-2's learned absolute
    positions), whose keys are the same before and after where RoPE would act."""
    return all("low_freq_share" in b["keys"][_site_before_rope(b)] or "q_low_freq_share" in b["attn"]
               for b in rec["batches"])


def _grid_means(rec: dict, key: str, site: str, metric: str) -> np.ndarray | None:
    """[batches, layers]: the mean over heads of batch[key][site][metric], or None where absent."""
    rows = [b.get(key, {}).get(site, {}).get(metric) for b in rec["batches"]]
    return None if any(r is None for r in rows) else np.array(rows, float).mean(-1)


def _groups(per_layer: np.ndarray, n_layers: int) -> dict[str, float]:
    """The mean of a [layers] profile over each layer group (early, middle, final)."""
    return {g: float(per_layer[ix].mean()) for g, ix in layer_groups(n_layers).items()}


def _errors(batches: list[dict], path: tuple[str, ...], name: str) -> float:
    """The mean over the batches' layers (where measured) and query heads of one error of the kv sections at path
    (site, scheme, bits), NaN where none was measured."""
    vals = []
    for kv in batches:
        for layer in kv["layers"]:
            node = layer
            for part in path:
                node = node.get(part, {}) if isinstance(node, dict) else {}
            vals.extend(node.get(name, []))
    return float(np.nanmean(vals)) if vals else float("nan")


def _losses(kvs: list[dict], margin: float) -> dict:
    """The loss change with every key quantized, by bits: mean over batches and its 95% half-width (batches as the
    unit), as a share of the unquantized loss too; usable_k_bits of the mean losses."""
    bits = sorted((int(b) for b in kvs[0]["loss"]["by_bits"]), reverse=True)
    base = float(np.mean([kv["loss"]["by_bits"]["16"] for kv in kvs]))
    out = {"base": base, "change": {}, "share": {}}
    for b in bits:
        change = [kv["loss"]["change"][str(b)] for kv in kvs]
        out["change"][b] = mean_ci95(change)
        out["share"][b] = mean_ci95([c / kv["loss"]["by_bits"]["16"] for c, kv in zip(change, kvs)])
    means = {b: float(np.mean([kv["loss"]["by_bits"][str(b)] for kv in kvs])) for b in bits if b != 16}
    out["usable_k_bits"] = usable_k_bits(means, base, margin)
    out["margin"] = margin
    return out


def key_cache_summary(rec: dict) -> dict | None:
    """One model's key-cache numbers, or None where its batches hold no kv section (--no_kv_cache, older files):
    rank90/rank99 per layer group at the keys before RoPE and after (trained, and the untrained architecture's where
    measured), the keys' and queries' low_freq_share, the loss change by bits, the logit error with 4-bit keys per
    scheme and site, and the projected keys' logit error by rank. rope: has_rope; without it (GPT-2) every number is
    of the keys as they are, the site before RoPE, and none of rotary use: nothing after RoPE, no low_freq_share."""
    kvs = [b["kv"] for b in rec["batches"] if "kv" in b]
    if not kvs or len(kvs) != len(rec["batches"]):
        return None
    L, pre, rope = rec["n_layers"], _site_before_rope(rec["batches"][0]), has_rope(rec)
    ranks = {}
    for site in (pre, "k_rope") if rope else (pre,):  # without RoPE, k_rope holds the keys of `pre` again
        for metric in RANKS:
            for key in ("keys", "init_keys"):
                m = _grid_means(rec, key, site, metric)
                if m is not None:
                    ranks[(site, metric, key)] = _groups(m.mean(0), L)
    low = {}
    for name, key, site, metric in (("keys", "keys", pre, "low_freq_share"), ("queries", "attn", None,
                                                                             "q_low_freq_share")):
        rows = [(b[key] if site is None else b[key].get(site, {})).get(metric) for b in rec["batches"]]
        if rope and all(r is not None for r in rows):
            low[name] = _groups(np.array(rows, float).mean((0, 2)), L)
    first = kvs[0]
    layers = next((kv["layers"] for kv in kvs if kv["layers"]), [{"quantized": {}, "projected": {}}])
    sites = [s for s in layers[0]["quantized"] if rope or s == "pre_rope"]  # without RoPE, post_rope is pre_rope
    errors = {(site, scheme): _errors(kvs, ("quantized", site, scheme, "4"), "logit_error")
              for site in sites for scheme in first["schemes"]}
    projected = {(site, r): _errors(kvs, ("projected", site, str(r)), "logit_error")
                 for site in sites if site in layers[0]["projected"] for r in first["ranks"]}
    return {"site": pre, "rope": rope, "d_head": rec["head_dim"], "ranks": ranks, "low_freq_share": low,
            "loss": _losses(kvs, first["loss_margin"]), "logit_error_4bit": errors, "projected": projected,
            "ranks_measured": first["ranks"], "schemes": first["schemes"],
            "sequences": sum(kv["sequences"] for kv in kvs), "seq_len": first["seq_len"],
            "error_sequences": sum(kv["sequences"] for kv in kvs if kv["layers"]),
            "layer_bits": next((kv["layer_bits"]["usable_k_bits"] for kv in kvs if "layer_bits" in kv), None)}
