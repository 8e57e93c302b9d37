"""One probe of a Hugging Face causal LM: a no-grad forward of the fixed batch whose attention calls are reduced,
layer by layer, to a probe record, and the batch's next-token loss from the LM head in chunks."""
from __future__ import annotations

import hashlib
import time

import torch
import torch.nn as nn

from research.access.adapters import InspectError
from research.probing.hf.model import ProbeError, adapter_for, base_model
from research.probing.hf.kv import next_token_loss
from research.probing.hf.rotary import layer_ropes, rope_context
from research.probing.probe import LayerSink, measuring
from research.results.vocabulary import PR
from utils.errors import shown


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
        sink = LayerSink(adapter, self.ropes, lambda window: rope_context(adapter, ids.shape[1], window))
        t0 = time.perf_counter()
        with measuring(base, device, self.precision), adapter.capture(sink):
            base(input_ids=ids, use_cache=False, logits_to_keep=1)  # the vocabulary's logits: below, in chunks
            loss = next_token_loss(adapter, sink.final, ids)
        layers = sorted(({"layer": r["layer"], **({"pair_share": r["pair_share"]} if "pair_share" in r else {}), **r}
                         for r in sink.layers), key=lambda r: r["layer"])
        if len(layers) != adapter.n_layers:
            raise ProbeError(f"the probe saw the attention of {len(layers)} of {adapter.n_layers} layers: the model's "
                             f"attention does not go through transformers' attention functions (a custom forward?)")
        return {"layers": layers, "mean_pr": sum(r["means"][PR] for r in layers) / len(layers),
                "probe_time_s": time.perf_counter() - t0, "batch": list(self.ids.shape),
                "precision": self.precision, "loss": loss,
                **({"rotary": {"pairing": adapter.rope_pairing, "context": rope_context(adapter, self.ids.shape[1]),
                               "rotary_dims": adapter.rotary_dims}} if sink.ropes else {})}
