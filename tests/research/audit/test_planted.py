"""qk-audit on tiny models built offline: every clean model gives no finding, and each planted bug (docs/audit.md's
list) is named, with its layer, and nothing else is flagged; θ is recovered within 1% and the scale within 1e-3."""
from __future__ import annotations

import dataclasses
import pytest
import torch
import torch.nn.functional as F

from configs.config import ModelConfig
from models.llm import MinimalLLM
from research.access import OwnAdapter
from research.audit import audit
from research.audit.command import checkpoint_gains
from research.audit.declared import ladder
from research.probing.hf.model import adapter_for
from tests.research.inspection.builders import hf_config, make_hf

IDS = torch.randint(3, 290, (2, 24), generator=torch.Generator().manual_seed(1))
OWN = ModelConfig(vocab_size=300, n_layers=2, d_model=64, n_heads=4, d_ff=128, max_seq_len=64)


def own(**kw) -> MinimalLLM:
    torch.manual_seed(0)
    model = MinimalLLM(dataclasses.replace(OWN, **kw)).float().eval()
    with torch.no_grad():  # gains off their initial ones, so a swap or a reset shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


def hf(family: str, **config) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    c = hf_config(family)
    for k, v in config.items():
        setattr(c, k, v)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(c).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


def flagged(findings: list[dict]) -> list[tuple[int, str, str]]:
    return [(f["layer"], f["check"], f["text"]) for f in findings if f["status"] != "as declared"]


def run(model, checkpoint=None):
    adapter = OwnAdapter(model) if isinstance(model, MinimalLLM) else adapter_for(model)
    return audit(adapter, IDS, checkpoint=checkpoint)


@pytest.mark.parametrize("kw", [{}, {"qk_norm": "frozen"}, {"qk_norm": "none"}, {"attn_gate": "elementwise"},
                                {"attn_gate": "headwise"}, {"attn_softcap": 2.0}, {"qk_norm_scope": "full"},
                                {"n_kv_heads": 2}, {"rope_fraction": 0.5}, {"rope_theta": 5e5}],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_every_clean_variant_of_this_projects_model_gives_no_finding(kw):
    findings = run(own(**kw))
    assert flagged(findings) == [] and len(findings) >= 8


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "gpt2", "gpt_neox", "apertus", "arcee", "qwen2",
                                    "mistral", "olmo2", "olmo3", "smollm3", "qwen3_5", "gemma4"])
def test_every_clean_family_gives_no_finding(family):
    findings = run(make_hf(family).float().eval())
    assert flagged(findings) == []


class _Skipped:
    """A norm whose module exists, weights and all, but whose call does nothing: built, never called."""

    def __call__(self, x, *args, **kwargs):
        return x


def skip(norm: torch.nn.Module) -> None:
    norm.__class__ = type(f"Skipped{type(norm).__name__}", (_Skipped, type(norm)), {})


@pytest.mark.parametrize("make", [lambda: own(), lambda: hf("qwen3"), lambda: hf("gemma3")], ids=["own", "qwen3",
                                                                                                "gemma3"])
def test_a_norm_built_but_never_called_is_named(make):
    model = make()
    adapter = OwnAdapter(model) if isinstance(model, MinimalLLM) else adapter_for(model)
    skip(adapter.qk_norms(1)[1])
    got = flagged(run(model))
    assert got == [(1, "k_norm", "differs: runs no k norm, config says one runs (built, never called)")], got


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_gains_reset_to_ones_and_swapped_gains_are_named_against_the_checkpoint(family, tmp_path):
    model = hf(family)
    model.save_pretrained(tmp_path)
    adapter = adapter_for(model)
    stored = checkpoint_gains(adapter, tmp_path)
    assert sorted(stored) == sorted(f"{i}.{w}" for i in range(3) for w in "qk")
    assert flagged(run(model, stored)) == []
    q, k = adapter.qk_norms(2)
    with torch.no_grad():
        k.weight.fill_(1.0 - adapter.gain_offset)  # a loader that put ones where the file holds gains
    got = flagged(run(model, stored))
    assert [(g[0], g[1]) for g in got] == [(2, "k_norm")] and "runs gain all ones, the checkpoint holds" in got[0][2]
    model = hf(family)
    q, k = adapter_for(model).qk_norms(1)
    with torch.no_grad():
        saved = q.weight.clone()
        q.weight.copy_(k.weight)
        k.weight.copy_(saved)
    got = flagged(run(model, stored))
    assert got == [(1, "q_norm", "differs: runs the checkpoint's k norm gain (q and k swapped)"),
                   (1, "k_norm", "differs: runs the checkpoint's q norm gain (q and k swapped)")], got


