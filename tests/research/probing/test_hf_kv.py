"""A key cache's measurements of a Hugging Face model: the same section as the training probe's for the same weights,
the reference loss the model's own, and the refusals."""
from __future__ import annotations

import pytest
import torch

from research.probing.hf.kv import KVError, causal_attention, hf_kv_cache_record, quantized_losses
from research.probing.hf.model import adapter_for
from research.probing.kv_cache import kv_cache_record
from tests.research.inspection.builders import hf_config, make_hf


def ids(B=2, T=24, seed=1):
    return torch.randint(3, 290, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox"])
def test_the_16_bit_loss_is_the_models_own(family):
    """The loss path computes every layer's attention itself from the keys turned back before rotary and rotated
    again (GPT-2: no RoPE; GPT-NeoX: a quarter of the dims rotated): at 16 bits it is the model's own loss (fp32,
    a sum of 46 log-terms and the attention recomputed: 1e-5 relative)."""
    model = make_hf(family).float().eval()
    x = ids()
    with torch.no_grad():
        ref = model(input_ids=x, labels=x).loss.item()
        got = quantized_losses(adapter_for(model), x, bits=(16,))[16]
    assert got == pytest.approx(ref, rel=1e-5)


def test_a_sliding_window_is_the_models_own_and_a_short_one_refused():
    """Gemma 3 with a 4-token window on 2 of 3 layers (and its query_pre_attn_scalar scale): the recomputed
    attention gives the model's loss; the layer errors, measured on full causal attention, are refused for windows
    longer than the window, naming the fix."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config("gemma3")).float().eval()
    x = ids()
    with torch.no_grad():
        ref = model(input_ids=x, labels=x).loss.item()
        assert quantized_losses(adapter_for(model), x, bits=(16,))[16] == pytest.approx(ref, rel=1e-5)
    with pytest.raises(KVError, match="sliding window of 4 tokens.*--seq_len"):
        hf_kv_cache_record(adapter_for(model), x)
    assert hf_kv_cache_record(adapter_for(model), x[:, :4])["seq_len"] == 4


def test_causal_attention_by_hand():
    """T = 3, one head, D = 1, q = k = 1, v = (1, 2, 3), scale 1: query t averages v_0..v_t (equal logits) -> 1, 1.5,
    2; a window of 2 gives 1, 1.5, 2.5; a soft-cap leaves equal logits equal."""
    q = torch.ones(1, 1, 3, 1)
    v = torch.tensor([1.0, 2.0, 3.0]).view(1, 1, 3, 1)
    assert causal_attention(q, q, v, 1.0).flatten().tolist() == [1.0, 1.5, 2.0]
    assert causal_attention(q, q, v, 1.0, window=2).flatten().tolist() == [1.0, 1.5, 2.5]
    assert causal_attention(q, q, v, 1.0, softcap=0.5).flatten().tolist() == [1.0, 1.5, 2.0]


def test_the_section_equals_the_training_probes_for_the_same_weights():
    """A learned-QK-norm run of this project exported to Hugging Face (Apertus): the HF section and kv_cache_record's
    on the same sequences agree, every layer's errors and every loss, to float32 rounding (the two models' forwards
    differ in order of operations only)."""
    from transformers import ApertusForCausalLM

    from configs import get_preset
    from models.llm import MinimalLLM
    from research.export.hf import hf_config as export_config
    from research.export.hf import hf_state_dict
    cfg = get_preset("debug").model
    cfg.vocab_size, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_model = 300, 2, 4, 2, 64
    torch.manual_seed(0)
    own = MinimalLLM(cfg).float().eval()
    hf = ApertusForCausalLM(export_config(cfg, {}, torch.float32)).eval()
    hf.load_state_dict(hf_state_dict(cfg, own.state_dict()), strict=True)
    x = ids(T=33)
    mine = kv_cache_record(own, x[:, :-1], x[:, 1:])
    theirs = hf_kv_cache_record(adapter_for(hf), x)
    for b, v in mine["loss"]["by_bits"].items():
        assert theirs["loss"]["by_bits"][b] == pytest.approx(v, rel=1e-5)
    assert theirs["usable_k_bits"] == mine["usable_k_bits"] and theirs["schemes"] == mine["schemes"]
    short = hf_kv_cache_record(adapter_for(hf), x[:, :-1])
    for a, b in zip(mine["layers"], short["layers"]):
        for site in ("pre_rope", "post_rope"):
            for r, err in a["projected"][site].items():
                assert b["projected"][site][r]["logit_error"] == pytest.approx(err["logit_error"], rel=1e-3, abs=1e-6)
            for bits, err in a["quantized"][site]["per_token"].items():
                assert b["quantized"][site]["per_token"][bits]["logit_error"] == pytest.approx(
                    err["logit_error"], rel=1e-3, abs=1e-6)


def test_record_keys_measures_the_key_cache_when_asked(tmp_path):
    """A loop's probe with kv_cache: results.json's kv_cache holds the section with the probe's step, its 16-bit loss
    the probe's own loss on the same 2 sequences (fp32: 1e-5), 8-bit keys within 1% of it; without kv_cache,
    none. Read back through the results format's check."""
    from research.probing.hf import record_keys
    from research.results import load_results
    model = make_hf("llama").float().eval()
    x = ids(T=16)
    record_keys(tmp_path / "a.json", model, x, step=0, tokens=0)
    assert "kv_cache" not in load_results(tmp_path / "a.json")
    rec = record_keys(tmp_path / "b.json", model, x, step=5, tokens=160, loss=5.0, kv_cache=True)
    res = load_results(tmp_path / "b.json")
    kv = res["kv_cache"]
    assert kv["step"] == 5 and kv["sequences"] == 2 and len(kv["layers"]) == 3 and "kv_cache" not in rec
    assert kv["loss"]["by_bits"]["16"] == pytest.approx(res["val_loss"][0], rel=1e-5)
    assert abs(kv["loss"]["change"]["8"]) < 0.01 * kv["loss"]["by_bits"]["16"]


