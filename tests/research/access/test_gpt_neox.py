"""The GPT-NeoX adapter (Pythia's family) on tiny random models built offline: its q/k/v give transformers' own eager
attention, its keys after RoPE are the model's, its RoPE data (rotated dims, pairing, frequencies) are the model's,
and its parameter count is the model's; a network test runs the Pythia line of docs/inspection.md."""
from __future__ import annotations

import dataclasses
import math
import shlex
from pathlib import Path

import pytest
import torch

from research.access.adapters import ADAPTERS, GPTNeoXAdapter
from research.probing.hf import HFKeyProbe
from research.probing.metrics import key_metrics
from research.probing.probe import as_lists
from tests.research.inspection.builders import make_hf
from tests.tolerances import forward_rel_tol, sum_rel_tol, unit_roundoff

D_MODEL, HEADS, HEAD_DIM, T = 64, 4, 16, 24
SETTINGS = [(0.25, True), (0.25, False), (1.0, True), (1.0, False)]  # (rotary_pct, use_parallel_residual)


def neox(rotary_pct=0.25, parallel=True, attn="eager"):
    """A tiny GPT-NeoX model whose biases (query_key_value, dense, LayerNorms, MLP) are all away from zero."""
    model = make_hf("gpt_neox", rotary_pct=rotary_pct, use_parallel_residual=parallel).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model, GPTNeoXAdapter(model, attn_implementation=attn)


def ids(B=2, seed=1):
    return torch.randint(3, 290, (B, T), generator=torch.Generator().manual_seed(seed))


class Sink:
    """What capture calls back with: the layers' input states, the keys at k_proj, the q and k attention received."""

    def __init__(self):
        self.states, self.k_proj, self.attention = {}, {}, {}

    def on_state(self, l, h):
        self.states[l] = h

    def on_keys(self, i, site, k):
        self.k_proj[i] = k

    def on_attention(self, i, q, k, v, scaling, window, softcap):
        self.attention[i] = (q, k, scaling)
        return None  # the model's own attention computes the output