def _set_inv_freq(model, f: torch.Tensor) -> None:
    emb = model.model.rotary_emb if hasattr(model, "model") else model.gpt_neox.rotary_emb
    emb.inv_freq = f.float()
    emb.original_inv_freq = f.float()


@pytest.mark.parametrize("declared,runs", [(5e5, 1e4), (1e4, 5e5)])
def test_a_wrong_theta_is_named_in_every_layer_and_recovered(declared, runs):
    model = hf("llama", rope_parameters={"rope_type": "default", "rope_theta": declared})
    _set_inv_freq(model, ladder(runs, 8, 16))
    findings = run(model)
    got = flagged(findings)
    assert [(g[0], g[1]) for g in got] == [(i, "rope") for i in range(3)], got
    assert f"config says θ {declared:g}" in got[0][2]
    for f in findings:
        if f["check"] == "rope":
            assert f["theta"] == pytest.approx(runs, rel=0.01)
    m = own(rope_theta=declared)
    m.rotary = type(m.rotary)(16, 64, runs)
    got = run(m)
    assert [(g[0], g[1]) for g in flagged(got)] == [(0, "rope"), (1, "rope")]
    assert [f["theta"] for f in got if f["check"] == "rope"] == pytest.approx([runs, runs], rel=0.01)


def test_partial_rotary_ignored_and_the_wrong_denominator_are_named():
    model = make_hf("gpt_neox").float().eval()  # rotary_pct 0.25: 4 of 16 dims, frequencies over 4
    for layer in model.gpt_neox.layers:
        layer.attention.rotary_ndims = 16
    _set_inv_freq(model, ladder(1e4, 8, 16))
    got = flagged(run(model))
    assert [(g[0], g[1]) for g in got] == [(i, "rope") for i in range(3)]
    assert "runs pairing half-split (j, j+8) over 16 of 16 dims, config says half-split (j, j+2) over 4" in got[0][2]
    model = make_hf("gpt_neox").float().eval()
    _set_inv_freq(model, 1e4 ** (-torch.arange(0, 4, 2, dtype=torch.float64) / 16))  # over head_dim, not 4
    got = flagged(run(model))
    assert [(g[0], g[1]) for g in got] == [(i, "rope") for i in range(3)]
    assert got[0][2] == "differs: frequencies are θ 10000 over head_dim 16, config implies the denominator 4"


def _interleaved(q, k, cos, sin, unsqueeze_dim=1):
    half = cos.shape[-1] // 2
    c, s = cos[..., :half].unsqueeze(unsqueeze_dim), sin[..., :half].unsqueeze(unsqueeze_dim)

    def rot(x):
        a, b = x[..., ::2], x[..., 1::2]
        return torch.stack((a * c - b * s, b * c + a * s), -1).flatten(-2)
    return rot(q), rot(k)


def test_interleaved_pairs_where_half_split_is_declared_are_named(monkeypatch):
    import transformers.models.llama.modeling_llama as llama
    monkeypatch.setattr(llama, "apply_rotary_pos_emb", _interleaved)
    got = flagged(run(hf("llama")))
    assert [(g[0], g[1]) for g in got] == [(i, "rope") for i in range(3)]
    assert got[0][2] == ("differs: runs pairing interleaved (2j, 2j+1), config says half-split (j, j+8) over 16 "
                         "of 16 dims")
    m = own()
    rotary = m.rotary

    def forward(x_BTHD):  # the model's own angles, applied to interleaved pairs
        T = x_BTHD.shape[1]
        cos, sin = (torch.cat([t[:T]] * 2, -1)[None] for t in (rotary.cos, rotary.sin))
        x = x_BTHD.transpose(1, 2)
        return _interleaved(x, x, cos, sin)[0].transpose(1, 2)
    m.rotary.forward = forward
    got = flagged(run(m))
    assert [(g[0], g[1]) for g in got] == [(0, "rope"), (1, "rope")] and "interleaved" in got[0][2]