@pytest.mark.slow
def test_the_trainer_callback_measures_the_key_cache_at_the_last_step(tmp_path):
    """kv_cache: the section once, at the last step (4), not in the probes' records; kv_every_probe: in every
    probe's record (0, 3, 4), and results.json's kv_cache is the last one's."""
    from tests.research.probing.test_hf import train
    from research.results import load_results
    train(tmp_path, 4, kv_cache=True)
    res = load_results(tmp_path / "results.json")
    assert res["steps"] == [0, 3, 4] and res["kv_cache"]["step"] == 4
    assert all("kv_cache" not in p for p in res["probes"])
    (tmp_path / "results.json").unlink()
    train(tmp_path, 4, kv_every_probe=True)
    res = load_results(tmp_path / "results.json")
    assert all("kv_cache" in p for p in res["probes"]) and res["kv_cache"]["step"] == 4
    assert res["kv_cache"]["loss"] == res["probes"][-1]["kv_cache"]["loss"]


def test_per_layer_usable_bits_of_a_hf_layer_without_keys():
    """As the training probe's: Llama layer 1's k_proj zeroed, its keys quantized alone leave the loss unchanged
    (usable at 2 bits)."""
    model = make_hf("llama").float().eval()
    with torch.no_grad():
        model.model.layers[1].self_attn.k_proj.weight.zero_()
    section = hf_kv_cache_record(adapter_for(model), ids(), errors=False, per_layer=True)
    base = section["loss"]["by_bits"]["16"]
    assert section["layers"] == [] and section["layer_bits"]["usable_k_bits"][1] == 2
    assert section["layer_bits"]["by_bits"][1] == pytest.approx({"8": base, "4": base, "3": base, "2": base},
                                                                rel=1e-6)


@pytest.mark.network
@pytest.mark.slow
def test_qwen3_0_6b_base_keys_in_every_format():
    """Qwen3-0.6B-Base (28 layers, head_dim 128, QK-norm), on 2 sequences of 128 random token ids: its key-cache
    section holds every format engines ship and each with 4 and 32 tokens kept; q8_0 costs less loss than q4_0 and
    FP8 E4M3 less than E5M2 (ik_llama.cpp #1509 found q4_0 keys take its perplexity from 13.51 to 47.84: small
    QK-norm models are the fragile ones). Skipped when the Hub does not answer (no network here)."""
    from utils.hub import hub_problem
    problem = hub_problem("Qwen/Qwen3-0.6B-Base")
    if problem is not None:
        pytest.skip(f"the Hugging Face Hub: {problem[1]}")
    from transformers import AutoModelForCausalLM
    from research.probing.key_formats import FORMATS
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B-Base", dtype=torch.float32).eval()
    ids = torch.randint(0, 150000, (2, 128), generator=torch.Generator().manual_seed(0))
    section = hf_kv_cache_record(adapter_for(model), ids, errors=False)
    change = section["formats"]["change"]
    assert set(FORMATS) <= set(change) and "q4_0+keep32" in change
    assert abs(change["q8_0"]) < abs(change["q4_0"]) and abs(change["fp8_e4m3"]) < abs(change["fp8_e5m2"])
