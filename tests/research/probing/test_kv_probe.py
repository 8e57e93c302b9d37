"""What a key cache needs, in the training probe: ranks, rotary use and pair shares in every probe record, and the
key cache section (research.probing.kv_cache) once at the end of a run, or at every probe with kv_every_probe."""
import dataclasses

import pytest
import torch

from configs import get_preset
from models import MinimalLLM
from research.probing.key_rank import key_rank
from research.probing.kv_cache import KV_BITS, kv_cache_record
from research.probing.probe import KeyProbe
from research.results import load_results, truncate
from research.results.vocabulary import KV_CACHE, KV_ERRORS, KV_SCHEMES, KV_SITES, RANK_METRICS
from tests.helpers import STEP_TOKENS, probe_tensors
from tests.research.probing.test_probe import ids, model_for, probed_trainer

D = 64  # the debug preset's head size: 32 rotary pairs, pair i = dims (i, i + 32)


def keys_in(dims: list[int], queries_too: bool = False) -> MinimalLLM:
    """A debug model without QK-norm (k_norm's site is the raw projection) whose keys (and queries) live in `dims`
    of every head only: the other rows of W_k (W_q) are zero."""
    torch.manual_seed(0)
    model = MinimalLLM(dataclasses.replace(get_preset("debug").model, qk_norm="none"))
    with torch.no_grad():
        for block in model.blocks:
            for w in [block.attn.wk] + ([block.attn.wq] if queries_too else []):
                keep = torch.zeros(w.weight.shape[0], 1)
                keep.view(-1, D)[:, dims] = 1
                w.weight.mul_(keep)
    return model