def test_a_wrong_scale_is_named_and_measured_both_ways(monkeypatch):
    model = hf("gemma3", query_pre_attn_scalar=1)  # Gemma 4's way: scale 1.0 declared
    model.model.layers[1].self_attn.scaling = 16 ** -0.5
    findings = run(model)
    assert flagged(findings) == [(1, "scale", "differs: runs scale 0.25 (1/sqrt(16)), config says 1")]
    assert [f["scale"] for f in findings if f["check"] == "scale"] == pytest.approx([1, 0.25, 1], rel=1e-3)
    model = hf("llama")
    model.model.layers[2].self_attn.scaling = 1.0
    assert flagged(run(model)) == [(2, "scale", "differs: runs scale 1, config says 0.25 (1/sqrt(16))")]
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: sdpa(*a, **{**k, "scale": 1.0}))
    assert [(g[0], g[1]) for g in flagged(run(own()))] == [(0, "scale"), (1, "scale")]


def test_a_declared_softcap_not_applied_is_named():
    m = own(attn_softcap=1.0)
    assert flagged(run(m)) == []
    m.blocks[0].attn.softcap = 0.0  # the cap left out at run time: the plain SDPA path
    got = flagged(run(m))
    assert [(g[0], g[1]) for g in got] == [(0, "softcap")] and got[0][2].startswith("differs: no soft-cap runs")
    # transformers' Gemma 3 attention never passes its config's attn_logit_softcapping on (eager or SDPA): a config
    # that sets it declares a cap that does not run, in every layer
    model = hf("gemma3", attn_logit_softcapping=1.0)
    model.set_attn_implementation("eager")
    got = flagged(run(model))
    assert [(g[0], g[1]) for g in got] == [(i, "softcap") for i in range(3)]
    assert got[0][2].startswith("differs: no soft-cap runs (logits reach") and got[0][2].endswith("config says 1")


def test_a_scale_that_differs_in_one_head_is_named_with_its_head(monkeypatch):
    """An attention function that doubles head 2's logits in layer 1 (a per-head scale the layer's one fit cannot
    follow): the heads are fitted one by one and head 2 is named."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as registry
    model = hf("llama")
    sdpa = registry["sdpa"]

    def head_2_doubled(module, query, key, value, mask, **kwargs):
        if module.layer_idx == 1:
            query = query.clone()
            query[:, 2] *= 2
        return sdpa(module, query, key, value, mask, **kwargs)
    monkeypatch.setitem(registry._global_mapping, "sdpa", head_2_doubled)
    findings = run(model)
    assert flagged(findings) == [(1, "scale", "differs: head 2 runs 0.5 (1/sqrt(4)), config says 0.25 (1/sqrt(16))")]


def test_older_configs_and_a_rope_type_that_is_no_single_ladder():
    """A config of before transformers 5 (rope_theta at the top, rope_scaling) is read as one of now; a linear-scaled
    RoPE is compared by the frequencies transformers computes from the config, and the unscaled ones are named."""
    from types import SimpleNamespace

    from research.audit.declared import _rope_parameters
    old = SimpleNamespace(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0}, partial_rotary_factor=0.5)
    assert _rope_parameters(old, 0) == {"rope_theta": 5e5, "type": "linear", "factor": 2.0, "rope_type": "linear",
                                        "partial_rotary_factor": 0.5}
    model = hf("llama", rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0})
    assert flagged(run(model)) == []
    _set_inv_freq(model, ladder(1e4, 8, 16))  # the scaling left out at run time
    got = flagged(run(model))
    assert [(g[0], g[1]) for g in got] == [(i, "rope") for i in range(3)]
    assert got[0][2] == "differs: frequencies off the config's (linear) by up to 100.0%"


def test_a_rope_that_differs_in_one_kv_head_is_named_with_its_head():
    """This project's model with 2 KV heads whose Rotary turns KV head 1 (and query head 1) by θ 1e4 where the config
    says 5e5: the layer's pooled check fails, each KV head is checked alone, and head 1 is named."""
    m = own(rope_theta=5e5, n_kv_heads=2)
    right, wrong = m.rotary, type(m.rotary)(16, 64, 1e4)
    forward = right.forward

    def mixed(x_BTHD):
        y = forward(x_BTHD)
        y[:, :, 1] = wrong(x_BTHD[:, :, 1:2])[:, :, 0]
        return y
    right.forward = mixed
    findings = run(m)
    got = flagged(findings)
    assert [(g[0], g[1]) for g in got] == [(0, "rope"), (1, "rope")], got
    assert got[0][2] == "differs in KV head 1 of 2: runs θ 10000 (over 16 dims), config says θ 500000"
    assert [f["theta"] for f in findings if f["check"] == "rope"] == pytest.approx([1e4, 1e4], rel=0.01)


