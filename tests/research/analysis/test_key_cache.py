"""What a key cache holds, summarized from hand-made kv sections of a pretrained model's record; usable_k_bits."""
from __future__ import annotations

import math

import pytest

from research.analysis.key_cache import key_cache_summary, usable_k_bits
from research.plots.pretrained_report import NO_ROPE, _kv_section
from research.analysis import pretrained as A

L, HQ, HKV = 3, 2, 1


def _kv(base: float, change4: float) -> dict:
    """One batch's section: loss base at 16 and 8 bits, base + change4 at 4, + 1 at 3 and 2; every 4-bit logit error
    0.1 (per_token) or 0.2 (others), every projected one 0.5 / r."""
    errors = lambda v: {"logit_error": [v] * HQ, "attention_kl": [0.0] * HQ, "output_error": [0.0] * HQ}
    layer = {"quantized": {site: {s: {str(b): errors(0.1 if s == "per_token" else 0.2) for b in (8, 4, 3, 2)}
                                  for s in ("per_channel", "per_token")} for site in ("pre_rope", "post_rope")},
             "projected": {site: {str(r): errors(0.5 / r) for r in (2, 4)} for site in ("pre_rope", "post_rope")}}
    by_bits = {"16": base, "8": base, "4": base + change4, "3": base + 1, "2": base + 1}
    return {"sequences": 2, "seq_len": 8, "precision": "fp32", "bits": [8, 4, 3, 2],
            "schemes": ["per_channel", "per_token"], "ranks": [2, 4], "loss_margin": 0.01,
            "loss": {"scheme": "per_token", "site": "pre_rope", "by_bits": by_bits,
                     "change": {b: v - base for b, v in by_bits.items()}},
            "usable_k_bits": None, "layers": [{"layer": i, **layer} for i in range(L)]}


def _record(kv=True, rope=True):
    """Two batches; without rope, no rotary use measured (the key study's record of a model without RoPE, GPT-2)."""
    batches = []
    for b, (base, change4) in enumerate(((2.0, 0.01), (3.0, 0.03))):
        keys = {"k_proj": {"rank90": [[3.0]] * L, "rank99": [[5.0]] * L, "low_freq_share": [[0.25]] * L},
                "k_rope": {"rank90": [[4.0]] * L, "rank99": [[6.0]] * L}}
        batch = {"loss": base, "keys": keys, "attn": {"q_low_freq_share": [[0.5, 0.7]] * L}}
        if not rope:
            keys["k_proj"].pop("low_freq_share")
            batch["attn"].pop("q_low_freq_share")
        if kv:  # the layers' errors in the first batch's section only, as the study measures them
            batch["kv"] = _kv(base, change4)
            if b:
                batch["kv"]["layers"] = []
        batches.append(batch)
    return {"n_layers": L, "n_heads": HQ, "n_kv_heads": HKV, "head_dim": 8, "batches": batches}


def test_the_summary_by_hand():
    """Loss change at 4 bits: 0.01 and 0.03 -> mean 0.02, half-width t_1 x sd / sqrt 2 = 12.706 x 0.01414 / 1.414
    = 0.127; shares 0.005 and 0.01 -> 0.0075. Mean losses 2.5 at 16 and 8 bits, 2.52 at 4: within 1% (0.025), so 4
    bits are usable, 3 (2.5 + 1) are not. Ranks and rotary shares are the heads' means in each layer group."""
    s = key_cache_summary(_record())
    four = s["loss"]["change"][4]
    assert four[0] == pytest.approx(0.02) and four[1] == pytest.approx(12.706 * 0.01, rel=1e-3)
    assert s["loss"]["share"][4][0] == pytest.approx(0.0075) and s["loss"]["usable_k_bits"] == 4
    assert s["ranks"][("k_proj", "rank90", "keys")] == {"early": 3.0, "middle": 3.0, "final": 3.0}
    assert s["ranks"][("k_rope", "rank99", "keys")]["final"] == 6.0 and s["site"] == "k_proj"
    low = s["low_freq_share"]
    assert low["keys"]["early"] == 0.25 and low["queries"]["middle"] == pytest.approx(0.6)
    assert s["logit_error_4bit"][("pre_rope", "per_token")] == pytest.approx(0.1)
    assert s["logit_error_4bit"][("post_rope", "per_channel")] == pytest.approx(0.2)
    assert s["projected"][("post_rope", 4)] == pytest.approx(0.125)
    assert key_cache_summary(_record(kv=False)) is None


def test_the_report_section_states_the_numbers():
    model = A.ModelKeys(_record(), {}, {}, None, None, (2.5, math.nan), 2, key_cache_summary(_record()))
    text = "\n".join(_kv_section(model))
    assert "| 4 | +0.0200 [-0.1071, +0.1471] | +0.75% |" in text
    assert "Usable key bits (within \u00b11.0% of the unquantized): 4." in text
    assert "rank90 3.0 / 3.0 / 3.0" in text and "| per_token | 0.1000 | 0.1000 |" in text
    assert _kv_section(A.ModelKeys(_record(False), {}, {}, None, None, (2.5, math.nan), 2)) == []


def test_a_model_without_rope_has_its_keys_as_they_are():
    """No rotary use in the record (GPT-2): nothing after RoPE, no rotary shares, the errors of the keys as they are
    (pre_rope: post_rope would be the same keys again); the report says so in one phrase, once."""
    s = key_cache_summary(_record(rope=False))
    assert s["rope"] is False and key_cache_summary(_record())["rope"] is True
    assert {site for site, _, _ in s["ranks"]} == {"k_proj"} and s["low_freq_share"] == {}
    assert set(s["logit_error_4bit"]) == {("pre_rope", "per_channel"), ("pre_rope", "per_token")}
    assert s["projected"] == {("pre_rope", 2): pytest.approx(0.25), ("pre_rope", 4): pytest.approx(0.125)}
    assert s["loss"]["usable_k_bits"] == 4
    text = "\n".join(_kv_section(A.ModelKeys(_record(rope=False), {}, {}, None, None, (2.5, math.nan), 2, s)))
    assert text.count(NO_ROPE) == 1 and "RoPE" not in text.replace(NO_ROPE, "")
    assert "| scheme | logit error |" in text and "| per_token | 0.1000 |" in text
    assert "With the keys projected: r = 2: 0.250; r = 4: 0.125." in text and "Key rank (k_proj" in text


def test_usable_k_bits_by_hand():
    """Within 1% of 3.0 (0.03): 8 and 4 bits; 3 is out, so 2 (a fluke inside) does not count."""
    assert usable_k_bits({8: 3.001, 4: 3.02, 3: 3.05, 2: 3.0}, 3.0, 0.01) == 4
    assert usable_k_bits({8: 3.5}, 3.0, 0.01) is None
