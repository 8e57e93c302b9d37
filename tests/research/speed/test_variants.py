"""The variants benchmark (python -m research.speed.measure variants): one step of each variant per round."""
from research.speed.variants import measure_variants, variants


def test_every_variant_is_timed_against_the_default_of_its_round():
    result = measure_variants(3, preset="debug")
    assert list(result["variants"]) == list(variants()) and result["steps"] == 3
    assert result["variants"]["default"]["ratio"] == 1.0 == result["variants"]["default"]["range"][0]
    params = {name: v["params"] for name, v in result["variants"].items()}
    # debug: 2 layers, d_model 128, 2 heads of 64: the elementwise gate adds 128 x 128 per layer, the headwise 2 x 128;
    # the full-scope q and k gains are 128 and 64 long instead of 64 and 64
    assert params["attn_gate=elementwise"] - params["default"] == 2 * 128 * 128
    assert params["attn_gate=headwise"] - params["default"] == 2 * 2 * 128
    assert params["qk_norm_scope=full"] - params["default"] == 2 * (128 + 64 - 2 * 64)
    assert all(v["ratio"] > 0 for v in result["variants"].values())
