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
from research.probing.hf_rotary import AdapterRope, layer_ropes, rope_context
from research.probing.probe import layer_record, measuring
from research.results.vocabulary import PR
from utils.errors import shown


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

    on_queries = on_keys

    def on_attention(self, i, q_BHTD, k_BKTD, v, scaling, window, softcap):
        t = self.pre.pop(i, {})
        q_norm, k_norm = self.adapter.qk_norms(i)
        gains = self.adapter.gain(q_norm), self.adapter.gain(k_norm)
        has_norm = "k_norm" in t  # else the raw projection stands for k_norm, as this project's qk_norm='none'
        t.update(q_rope=q_BHTD.transpose(0, 1), k_rope=k_BKTD.transpose(0, 1))                   # [H, B, T, D]
        if not has_norm:
            t["k_norm"] = t.pop("k_proj")
        rope = self.ropes[i] if self.ropes is not None else None
        rec = layer_record(i, t, gains=gains, pre_gain=gains[1] if has_norm else None, rope=rope,
                           context=rope_context(self.adapter, self.context, window), scale=scaling, window=window,
                           softcap=softcap)
        self.layers.append({"layer": i, **({"pair_share": rec["pair_share"]} if rope is not None else {}), **rec})
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
