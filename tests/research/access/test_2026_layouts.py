"""The 2026 layouts the adapters read: OLMo 3 (OLMo 2's whole-projection norms, sliding windows, RoPE per layer
type), SmolLM3 (layers without RoPE) and Qwen3.5's text model (its full-attention layers, among linear ones). The
parity every adapter has: the keys the adapter rotates are the model's own, attention rebuilt from the captured q,
k, v gives the model's logits, and the probe and the audit read them."""
from __future__ import annotations

import pytest
import torch

from research.audit import audit
from research.probing.hf import HFKeyProbe
from research.probing.hf.kv import causal_attention
from research.probing.hf.model import adapter_for
from research.probing.hf.rotary import AdapterRope
from tests.research.inspection.builders import make_hf
from tests.tolerances import logit_atol

IDS = torch.randint(3, 290, (2, 12), generator=torch.Generator().manual_seed(0))


class _Rebuilt:
    """Keys before and after RoPE, and each layer's attention computed here from the captured q, k, v."""

    def __init__(self):
        self.pre, self.post = {}, {}

    def on_state(self, *args):
        pass

    def on_keys(self, i, site, k):
        if site == "k_norm" or i not in self.pre:
            self.pre[i] = k

    def on_attention(self, i, q, k, v, scaling, window, softcap):
        self.post[i] = k.transpose(0, 1)
        out = causal_attention(*(x.transpose(0, 1) for x in (q, k, v)), scaling, window, softcap)
        return out.permute(1, 2, 0, 3)


def _rebuilt(model, adapter) -> _Rebuilt:
    """The model's logits with every layer's attention computed by _Rebuilt equal its own; the sink."""
    with torch.no_grad():
        ref = model(input_ids=IDS, use_cache=False).logits
        sink = _Rebuilt()
        with adapter.capture(sink):
            rebuilt = model(input_ids=IDS, use_cache=False).logits
    torch.testing.assert_close(rebuilt, ref, atol=logit_atol(ref, adapter.n_layers, adapter.d_model), rtol=0)
    return sink


@pytest.mark.parametrize("family", ["olmo3", "smollm3", "qwen3_5"])
def test_the_layouts_rotation_attention_probe_and_audit(family):
    model = make_hf(family).float().eval()
    adapter = adapter_for(model)
    assert adapter.family == family
    sink = _rebuilt(model, adapter)
    for i in range(adapter.n_layers):
        pre, post = sink.pre[i], sink.post[i]
        if adapter.layer_has_rope(i):
            rope = AdapterRope(adapter, i)
            assert (rope(pre) - post).abs().max() <= 1e-6 * post.abs().max()
        else:  # SmolLM3's NoPE layer: the attention reads the keys as projected
            assert family == "smollm3" and i == 1 and torch.equal(pre, post)
    record = HFKeyProbe(IDS)(model)
    assert len(record["layers"]) == adapter.n_layers and all(("pair_share" in r) == adapter.layer_has_rope(r["layer"])
                                              for r in record["layers"])
    assert [f for f in audit(adapter, IDS) if f["status"] != "as declared"] == []


def test_gemma4_rotation_attention_and_shared_keys():
    """Gemma 4's text layers (builders' tiny one): heads of 16 and 32, K = V on full layers, layers 4 and 5 reading
    layers 2 and 3's keys. Attention rebuilt from the captured q, k, v gives the model's logits; each layer that
    computes keys rotates them as AdapterRope says (proportional RoPE: 4 of 16 pairs turn on full layers); a shared
    layer attends with its source's keys; a tool that reads one head size for the model says why it cannot."""
    from research.access.adapters import InspectError
    model = make_hf("gemma4").float().eval()
    adapter = adapter_for(model)
    assert [adapter.head_dim_of(i) for i in range(6)] == [16, 32] * 3 and [adapter.kv_source(i) for i in range(6)] \
        == [0, 1, 2, 3, 2, 3]
    sink = _rebuilt(model, adapter)
    assert sorted(sink.pre) == [0, 1, 2, 3]
    for i in range(6):
        post = sink.post[i]
        if i in sink.pre:
            rope = AdapterRope(adapter, i)
            assert int((rope.frequencies > 0).sum()) == (8 if i % 2 == 0 else 4)
            assert (rope(sink.pre[i]) - post).abs().max() <= 1e-6 * post.abs().max()
        else:
            assert torch.equal(post, sink.post[adapter.kv_source(i)])
    with pytest.raises(InspectError, match=r"head sizes \[16, 32\]: this tool reads models whose layers share one"):
        HFKeyProbe(IDS)(model)
