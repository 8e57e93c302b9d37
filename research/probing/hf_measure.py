"""One probe of a Hugging Face causal LM: a no-grad forward of the fixed batch whose attention calls are reduced,
layer by layer, to a probe record, and the batch's next-token loss from the LM head in chunks."""
from __future__ import annotations

import hashlib
import time

import torch
import torch.nn as nn

from research.access.adapters import InspectError
from research.probing.hf_model import ProbeError, adapter_for, base_model
from research.probing.hf_kv import next_token_loss
from research.probing.hf_rotary import AdapterRope, layer_ropes, rope_context, rotary_fields
from research.probing.key_rank import ranked_key_metrics
from research.probing.metrics import attention_metrics, gamma_stats, key_metrics
from research.probing.probe import attention_record, lists_and_means, measuring
from research.results.vocabulary import PR, PRE_GAIN_SITES
from utils.errors import shown

RANKED_SITES = ("k_norm", "k_rope")  # where the probe records key_rank, as research.probing.probe does


class _Sink:
    """The adapter's callbacks reduced, layer by layer, to a probe record; the model's own attention computes
    the output (on_attention returns None)."""

    def __init__(self, adapter, context: int, ropes: list[AdapterRope] | None = None):
        self.adapter = adapter
        self.context = context  # the probe batch's length: the wavelengths' reference where the model names none
        self.ropes = ropes if ropes is not None else layer_ropes(adapter)  # None: the model has no RoPE
        self.pre: dict[int, dict[str, torch.Tensor]] = {}
        self.layers: list[dict] = []
        self.final: torch.Tensor | None = None

    def on_state(self, l: int, h_BTd: torch.Tensor) -> None:
        if l == self.adapter.n_layers:
            self.final = h_BTd

    def on_keys(self, i: int, site: str, k_HBTD: torch.Tensor) -> None:
        self.pre.setdefault(i, {})[site] = k_HBTD

    def on_queries(self, i: int, site: str, q_HBTD: torch.Tensor) -> None:
        self.pre.setdefault(i, {})[site] = q_HBTD

    def on_attention(self, i, q_BHTD, k_BKTD, v, scaling, window, softcap):
        t = self.pre.pop(i, {})
        q_norm, k_norm = self.adapter.qk_norms(i)
        g_q, g_k = self.adapter.gain(q_norm), self.adapter.gain(k_norm)
        q, k = q_BHTD.transpose(0, 1), k_BKTD.transpose(0, 1)                 # [H, B, T, D]
        with torch.autocast(q.device.type, enabled=False):  # metrics in full precision
            attn_m = attention_metrics(q, k, scale=scaling, window=window, softcap=softcap)
            pre_k = t.get("k_norm", t.get("k_proj"))
            sites = {"k_norm": pre_k, **({"k_proj": t["k_proj"]} if "k_norm" in t else {}), "k_rope": k}
            if g_k is not None and "k_norm" in t:
                gain = g_k.to(pre_k.device).reshape(-1, 1, 1, self.adapter.head_dim)   # [1 or Hkv, 1, 1, D]
                sites[PRE_GAIN_SITES["k_norm"]] = torch.where(gain != 0, pre_k.float() / gain, 0.0)
            both = g_q is not None and g_k is not None and "q_norm" in t and "k_norm" in t
            rec: dict = {"layer": i}
            records = {s: ranked_key_metrics(x) if s in RANKED_SITES else key_metrics(x) for s, x in sites.items()}
            records["attn"] = attention_record(attn_m, t.get("q_norm"), pre_k, g_q if both else None,
                                               g_k if both else None)
            if self.ropes is not None:
                k_use, q_use, rec["pair_share"] = rotary_fields(self.ropes[i], q, k, attn_m["logit_at"],
                                                                rope_context(self.adapter, self.context, window))
                records["k_norm"].update(k_use)
                records["attn"].update(q_use)
            lists, means = lists_and_means(records)
            rec.update(lists)
        rec["gamma_k"], rec["gamma_q"], rec["means"] = gamma_stats(g_k), gamma_stats(g_q), means
        self.layers.append(rec)
        return None


class HFKeyProbe:
    """Measures a Hugging Face causal LM's keys on a fixed batch of token ids [B, T]: a record in the form of
    research.probing.probe.KeyProbe's, plus `loss`, the batch's next-token loss (nats per token)."""

    def __init__(self, probe_ids_BT: torch.Tensor, precision: str = "fp32"):
        if not isinstance(probe_ids_BT, torch.Tensor) or probe_ids_BT.dim() != 2 or probe_ids_BT.shape[1] < 2:
            got = tuple(probe_ids_BT.shape) if isinstance(probe_ids_BT, torch.Tensor) else probe_ids_BT
            raise ProbeError(f"the probe batch must be token ids [B, T] with T >= 2, got {shown(got, 60)}")
        if precision not in ("fp32", "bf16"):
            raise ProbeError(f"precision {shown(precision)}: choose fp32 or bf16")
        self.ids = probe_ids_BT.long()
        self.precision = precision
        self.current = None

    @property
    def batch_sha256(self) -> str:
        """The probe batch's fingerprint: a resumed run must probe the same tokens."""
        return hashlib.sha256(self.ids.cpu().numpy().tobytes()).hexdigest()

    def adapter(self, model: nn.Module):
        base = base_model(model)
        if self.current is None or self.current.model is not base:
            try:
                adapter = adapter_for(base)
                adapter.check_window(self.ids.shape[1], "the probe batch's windows", "probe_ids_BT's length")
                adapter.check_token_ids(self.ids, "the probe batch")
            except InspectError as e:
                raise ProbeError(str(e)) from e
            self.current, self.ropes = adapter, layer_ropes(adapter)
        return self.current

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> dict:
        adapter = self.adapter(model)
        base = adapter.model
        device = next(base.parameters()).device
        ids = self.ids.to(device)
        sink = _Sink(adapter, ids.shape[1], self.ropes)
        t0 = time.perf_counter()
        with measuring(base, device, self.precision), adapter.capture(sink):
            base(input_ids=ids, use_cache=False, logits_to_keep=1)  # the vocabulary's logits: below, in chunks
            loss = next_token_loss(adapter, sink.final, ids)
        layers = sorted(sink.layers, key=lambda r: r["layer"])
        if len(layers) != adapter.n_layers:
            raise ProbeError(f"the probe saw the attention of {len(layers)} of {adapter.n_layers} layers: the model's "
                             f"attention does not go through transformers' attention functions (a custom forward?)")
        return {"layers": layers, "mean_pr": sum(r["means"][PR] for r in layers) / len(layers),
                "probe_time_s": time.perf_counter() - t0, "batch": list(self.ids.shape),
                "precision": self.precision, "loss": loss,
                **({"rotary": {"pairing": adapter.rope_pairing, "context": rope_context(adapter, self.ids.shape[1]),
                               "rotary_dims": adapter.rotary_dims}} if sink.ropes else {})}
