"""qk-audit: check from a model's keys that the attention it runs is the attention its config declares (q/k norms,
RoPE, scale, soft-cap), layer by layer. research/qk_audit.py is the command; docs/audit.md says what each check
measures and its tolerance.

    findings = audit(adapter, ids_BT)       # one dict per layer and check: status "as declared" / "differs" / ...
"""
from __future__ import annotations

import torch

from research.audit.checks import TOLERANCE, layer_checks
from research.audit.declared import declared
from research.audit.sink import AuditSink


def audit(adapter, ids_BT: torch.Tensor, checkpoint: dict[str, torch.Tensor] | None = None) -> list[dict]:
    """Every check of every layer from one forward of token ids [B, T] through the adapter's capture. checkpoint:
    the q/k norm gains the model's file holds ({"<layer>.q" or ".k": gain}); None: not compared."""
    return audit_layers(adapter, ids_BT, checkpoint)[0]


@torch.no_grad()
def audit_layers(adapter, ids_BT: torch.Tensor, checkpoint: dict[str, torch.Tensor] | None = None
                 ) -> tuple[list[dict], dict[int, dict]]:
    """(audit's findings, the tensors each layer ran: AuditSink.layers), what --reference compares."""
    sink = AuditSink()
    was_training = adapter.model.training
    adapter.model.eval()
    try:
        with adapter.capture(sink):
            adapter.forward(ids_BT.to(next(adapter.model.parameters()).device))
    finally:
        adapter.model.train(was_training)
    findings = []
    for i in range(adapter.n_layers):
        d = declared(adapter, i)
        source = None if d.kv_from is None else sink.layers.get(d.kv_from)
        findings += layer_checks(adapter, i, sink.layers.get(i, {"norm": {}}), d, TOLERANCE, checkpoint, source)
    return findings, sink.layers