def rotate(x, adapter, i):
    """x [B, H, T, D] float64 turned by RoPE as the adapter describes it, by hand: the first rotary_dims dims, pair
    (j, j + rotary_dims / 2) by position x rotary_frequencies[j]; the rest unchanged."""
    assert adapter.rope_pairing == "half"
    r = adapter.rotary_dims
    angle = torch.arange(x.shape[2], dtype=torch.float64)[:, None] * adapter.rotary_frequencies(i).double()
    cos, sin = angle.cos(), angle.sin()                                         # [T, r / 2]
    x1, x2, rest = x[..., :r // 2], x[..., r // 2:r], x[..., r:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


@pytest.mark.parametrize("rotary_pct, parallel", SETTINGS)
def test_attention_from_the_adapters_qkv_is_the_models_eager_attention(rotary_pct, parallel):
    """Per layer and head: q, k, v from the adapter's weights and biases (query_key_value taken apart head by head)
    on the state it reports entering the layer, RoPE by the adapter's own data, causal softmax: transformers' eager
    attention output (the input of `dense`), in float64 against fp32."""
    model, adapter = neox(rotary_pct, parallel)
    assert adapter.parallel_residual is parallel
    outputs = {}
    hooks = [adapter.attn(i).dense.register_forward_pre_hook(lambda m, args, i=i: outputs.__setitem__(i, args[0]))
             for i in range(adapter.n_layers)]
    sink = Sink()
    try:
        with torch.no_grad(), adapter.capture(sink):
            model(input_ids=ids(), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(adapter.n_layers):
        with torch.no_grad():
            x = adapter.attention_norm(i)(sink.states[i]).double()               # the model's own LayerNorm
        w, b = adapter.qkvo(i), adapter.biases(i)
        q, k, v = ((x @ w[m].double().T + b[m].double()).unflatten(-1, (HEADS, HEAD_DIM)).transpose(1, 2)
                   for m in "qkv")                                              # [B, H, T, D]
        q, k = rotate(q, adapter, i), rotate(k, adapter, i)
        p = torch.softmax((q @ k.mT / math.sqrt(HEAD_DIM)).masked_fill(future, -math.inf), dim=-1)
        ours = (p @ v).transpose(1, 2).flatten(2)                               # [B, T, H * D]
        # fp32 against float64: the projection and the attention each sum at most d_model terms (forward_rel_tol's
        # two stages), and the model's fp32 angle position x frequency errs by up to T units of roundoff (radians)
        rel = forward_rel_tol(1, D_MODEL) + T * unit_roundoff("fp32")
        torch.testing.assert_close(outputs[i].double(), ours, rtol=0, atol=rel * ours.abs().max().item())
        assert sink.attention[i][2] == HEAD_DIM ** -0.5


@pytest.mark.parametrize("rotary_pct, parallel", SETTINGS)
def test_the_probes_rotated_keys_are_the_models(rotary_pct, parallel):
    """The keys the probe receives after RoPE equal the model's own: query_key_value's output, its keys taken apart
    and turned by transformers' apply_rotary_pos_emb with the model's cos/sin, bit for bit; the unrotated dims are
    k_proj's exactly, and position 0 is not turned at all. The probe's k_rope metrics are those of these keys."""
    from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb
    model, adapter = neox(rotary_pct, parallel, attn="sdpa")
    projected = {}
    hooks = [adapter.attn(i).query_key_value.register_forward_hook(
        lambda m, args, out, i=i: projected.__setitem__(i, out)) for i in range(adapter.n_layers)]
    sink, x = Sink(), ids()
    try:
        with torch.no_grad(), adapter.capture(sink):
            model(input_ids=x, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        cos, sin = model.gpt_neox.rotary_emb(projected[0], torch.arange(T)[None])
    record = HFKeyProbe(x)(model)
    for i in range(adapter.n_layers):
        qkv = projected[i].view(2, T, HEADS, 3 * HEAD_DIM).transpose(1, 2)      # transformers' own view
        q, k, _ = qkv.chunk(3, dim=-1)
        _, theirs = apply_rotary_pos_emb(q, k, cos, sin)                        # [B, H, T, D]
        k_rope = sink.attention[i][1]
        assert torch.equal(k_rope, theirs)
        rotated, kept = adapter.rotary_split(k_rope)
        assert rotated.shape[-1] == adapter.rotary_dims == int(HEAD_DIM * rotary_pct)
        assert torch.equal(kept, adapter.rotary_split(sink.k_proj[i].transpose(0, 1))[1])
        assert torch.equal(k_rope[:, :, 0], sink.k_proj[i].transpose(0, 1)[:, :, 0])
        ours = key_metrics(theirs.transpose(0, 1))
        for name, values in as_lists(ours).items():  # the same keys, reduced in the probe's own sums
            assert record["layers"][i]["k_rope"][name] == pytest.approx(values, rel=sum_rel_tol("fp32", 2 * T * 16),
                                                                        abs=1e-12), name


def test_query_key_value_is_taken_apart_head_by_head():
    """Row h * 3D + s * D + j of query_key_value (s = 0 q, 1 k, 2 v) is row h * D + j of q, k or v: with each row
    holding its own index, the split is read off by hand."""
    model, adapter = neox()
    qkv = adapter.attn(0).query_key_value
    with torch.no_grad():
        qkv.weight.copy_(torch.arange(3 * D_MODEL, dtype=torch.float32)[:, None].expand(-1, D_MODEL))
        qkv.bias.copy_(torch.arange(3 * D_MODEL, dtype=torch.float32))
    w, b = adapter.qkvo(0), adapter.biases(0)
    for s, m in enumerate("qkv"):
        rows = torch.tensor([h * 3 * HEAD_DIM + s * HEAD_DIM + j for h in range(HEADS) for j in range(HEAD_DIM)],
                            dtype=torch.float32)
        assert torch.equal(w[m][:, 0], rows) and torch.equal(b[m], rows)
    assert adapter.qkvo(0)["o"] is adapter.attn(0).dense.weight
    # keys as a map of the stream: LayerNorm's gain on the columns, then each row centred (LayerNorm subtracts the mean)
    k = adapter.read_weights(1, "k")
    gain = adapter.layers[1].input_layernorm.weight.detach()
    want = adapter.qkvo(1)["k"].detach() * gain
    torch.testing.assert_close(k.flatten(0, 1), want - want.mean(-1, keepdim=True))
    assert k.shape == (HEADS, HEAD_DIM, D_MODEL)


@pytest.mark.parametrize("rotary_pct, dims, frequencies", [
    (0.25, 4, [1.0, 0.01]),                                          # 10000^(-0 / 4), 10000^(-2 / 4)
    (1.0, 16, [10000.0 ** (-2 * j / 16) for j in range(8)])])
def test_rope_is_described_as_data(rotary_pct, dims, frequencies):
    _, adapter = neox(rotary_pct)
    assert adapter.rope_pairing == "half" and adapter.rotary_dims == dims
    assert adapter.rotary_frequencies(2).tolist() == pytest.approx(frequencies, rel=4 * unit_roundoff("fp32"))
    rotated, kept = adapter.rotary_split(torch.zeros(3, 2, 5, HEAD_DIM))
    assert rotated.shape[-1] == dims and kept.shape[-1] == HEAD_DIM - dims


def test_other_families_describe_their_rope():
    """The Llama layout rotates every dim with the model's own frequencies (Gemma 3: one set per layer type), GPT-2
    none; this project's model every dim."""
    llama = ADAPTERS["llama"](make_hf("llama"))
    assert (llama.rope_pairing, llama.rotary_dims) == ("half", 16)
    assert llama.rotary_frequencies(0).tolist() == pytest.approx([10000.0 ** (-2 * j / 16) for j in range(8)],
                                                                 rel=4 * unit_roundoff("fp32"))
    gemma = ADAPTERS["gemma3_text"](make_hf("gemma3"))  # sliding layers: theta 1e4, the full layer 1: theta 1e6
    for i, theta in ((0, 1e4), (1, 1e6), (2, 1e4)):
        assert gemma.rotary_frequencies(i).tolist() == pytest.approx([theta ** (-2 * j / 16) for j in range(8)],
                                                                     rel=4 * unit_roundoff("fp32"))
    gpt2 = ADAPTERS["gpt2"](make_hf("gpt2"))
    assert (gpt2.rope_pairing, gpt2.rotary_dims, gpt2.rotary_frequencies(0)) == (None, 0, None)
    assert gpt2.rotary_split(torch.ones(2, 16))[1].shape == (2, 16)  # every dim unrotated
    from configs import get_preset
    from models.llm import MinimalLLM
    from research.access import OwnAdapter
    cfg = get_preset("debug").model
    own = OwnAdapter(MinimalLLM(cfg))
    assert (own.rope_pairing, own.rotary_dims) == ("half", cfg.d_head)
    by_hand = [cfg.rope_theta ** (-2 * j / cfg.d_head) for j in range(cfg.d_head // 2)]
    assert own.rotary_frequencies(0).tolist() == pytest.approx(by_hand, rel=unit_roundoff("fp32"))
    half = OwnAdapter(MinimalLLM(dataclasses.replace(cfg, rope_fraction=0.5)))  # the later half of the pairs: still
    assert half.rotary_frequencies(0).tolist() == pytest.approx(by_hand[:cfg.d_head // 4] + [0.0] * (cfg.d_head // 4),
                                                                rel=unit_roundoff("fp32"))


def test_the_parameter_count_is_the_models():
    """By hand, tiny config (V 300, d 64, 3 layers, d_ff 128, untied embeddings): per layer two LayerNorms 2 x 2d,
    query_key_value 3d x d + 3d, dense d x d + d, MLP d x 128 + 128 + 128 x d + d = 33,472; embed_in and lm_head
    300 x 64 each, the final LayerNorm 2d: 3 x 33,472 + 2 x 19,200 + 128 = 138,944."""
    model, adapter = neox()
    assert adapter.model_param_count() == 138_944 == sum(p.numel() for p in model.parameters())
    from research.inspection.tour import param_tally
    tally = param_tally(adapter)
    assert tally["matches"] and tally["by_kind"]["embeddings"] == 38_400 and tally["by_kind"]["other"] == 0


# ---------------------------------------------------------------- the docs' Pythia line, offline and with a network

@pytest.mark.slow
def test_the_checkpoint_study_measures_gpt_neox_checkpoints_offline(tmp_path):
    """What the Pythia line runs, on two saved tiny GPT-NeoX models: both measured at k_proj and k_rope (no k_norm),
    every KV head of every layer."""
    import json
    from research import checkpoint_keys_study
    from tests.research.inspection.builders import SENTENCES, make_hf_model
    for seed in (0, 1):
        make_hf_model("gpt_neox", tmp_path / f"neox-{seed}", seed=seed)
    (tmp_path / "text.txt").write_text(" ".join(SENTENCES * 40))
    assert checkpoint_keys_study.main([
        "--checkpoints", str(tmp_path / "neox-0"), str(tmp_path / "neox-1"), "--steps", "100", "200", "--text",
        str(tmp_path / "text.txt"), "--batches", "2", "--batch", "2", "--seq_len", "16", "--out",
        str(tmp_path / "out"), "--no_progress"]) == 0
    result = json.loads((tmp_path / "out" / "checkpoint_keys.json").read_text())
    assert result["model"]["family"] == "gpt_neox" and result["model"]["n_kv_heads"] == HEADS
    assert [c["step"] for c in result["checkpoints"]] == [100, 200]
    keys = result["checkpoints"][1]["batches"][1]["keys"]
    assert sorted(keys) == ["k_proj", "k_rope"] and len(keys["k_rope"]["pr_sv"]) == 3
    assert all(len(row) == HEADS for row in keys["k_rope"]["pr_sv"])


DOCS = Path(__file__).resolve().parents[3] / "docs" / "inspection.md"


def docs_pythia_line() -> list[str]:
    """The arguments of docs/inspection.md's checkpoint_keys_study.py line on Pythia, as written there."""
    lines = [line for line in DOCS.read_text().splitlines()
             if "checkpoint_keys_study.py" in line and "EleutherAI/pythia" in line]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0], comments=True)
    assert words[:2] == ["python", "research/checkpoint_keys_study.py"]
    return words[2:]


def test_the_docs_pythia_line_is_what_the_network_test_runs():
    assert docs_pythia_line() == ["--checkpoints", "EleutherAI/pythia-70m", "--revisions", "step1000", "step8000"]


@pytest.mark.network
@pytest.mark.slow
def test_the_docs_pythia_line_runs(tmp_path):
    """docs/inspection.md's Pythia line as written (its output folder aside): Pythia 70M at two revisions loads
    through the GPT-NeoX adapter and is measured. Skipped when the Hub does not answer."""
    from utils.hub import hub_problem
    problem = hub_problem("EleutherAI/pythia-70m")
    if problem is not None:
        pytest.skip(f"the Hugging Face Hub: {problem[1]}")
    import json
    from research import checkpoint_keys_study
    assert checkpoint_keys_study.main([*docs_pythia_line(), "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "checkpoint_keys.json").read_text())
    assert result["model"]["family"] == "gpt_neox" and result["model"]["n_layers"] == 6
    assert [c["step"] for c in result["checkpoints"]] == [1000, 8000]