def test_a_norm_that_skips_one_head_is_named_with_its_head():
    """Layer 0's k norm leaves KV head 1's keys as they come (a per-head norm applied to a slice that misses a head):
    the layer's check fails, each head is measured alone, and head 1 is named."""
    m = own(n_kv_heads=2)
    norm = m.blocks[0].attn.k_norm
    forward = norm.forward

    def one_head_skipped(x):
        y = forward(x)
        y[..., 1, :] = x[..., 1, :]
        return y
    norm.forward = one_head_skipped
    got = flagged(run(m))
    assert [(g[0], g[1]) for g in got] == [(0, "k_norm")], got
    assert got[0][2].startswith("differs in head 1 of 2: output / gain has RMS")


def test_gemma4s_own_layout_is_read_and_its_port_bugs_are_named():
    """Gemma 4 (builders' tiny one: full-attention layers 1, 3, 5 with heads of 32, proportional RoPE turning 4 of
    16 pairs over θ 1e6, K = V; layers 4 and 5 reading layers 2 and 3's keys): its own checks hold clean, and a
    port's bugs are named: the scale 1/sqrt(d) where it declares 1 (mlc-llm #3485), the proportional frequencies
    over the rotated dims instead of the head (pie #603's denominator), the value norm skipped."""
    findings = run(make_hf("gemma4").float().eval())
    checks = {(f["layer"], f["check"]) for f in findings}
    assert {(1, "k_eq_v"), (3, "k_eq_v"), (0, "v_norm"), (4, "kv_share"), (5, "kv_share")} <= checks
    assert (0, "k_eq_v") not in checks and (4, "v_norm") not in checks
    assert [f["theta"] for f in findings if f["check"] == "rope" and f["layer"] in (1, 3)] == \
        pytest.approx([1e6, 1e6], rel=0.01)
    model = make_hf("gemma4").float().eval()
    model.model.layers[1].self_attn.scaling = 32 ** -0.5
    assert flagged(run(model)) == [(1, "scale", "differs: runs scale 0.1768 (1/sqrt(32)), config says 1")]
    model = make_hf("gemma4").float().eval()
    model.model.rotary_emb.full_attention_inv_freq = ladder(1e6, 16, 8, 4).float()  # θ^(-2j/8), not /32
    got = flagged(run(model))
    assert got == [(i, "rope", "differs: frequencies are θ 1e+06 over rotary dims 8, config implies the "
                               "denominator 32") for i in (1, 3)], got
    model = make_hf("gemma4").float().eval()
    skip(model.model.layers[2].self_attn.v_norm)
    assert flagged(run(model)) == [(2, "v_norm", "differs: runs no v norm, config says one runs (built, never "
                                                 "called)")]


@pytest.mark.parametrize("kw", [{"qk_gain_shape": "per_head"}, {"qk_gain_shape": "head_scalar", "qk_gain_on": "q",
                                                                 "qk_gain_init": 1.5},
                                {"qk_gain_on": "k"}, {"qk_norm": "frozen", "qk_gain_init": 5.0}, {"qk_mult": 1.3},
                                {"attn_scale": 1.0}, {"attn_scale": 1.0, "attn_softcap": 20.0, "n_kv_heads": 2}],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_every_qk_norm_setting_of_this_projects_model_gives_no_finding_and_a_wrong_one_is_named(kw):
    """The gain shapes, init, multiplier and scale (issue 71) read as declared; a port that drops qk_mult or the
    scale 1.0 (the attention at 1/sqrt(d)) is named at its layer."""
    model = own(**kw)
    findings = run(model)
    assert flagged(findings) == [] and len(findings) >= 8
    if "qk_mult" in kw or "attn_scale" in kw:
        model.blocks[1].attn.given_scale = 16 ** -0.5  # what the port runs: the plain 1/sqrt(d_head)
        got = flagged(run(model))
        assert [(g[0], g[1]) for g in got if g[1] == "scale"] == [(1, "scale")], got