def test_the_probe_records_ranks_rotary_use_and_pair_shares_per_head():
    rec = KeyProbe(ids())(model_for("learned"))  # 2 layers, 2 query heads, 1 KV head
    assert rec["rotary"] == {"pairing": "half", "context": 24}  # the batch's length unless the run's is given
    for layer in rec["layers"]:
        for site in ("k_norm", "k_rope"):
            assert all(len(layer[site][name]) == 1 for name in RANK_METRICS), site
        assert not any(name in layer[site] for site in ("k_hat", "k_hat_rope") for name in RANK_METRICS)
        assert len(layer["k_norm"]["low_freq_share"]) == len(layer["k_norm"]["dominant_pair"]) == 1
        assert len(layer["attn"]["q_low_freq_share"]) == len(layer["attn"]["q_dominant_pair"]) == 2
        shares = layer["pair_share"]
        assert [len(shares[n]) for n in ("k_norm", "q_norm", "logit")] == [1, 2, 2]
        assert all(len(row) == D // 2 for rows in shares.values() for row in rows)
        for row in (*shares["k_norm"], *shares["q_norm"], *shares["logit"]):  # shares of a whole: sum to 1
            assert sum(row) == pytest.approx(1.0, abs=1e-9)
        assert layer["means"]["k_rope.rank90"] == layer["k_rope"]["rank90"][0]
    assert KeyProbe(ids(), context=4096)(model_for("learned"))["rotary"]["context"] == 4096


@pytest.mark.parametrize("mode", ["learned", "none"])
def test_the_rank_fields_equal_key_rank_on_the_same_keys(mode):
    model = model_for(mode)
    keys = {(i, s): t[s].float() for i, t in enumerate(probe_tensors(model, ids())) for s in ("k_norm", "k_rope")}
    rec = KeyProbe(ids())(model)
    for (i, site), k in keys.items():
        want = key_rank(k)
        assert {n: rec["layers"][i][site][n] for n in RANK_METRICS} == {n: want[n].double().tolist()
                                                                        for n in RANK_METRICS}


def test_keys_in_three_dims_have_rank_three_and_six_after_rope_and_no_low_frequency_energy():
    """Keys in dims 0..2: three pairs of the highest frequencies (wavelengths 6.3, 8.4, 11.2 tokens, all within the
    24-token context); RoPE turns each dim i into the pair (i, i + 32): at most 6 dims after it."""
    rec = KeyProbe(ids())(keys_in([0, 1, 2]))
    for layer in rec["layers"]:
        assert all(1 <= layer["k_norm"][n][0] <= 3 for n in RANK_METRICS)
        assert all(3 <= layer["k_rope"][n][0] <= 6 for n in RANK_METRICS if n.startswith("rank99"))
        assert layer["k_norm"]["low_freq_share"] == [0.0]
        assert layer["k_norm"]["dominant_pair"][0] in (0.0, 1.0, 2.0)
        assert all(v == 0.0 for row in layer["pair_share"]["k_norm"] for v in row[3:])


def test_keys_and_queries_in_the_slowest_pair_read_it_whole():
    """Pair 31 turns 10000^(-62/64) = 1.3e-4 radians per position: a wavelength of 47,000 tokens, beyond the context;
    with queries there too it holds the whole of every logit."""
    rec = KeyProbe(ids())(keys_in([31, 63], queries_too=True))
    for layer in rec["layers"]:
        assert layer["k_norm"]["low_freq_share"] == [1.0] and layer["k_norm"]["dominant_pair"] == [31.0]
        assert layer["attn"]["q_low_freq_share"] == [1.0, 1.0] and layer["attn"]["q_dominant_pair"] == [31.0, 31.0]
        assert layer["pair_share"]["k_norm"][0][31] == 1.0
        for row in layer["pair_share"]["logit"]:
            assert row[31] == pytest.approx(1.0, abs=1e-12) and all(v == 0.0 for v in row[:31])


def test_the_key_cache_section_of_keys_of_rank_three():
    """After RoPE the keys of dims 0..2 span at most 6 <= D/8 = 8 dims, before it 3: projected on their top 8
    directions at either site, the attention is the exact one. Unquantized (16 bits), the loss is the same forward's:
    its change is 0 exactly."""
    model = keys_in([0, 1, 2])
    x = ids(4, 24)
    section = kv_cache_record(model, x, x.roll(1, dims=1), rows=3)
    assert section["sequences"] == 3 and section["seq_len"] == 24 and section["ranks"] == [8, 16, 32]
    assert section["bits"] == list(KV_BITS) and section["loss"]["change"]["16"] == 0.0
    assert set(section["loss"]["by_bits"]) == {"16", "8", "4", "3", "2"}
    assert section["usable_k_bits"] in (None, *KV_BITS)
    assert len(section["layers"]) == 2
    for layer in section["layers"]:
        assert set(layer["quantized"]) == set(layer["projected"]) == set(KV_SITES)
        for site in KV_SITES:
            assert set(layer["quantized"][site]) == set(KV_SCHEMES)
            assert set(layer["quantized"][site]["per_token"]) == {"8", "4", "3", "2"}
            assert all(len(layer["quantized"][site]["per_token"]["4"][e]) == 2 for e in KV_ERRORS)
        exact = layer["projected"]["post_rope"]["8"]
        assert max(exact["logit_error"]) < 1e-5 and max(exact["output_error"]) < 1e-5
        # before RoPE the 3 dims are within the top 8 directions: the keys rebuilt from them and rotated are the
        # keys, and the queries are left whole (projecting them too would drop dims 32..34, which RoPE pairs in)
        exact = layer["projected"]["pre_rope"]["8"]
        assert max(exact["logit_error"]) < 1e-5 and max(exact["output_error"]) < 1e-5
        bits = layer["quantized"]["post_rope"]["per_token"]
        assert bits["2"]["logit_error"][0] > bits["8"]["logit_error"][0] > 0


def run_callback(tmp_path, **kv) -> dict:
    """A ProbeCallback's results.json after probes at steps 0, 2 and 3 of a 3-step run, with the key cache options."""
    from configs.config import ProbeConfig
    from research.probing.callback import ProbeCallback
    from training.callbacks import StepInfo
    model, x = model_for("none"), ids(10, 24)
    callback = ProbeCallback(tmp_path / "results.json", ProbeConfig(probe_every=2, **kv), x, header={"tag": "NoQK"},
                             qk_norm="none", probe_targets_BT=x.roll(1, dims=1))
    for step in (0, 1, 2, 3):
        callback(StepInfo(step=step, total_steps=3, start_step=0, tokens=24 * step, loss=None if step == 0 else 5.0,
                          wall_time_s=float(step), model=model, evaluate=lambda: 5.0, is_main=True))
    return load_results(tmp_path / "results.json")  # validates


def test_without_asking_a_run_measures_no_key_cache(tmp_path):
    """The default: no section (it costs about 40 forwards of the probe batch, once a run)."""
    res = run_callback(tmp_path)
    assert KV_CACHE not in res and not any(KV_CACHE in p for p in res["probes"])


@pytest.mark.parametrize("every", [False, True])
def test_the_callback_records_the_key_cache_section_once_at_the_last_step(tmp_path, every):
    res = run_callback(tmp_path, kv_cache=not every, kv_every_probe=every)  # kv_every_probe alone implies kv_cache
    section = res[KV_CACHE]
    assert res["steps"] == [0, 2, 3] and section["step"] == 3
    assert section["sequences"] == 8 and section["seq_len"] == 24 and section["loss"]["change"]["16"] == 0.0
    assert len(section["layers"]) == 2
    assert [KV_CACHE in p for p in res["probes"]] == [every] * 3
    if every:  # the last probe's is the section itself
        assert res["probes"][-1][KV_CACHE] == {k: v for k, v in section.items() if k != "step"}
    assert KV_CACHE not in truncate(res, 2)  # a resume from step 2 measures it again at the end


def test_a_run_with_kv_every_probe_measures_the_key_cache_at_every_probe(debug_cfg, tmp_path):
    cfg = debug_cfg(tokens=2 * STEP_TOKENS, probe_every=1, kv_every_probe=True, qk_norm="none")  # no gain ablation
    probed_trainer(cfg, tmp_path).fit()
    res = load_results(tmp_path / "results.json")
    assert res["steps"] == [0, 1, 2] and res[KV_CACHE]["step"] == 2
    assert all(p[KV_CACHE]["sequences"] == 8 and p[KV_CACHE]["seq_len"] == 32 for p in res["probes"])
    assert res["probes"][-1]["rotary"] == {"pairing": "half", "context": 32}  # the run's seq_len
    assert res["config"]["probe"]["kv_every_probe"] is True


def test_pair_energy_from_energies_given_reads_as_from_the_vectors():
    """The probe gives the keys' and the queries' energies in one call: any multiple per head reads the same."""
    from research.probing.rotary_use import pair_energy
    x = torch.randn(3, 2, 5, 8, generator=torch.Generator().manual_seed(0))
    energy = x.square().sum((1, 2)) * torch.tensor([[1.0], [7.0], [0.5]])
    assert torch.allclose(pair_energy(None, "interleaved", energy=energy), pair_energy(x, "interleaved"),
                          rtol=1e-6, atol=0)


def test_per_layer_usable_bits_of_a_layer_without_keys():
    """Layer 1's keys are all zero (W_k zeroed): quantizing them alone changes nothing (a constant key is exact at any
    width), so its losses are the unquantized loss and its usable bits the fewest measured, 2; layer 0's are its
    own. The callback's kv_layer_bits implies the section, which the results format reads back."""
    model = keys_in(list(range(D)))
    with torch.no_grad():
        model.blocks[1].attn.wk.weight.zero_()
    x = ids(4, 24)
    section = kv_cache_record(model, x, x.roll(1, dims=1), rows=3, per_layer=True)
    base = section["loss"]["by_bits"]["16"]
    lb = section["layer_bits"]
    assert lb["by_bits"][1] == {"8": base, "4": base, "3": base, "2": base} and lb["usable_k_bits"][1] == 2
    assert set(lb["by_bits"][0]) == {"8", "4", "3", "2"} and lb["by_bits"][0]["2"] != base
    assert "layer_bits" not in kv_cache_record(model, x, x.roll(1, dims=1), rows=3)


def test_the_callback_measures_per_layer_bits_when_asked(tmp_path):
    res = run_callback(tmp_path, kv_layer_bits=True)
    assert res[KV_CACHE]["step"] == 3 and len(res[KV_CACHE]["layer_bits"]["usable_k_bits"]) == 2


def test_the_key_cache_formats_engines_ship_are_measured_and_the_fewest_bytes_within_the_margin_chosen():
    """Every format (and each with the first 4 and 32 tokens kept) gets a loss with every key in it, after RoPE;
    the per-layer errors hold each plain format; a layer whose keys are all zero keeps the unquantized loss in every
    format (zero is on every grid), so its usable format is the one of fewest bytes per value, MXFP4's 0.53125 (17
    bytes per 32 values; NVFP4 and q4_0 take 0.5625)."""
    from research.probing.key_formats import FORMATS, KEEP, bytes_per_value
    model = keys_in(list(range(D)))
    with torch.no_grad():
        model.blocks[1].attn.wk.weight.zero_()
    x = ids(4, 40)
    section = kv_cache_record(model, x, x.roll(1, dims=1), rows=3, per_layer=True)
    f = section["formats"]
    assert f["cases"] == [*FORMATS, *(f"{n}+keep{k}" for k in KEEP for n in FORMATS)] and f["site"] == "post_rope"
    base = section["loss"]["by_bits"]["16"]
    assert all(f["change"][c] == pytest.approx(f["by_format"][c] - base, abs=0) for c in f["cases"])
    assert f["change"]["q8_0"] != 0 and abs(f["change"]["q8_0"]) < abs(f["change"]["q4_0"])
    ok = [c for c in f["cases"] if abs(f["change"][c]) <= section["loss_margin"] * base]
    assert f["usable_k_format"] == (min(ok, key=lambda c: bytes_per_value(c.split("+")[0])) if ok else None)
    assert all(set(layer["formats"]) == set(FORMATS) for layer in section["layers"])
    lb = section["layer_bits"]
    assert lb["by_format"][1] == {n: base for n in FORMATS} and lb["usable_k_format"][1] == "mxfp4"
    assert set(lb["by_format"][0]) == set(FORMATS)
