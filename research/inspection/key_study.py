"""Measure a pretrained model's keys on batches of real text: the data of research/pretrained_keys_study.py.

    record = measure_keys(adapter, windows_NT, batch=4, init_adapter=untrained_same_architecture)

Per text batch (the unit of uncertainty: one model is one sample, so what varies is the text), with the probe's own
functions: the key metrics per layer and KV head at each key site, attention per query head, the rotary use, the
loss, the key cache section where asked, and the same keys of an untrained model of the same architecture; per
model, the q/k norm gains, exact. The record's fields and shapes: docs/inspection.md, "The pretrained-key study".
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from research.access.adapters import Adapter
from research.inspection.tour import excluding_query0
from research.probing.hf.kv import hf_kv_cache_record
from research.probing.hf.rotary import AdapterRope, rope_context
from research.probing.key_rank import ranked_key_metrics
from research.probing.metrics import attention_metrics

KEY_SITES = ("k_proj", "k_norm", "k_rope")
ATTN_FIELDS = ("entropy", "sink_mass", "sink_mass_excl_q0", "logit_max")


class _KeySink:
    """The adapter's callbacks, reduced to per-head metrics of one batch."""

    def __init__(self, adapter: Adapter):
        self.adapter = adapter
        self.keys: dict[str, dict[int, dict]] = {}
        self.attn: dict[int, dict] = {}
        self.pairs: dict[int, dict] = {}

    def on_state(self, l, h):  # the key study needs no hidden states
        pass

    def on_keys(self, i: int, site: str, k_HBTD: torch.Tensor) -> None:
        self.keys.setdefault(site, {})[i] = {m: v.tolist() for m, v in ranked_key_metrics(k_HBTD).items()}

    def on_attention(self, i, q_BHTD, k_BKTD, v_BKTD, scaling, window, softcap):
        q, k = q_BHTD.transpose(0, 1), k_BKTD.transpose(0, 1)
        st = attention_metrics(q, k, v_BKTD.transpose(0, 1), scale=scaling, window=window, softcap=softcap)
        self.on_keys(i, "k_rope", k)
        T = q_BHTD.shape[2]
        self.attn[i] = {"entropy": st["entropy"].tolist(), "sink_mass": st["sink_mass"].tolist(),
                        "sink_mass_excl_q0": excluding_query0(st["sink_mass"], T).tolist(),
                        "logit_max": st["logit_max"].tolist()}
        if self.adapter.rope_pairing and self.adapter.rotary_dims:  # rotary use, on the keys' site before RoPE
            k_use, q_use, self.pairs[i] = AdapterRope(self.adapter, i).use(
                {"q_rope": q, "k_rope": k}, None, st["logit_at"], rope_context(self.adapter, T, window))
            pre = "k_norm" if i in self.keys.get("k_norm", {}) else "k_proj"
            self.keys[pre][i].update({m: v.tolist() for m, v in k_use.items()})
            self.attn[i].update({m: v.tolist() for m, v in q_use.items()})
        return st["output"].permute(1, 2, 0, 3)


def _run(adapter: Adapter, ids: torch.Tensor) -> tuple[_KeySink, float]:
    sink = _KeySink(adapter)
    with torch.no_grad(), adapter.capture(sink):
        logits = adapter.forward(ids)
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten()).item()
    return sink, loss


def _by_layer(per_layer: dict[int, dict], L: int) -> dict[str, list]:
    """{layer: {metric: [H]}} -> {metric: [L][H]}."""
    return {m: [per_layer[i][m] for i in range(L)] for m in per_layer[0]}


def gains(adapter: Adapter) -> dict:
    """k_norm and q_norm gains per layer as the multiplier the model applies, or None where absent."""
    out = {}
    for j, name in enumerate(("q_norm", "k_norm")):
        rows = [adapter.gain(adapter.qk_norms(i)[j]) for i in range(adapter.n_layers)]
        out[name] = None if any(r is None for r in rows) else [r.tolist() for r in rows]
    return out


def measure_keys(adapter: Adapter, windows: torch.Tensor, batch: int, init_adapter: Adapter | None = None,
                 desc: str = "batches", show_progress: bool = True, kv_cache: bool = False,
                 kv_layer_bits: bool = False) -> dict:
    """The per-batch records of `windows` [N, T] cut into batches of `batch` windows (N a multiple of it); with
    kv_cache, each batch's key-cache section too (research.probing.hf.kv: its losses by bits, 5 forwards more per
    batch; the layers' errors on the first batch only, one forward and 30 approximate attentions per layer); with
    kv_layer_bits, each layer's usable bits on the first batch too (4 forwards a layer)."""
    if windows.shape[0] % batch:
        raise ValueError(f"{windows.shape[0]} windows do not cut into batches of {batch}")
    adapter.check_window(windows.shape[1])
    adapter.check_token_ids(windows, "the text")
    L = adapter.n_layers
    device = next(adapter.model.parameters()).device
    records = []
    t0 = time.perf_counter()
    for ids in tqdm(windows.split(batch), desc=desc, disable=not show_progress):
        ids = ids.to(device)
        sink, loss = _run(adapter, ids)
        rec = {"loss": loss, "keys": {s: _by_layer(sink.keys[s], L) for s in KEY_SITES if s in sink.keys},
               "attn": _by_layer(sink.attn, L)}
        if sink.pairs:
            rec["pair_share"] = [sink.pairs[i] for i in range(L)]
        if kv_cache:  # the losses on every batch, the layers' errors (most of the cost) on the first
            rec["kv"] = hf_kv_cache_record(adapter, ids, errors=not records, per_layer=kv_layer_bits and not records)
        if init_adapter is not None:
            ref, ref_loss = _run(init_adapter, ids)
            rec["init_keys"] = {s: _by_layer(ref.keys[s], L) for s in KEY_SITES if s in ref.keys}
            rec["init_loss"] = ref_loss
        records.append(rec)
    return {"batches": records, "gains": gains(adapter), "measure_s": time.perf_counter() - t0}
