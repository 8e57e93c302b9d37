"""What the audit reads of one forward, through the model's adapter (the capture the key probe uses): per layer the
key projection, each q/k norm's own input and output where it runs, the attention call's q, k, v and output, and
the gate of this project's gated attention.

    sink = AuditSink(); with adapter.capture(sink): model(ids)     # sink.layers[i]: that layer's tensors
"""
from __future__ import annotations

import torch


class AuditSink:
    """Keeps each layer's tensors as float32 [heads, B, T, D] (norms: their own layouts)."""

    def __init__(self):
        self.layers: dict[int, dict] = {}

    def _at(self, i: int) -> dict:
        return self.layers.setdefault(i, {"norm": {}})

    def on_state(self, l, h) -> None:
        pass

    def on_keys(self, i: int, site: str, k_HBTD: torch.Tensor) -> None:
        if site == "k_proj":
            self._at(i)["k_proj"] = k_HBTD.float()

    def on_norm(self, i: int, which: str, x: torch.Tensor, y: torch.Tensor) -> None:
        self._at(i)["norm"].setdefault(which, (x.float(), y.float()))  # the first call: the layer's own

    def on_gate(self, i: int, g_HBTg: torch.Tensor) -> None:
        self._at(i)["gate"] = g_HBTg.float()

    def on_attention(self, i, q_BHTD, k_BKTD, v_BKTD, scaling, window, softcap):
        self._at(i).update(q=q_BHTD.transpose(0, 1).float(), k=k_BKTD.transpose(0, 1).float(),
                           v=None if v_BKTD is None else v_BKTD.transpose(0, 1).float(), window=window)
        return None

    def on_output(self, i: int, out_BTHD: torch.Tensor) -> None:
        layer = self._at(i)
        out = out_BTHD.permute(2, 0, 1, 3).float()                                   # [H, B, T, Dv]
        if "gate" in layer:  # this project's gated attention: wo reads the output times its sigmoid gate
            out = out / layer["gate"]
        layer["out"] = out
