"""Measure a pretrained model's keys on batches of real text: the data of research/pretrained_keys_study.py.

    record = measure_keys(adapter, windows_NT, batch=4, init_adapter=untrained_same_architecture)

Per text batch (the unit of uncertainty: one model is one sample, so what varies is the text),
with the probe's own functions (research.probing.metrics):
- keys: key_metrics per layer and KV head at k_proj, at k_norm where the model has one, and
  after RoPE (k_rope), [L][Hkv] per metric;
- attn: attention_metrics per layer and query head (entropy, sink_mass over all query positions,
  sink_mass_excl_q0 over positions 1..T-1, logit_max), [L][Hq];
- loss: the model's next-token loss on the batch (nats per token), its behaviour on that text;
- init_keys: the same key metrics of an untrained model of the same architecture (its
  initialization, seeded) on the same batch: the reference of "low rank".
Per model, exact (weights, no sampling): the gains of k_norm / q_norm as the multiplier the model
applies (1 + w for Gemma), [L][D].
Nothing of a [T, T] size for all heads and nothing of the hidden states is kept: the adapter
calls back layer by layer (research.access.adapters) and each call is reduced at once.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from research.access.adapters import Adapter
from research.inspection.tour import excluding_query0
from research.probing.metrics import attention_metrics, key_metrics

KEY_SITES = ("k_proj", "k_norm", "k_rope")
ATTN_FIELDS = ("entropy", "sink_mass", "sink_mass_excl_q0", "logit_max")


class _KeySink:
    """The adapter's callbacks, reduced to per-head metrics of one batch."""

    def __init__(self):
        self.keys: dict[str, dict[int, dict]] = {}
        self.attn: dict[int, dict] = {}

    def on_state(self, l, h):  # the key study needs no hidden states
        pass

    def on_keys(self, i: int, site: str, k_HBTD: torch.Tensor) -> None:
        self.keys.setdefault(site, {})[i] = {m: v.tolist() for m, v in key_metrics(k_HBTD).items()}

    def on_attention(self, i, q_BHTD, k_BKTD, v_BKTD, scaling, window, softcap):
        k = k_BKTD.transpose(0, 1)
        st = attention_metrics(q_BHTD.transpose(0, 1), k, v_BKTD.transpose(0, 1), scale=scaling, window=window,
                               softcap=softcap)
        self.on_keys(i, "k_rope", k)
        T = q_BHTD.shape[2]
        self.attn[i] = {"entropy": st["entropy"].tolist(), "sink_mass": st["sink_mass"].tolist(),
                        "sink_mass_excl_q0": excluding_query0(st["sink_mass"], T).tolist(),
                        "logit_max": st["logit_max"].tolist()}
        return st["output"].permute(1, 2, 0, 3)


def _run(adapter: Adapter, ids: torch.Tensor) -> tuple[_KeySink, float]:
    sink = _KeySink()
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
                 desc: str = "batches", show_progress: bool = True) -> dict:
    """The per-batch records of `windows` [N, T] cut into batches of `batch` windows (N a multiple of it)."""
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
        if init_adapter is not None:
            ref, ref_loss = _run(init_adapter, ids)
            rec["init_keys"] = {s: _by_layer(ref.keys[s], L) for s in KEY_SITES if s in ref.keys}
            rec["init_loss"] = ref_loss
        records.append(rec)
    return {"batches": records, "gains": gains(adapter), "measure_s": time.perf_counter() - t0}
