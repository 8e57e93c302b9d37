"""The dictionary sections of the tour (research/inspection/dictionaries.py): token dictionaries,
the input lens and the head words, on hand-built inputs and the tiny models of each family."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from research.access import InspectError, load_model
from research.inspection import command as inspect_command
from research.inspection import inspect_model
from research.inspection.dictionaries import (dictionary_section, head_words, pair_blocks, pair_statistics,
                                              sample_ids, vocab_cosines)
from tests.research.inspection.builders import PROMPT
from tests.tolerances import sum_rel_tol, ulps
from tests.helpers import stops

TIED = {"llama": False, "qwen3": False, "gemma3": True, "gpt2": True, "gpt_neox": False, "own": True}


# ----------------------------------------------------------------------------------------------
# Pure functions on hand-built dictionaries

def test_positive_share_of_hand_built_dictionaries():
    positive = torch.rand(40, 6) + 0.01  # every entry > 0, so every inner product > 0
    assert pair_statistics(positive, positive).positive_share_a == 1.0
    # e1, e2, -e1, e1 + e2: of 6 pairs, (e1, e1+e2) and (e2, e1+e2) are positive; two are 0, two negative
    E = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 1.0]])
    st = pair_statistics(E, -E)
    assert st.pairs == 6 and st.positive_share_a == st.positive_share_b == 2 / 6  # counts: exact
    assert st.correlation == 1.0  # -E has the same cosines as E


def test_equal_dictionaries_correlate_exactly_one_and_sign_flips_decorrelate():
    torch.manual_seed(0)
    A = torch.randn(101, 16)
    for block in (1, 300, 1 << 21):
        assert pair_statistics(A, A.clone(), block).correlation == 1.0
    flipped = A.clone()
    flipped[::2] *= -1  # flips the sign of exactly the pairs with one flipped row
    st = pair_statistics(A, flipped)
    mixed = 51 * 50 / (101 * 100 / 2)  # share of pairs with exactly one flipped row, whose cosine changes sign
    # cosines centred near 0: r ~ 1 - 2 x mixed; sampling, not rounding: r weighs pairs by cos^2, so it strays
    # from that with s.e. ~0.02 (0.019 over 300 seeds) and 0.1 is 5 s.e.
    assert st.correlation == pytest.approx(1 - 2 * mixed, abs=0.1)


def _dense_cosines(X: np.ndarray) -> np.ndarray:
    """cos(x_i, x_j) of all pairs i < j, dense, in float64."""
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    return (U @ U.T)[np.triu_indices(len(X), k=1)]


def test_blocked_pair_statistics_equal_the_dense_computation():
    """pair_statistics (fp32 cosines, float64 sums) against a dense float64 reference."""
    torch.manual_seed(1)
    A, B = torch.randn(37, 5) + 0.3, torch.randn(37, 5)
    x, y = _dense_cosines(A.double().numpy()), _dense_cosines(B.double().numpy())
    cos_err = sum_rel_tol("fp32", 5)  # an fp32 cosine of unit 5-vectors: a 5-term dot of terms summing to <= 1
    assert min(abs(x).min(), abs(y).min()) > cos_err  # no cosine within rounding of 0: the shares are exact counts
    # Pearson r moves by <= 2 x err / std per side when every cosine moves by <= err (Cauchy-Schwarz, worst case);
    # a pair missed or counted twice by the blocks moves it by ~1/666
    corr_tol = 2 * cos_err * (1 / x.std() + 1 / y.std())
    for block in (1, 40, 100, 1000):  # one row per block, 1, 2 and 27 rows
        st = pair_statistics(A, B, block)
        assert st.pairs == 37 * 36 // 2
        assert (st.positive_share_a, st.positive_share_b) == ((x > 0).mean(), (y > 0).mean())
        assert st.correlation == pytest.approx(np.corrcoef(x, y)[0, 1], rel=0, abs=corr_tol)


def test_pair_blocks_cover_each_pair_once_within_the_bound():
    for n, cap in ((37, 100), (37, 1), (4096, 1 << 21), (32000, 1 << 21)):
        blocks = pair_blocks(n, cap)
        assert blocks[0][0] == 0 and blocks[-1][1] in (n - 1, n)
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))  # contiguous: every row i < n - 1 once
        assert max((i1 - i0) * (n - i0) for i0, i1 in blocks) <= max(cap, n)
    assert max((i1 - i0) * (32000 - i0) for i0, i1 in pair_blocks(32000)) * 33 < 70e6  # the docstring's ~70 MB


def test_vocab_cosines_in_blocks_equal_dense_and_sample_ids():
    torch.manual_seed(2)
    E, X = torch.randn(50, 8), torch.randn(3, 8)
    dense = torch.nn.functional.normalize(X, dim=1) @ torch.nn.functional.normalize(E, dim=1).T
    # both fp32, other kernels: each within one 8-term dot's bound of the exact cosine (scale 1, so absolute)
    torch.testing.assert_close(vocab_cosines(E, X, block=7), dense, atol=2 * sum_rel_tol("fp32", 8), rtol=0)
    assert sample_ids(10, 20).tolist() == list(range(10))
    s = sample_ids(1000, 50, seed=3)
    assert len(set(s.tolist())) == 50 and s.tolist() == sorted(s.tolist()) and s.equal(sample_ids(1000, 50, seed=3))


# ----------------------------------------------------------------------------------------------
# On the tiny models of each family

def test_inspect_json_has_the_three_sections_for_every_family(results):
    for family, (model, tok, adapter, r) in results.items():
        r = json.loads(json.dumps(r))
        d = r["dictionaries"]
        cos_tol = sum_rel_tol("fp32", adapter.d_model)  # an fp32 cosine of unit rows: a d-term dot, scale 1
        share_tol = sum_rel_tol("fp32", adapter.head_dim)  # s_1^2 / a sum of head_dim s_i^2
        assert d["tied"] is TIED[family], family
        assert (d["vocab_size"], d["sample_tokens"], d["exact"], d["pairs"]) == (300, 300, True, 300 * 299 // 2)
        if TIED[family]:  # one matrix read twice
            assert d["input_output_correlation"] == 1.0 and d["positive_share_input"] == d["positive_share_output"]
        else:  # independent random matrices: uncorrelated, up to sampling (s.e. 1/sqrt(pairs); 300 seeds agree)
            assert abs(d["input_output_correlation"]) < 5 / math.sqrt(d["pairs"])
        w = d["words"]
        assert w["words"] == ["cat", "dog", "sun", "sky"] and w["skipped"] == ["king", "cat"]
        assert w["ids"] == [tok.convert_tokens_to_ids(x) for x in w["words"]]
        assert [w["input"][i][i] for i in range(4)] == pytest.approx([1.0] * 4, rel=0, abs=cos_tol)
        assert (w["input"] == w["output"]) is TIED[family]

        lens, logit = r["input_lens"], r["logit_lens"]
        assert lens["positions"] == logit["positions"] and len(lens["layers"]) == len(logit["layers"]) == 4
        assert [[len(e["cos"]) for e in ly["positions"]] for ly in lens["layers"]] == [[4, 4]] * 4
        first = lens["layers"][0]["positions"]
        assert [e["input_id"] for e in first] == [r["token_ids"][p] for p in lens["positions"]]
        if family != "gpt2":  # state 0 is the (scaled) embedding itself; GPT-2 adds a position vector
            assert all(e["ids"][0] == e["input_id"] and e["cos"][0] == pytest.approx(1.0, rel=0, abs=cos_tol)
                       and e["input_rank"] == 0 for e in first), family

        hw = r["head_words"]
        assert hw["layer"] == 1 and len(hw["query"]) == 4 and len(hw["key"]) == r["n_kv_heads"]
        for h in hw["query"] + hw["key"]:
            assert h["projections"] == sorted(h["projections"], reverse=True) and 0 <= h["projections"][-1]
            assert h["projections"][0] <= 1 + cos_tol and 0 < h["energy_share"] <= 1 + share_tol  # <= 1 in reals
        assert hw["max_projection_key"] == max(h["projections"][0] for h in hw["key"])


def _read_token(adapter, layer: int, m: str, head: int, t: int, offset: float = 0.0) -> None:
    """Set head `head`'s q or k rows so that, with the norms' gains folded in, each row is token t's
    input embedding (+ offset in every component): the head reads exactly that one direction."""
    g_in = adapter.gain(adapter.attention_norm(layer))
    g_out = adapter.gain(adapter.qk_norms(layer)[0 if m == "q" else 1])
    e = adapter.input_embedding()[t].detach().float()
    row = (e + offset) / g_in if g_in is not None else e + offset
    D = adapter.head_dim
    scale = 1 / g_out if g_out is not None else torch.ones(D)
    with torch.no_grad():
        adapter.qkvo(layer)[m][head * D:(head + 1) * D] = scale[:, None] * row[None, :]


@pytest.mark.parametrize("family,m,kind", [("llama", "k", "key"), ("qwen3", "q", "query"), ("qwen3", "k", "key"),
                                           ("gemma3", "k", "key"), ("gpt2", "k", "key"), ("own", "k", "key")])
def test_a_head_reading_one_token_lists_it_first_with_projection_one(model_dirs, family, m, kind):
    model, tok, adapter = load_model(str(model_dirs[family]))  # a fresh copy: the weights are edited
    t = tok.convert_tokens_to_ids("sky")
    offset = 0.0
    if family == "gpt2":  # LayerNorm centres the residual, so a constant added to every weight is never read
        with torch.no_grad():
            adapter.input_embedding()[t] -= adapter.input_embedding()[t].mean()
        offset = 0.5
    _read_token(adapter, 2, m, 1, t, offset)
    # the gains folded back in (and GPT-2's centring, which removes the offset): every row of the head's map
    # is the token's embedding again, which the projections below cannot tell from any row scaling
    e = adapter.input_embedding()[t].detach().float()
    # fp32 both ways: each entry is 5 elementwise roundings of itself (<= 2.5 eps); GPT-2's centring subtracts a
    # d-term mean of entries near offset + |e|, an absolute error that entries near 0 cannot bound relatively
    atol = sum_rel_tol("fp32", adapter.d_model) * (offset + e.abs().max().item()) if family == "gpt2" else 0.0
    torch.testing.assert_close(adapter.read_weights(2, m)[1], e.expand(adapter.head_dim, -1), rtol=ulps("fp32", 4),
                               atol=atol)
    hw = head_words(adapter, 2, 3, lambda i: tok.decode([i]))
    h = hw[kind][1]
    assert h["ids"][0] == t and h["tokens"][0] == "sky"
    # rank one up to rounding: the SVD's error in the direction enters the cosine squared, so the cosine (a d-term
    # dot of unit rows) and s_1^2 / (a sum of head_dim s_i^2) are 1 within their own sums' rounding
    one = pytest.approx(1.0, rel=0, abs=sum_rel_tol("fp32", adapter.d_model))
    share_one = pytest.approx(1.0, rel=0, abs=sum_rel_tol("fp32", adapter.head_dim))
    assert h["projections"][0] == one and h["energy_share"] == share_one
    assert h["projections"][1] < 0.99 and hw[f"max_projection_{kind}"] == one


def test_sampled_pairs_and_an_all_positive_input_dictionary(model_dirs):
    model, tok, adapter = load_model(str(model_dirs["llama"]))
    with torch.no_grad():
        adapter.input_embedding().uniform_(0.01, 1.0)  # every inner product positive
    d = dictionary_section(adapter, tok, ["cat"], sample=50, seed=3, block_pairs=64)
    assert (d["sample_tokens"], d["exact"], d["pairs"], d["positive_share_input"]) == (50, False, 1225, 1.0)
    # the untouched random output dictionary: 1/2 up to sampling, s.e. 0.5/sqrt(pairs) (0.015 over 300 seeds)
    assert abs(d["positive_share_output"] - 0.5) < 5 * 0.5 / math.sqrt(d["pairs"])
    assert d == dictionary_section(adapter, tok, ["cat"], sample=50, seed=3, block_pairs=64)  # seeded
    assert d["memory_bound_bytes"] == 2 * 50 * 64 * 4 + 33 * 64


@pytest.mark.slow
def test_cli_on_a_training_folder_writes_the_sections(model_dirs, tmp_path, capsys):
    from research import inspect_pretrained
    out = tmp_path / "own"
    assert inspect_pretrained.main(["--model", str(model_dirs["own"]), "--prompt", PROMPT, "--out", str(out),
                                    "--words", "dog, cat,sea", "--dict_sample", "100", "--head_layer", "2",
                                    "--top_k", "2"]) == 0
    r = json.loads((out / "inspect.json").read_text())
    assert r["dictionaries"]["words"]["words"] == ["dog", "cat", "sea"] and r["dictionaries"]["sample_tokens"] == 100
    assert r["dictionaries"]["input_output_correlation"] == 1.0  # this project's models tie their embeddings
    assert r["head_words"]["layer"] == 2 and len(r["head_words"]["query"][0]["tokens"]) == 2
    assert all((out / f).is_file() for f in ("word_similarity.png", "lenses.png", "head_words.png"))
    with pytest.raises(SystemExit):
        inspect_command.parse_args(["--model", "m", "--head_layer", "x"])
    stops(capsys, inspect_pretrained.main, ["--model", str(model_dirs["own"]), "--out", str(out), "--head_layer",
                                            "3"])


def test_bad_head_layer_is_refused_before_the_forward(model_dirs, monkeypatch):
    model, tok, adapter = load_model(str(model_dirs["llama"]))
    with pytest.raises(InspectError, match="head-words layer"):
        head_words(adapter, 3, 2, str)

    def no_forward(*args, **kwargs):
        raise AssertionError("the forward ran")
    monkeypatch.setattr(adapter, "forward", no_forward)  # inspect_model must refuse before it
    with pytest.raises(InspectError, match="head-words layer 3"):
        inspect_model(adapter, tok, PROMPT, head_layer=3)
    with pytest.raises(InspectError, match="dictionary sample of 2 tokens"):
        inspect_model(adapter, tok, PROMPT, dict_sample=2)


# ----------------------------------------------------------------------------------------------
# Figures and report, from the dict alone

def test_figures_draw_the_sections_data(results):
    from research.plots import inspection_dictionaries as plots
    r = results["qwen3"][3]
    figs = plots.figures(r)  # plain Figures: nothing to close
    ax_in, ax_out = figs["word_similarity.png"].axes[:2]  # the colorbars come after
    # the figures draw the dict's floats as they are (float64): equal exactly
    np.testing.assert_array_equal(ax_in.images[0].get_array(), r["dictionaries"]["words"]["input"])
    np.testing.assert_array_equal(ax_out.images[0].get_array(), r["dictionaries"]["words"]["output"])
    assert [t.get_text() for t in ax_in.get_xticklabels()] == ["cat", "dog", "sun", "sky"]
    lens = figs["lenses.png"].axes  # 2 positions x (logit, input)
    j = 1
    np.testing.assert_array_equal(lens[2 * j + 1].images[0].get_array(),
                                  [ly["positions"][j]["cos"] for ly in r["input_lens"]["layers"]])
    np.testing.assert_array_equal(lens[2 * j].images[0].get_array(),
                                  [ly["positions"][j]["probs"] for ly in r["logit_lens"]["layers"]])
    bars = figs["head_words.png"].axes[1].patches
    assert [b.get_height() for b in bars] == [h["projections"][0] for h in r["head_words"]["key"]]


def test_report_states_the_sections(results):
    from research.plots.inspection import report
    from tests.helpers import md_table
    r = results["gemma3"][3]
    text = report(r)
    d, hw = r["dictionaries"], r["head_words"]
    assert f"input dictionary **{d['positive_share_input']:.1%}**" in text and "tied embeddings" in text
    assert "Correlation of the pairs' cosines read in the two dictionaries: **1.000**" in text
    assert "Not a single token, skipped: king, cat." in text
    assert len(md_table(text, "word pair")) == 6  # 4 words
    rows = md_table(text, "hidden state")
    assert [row["own token's rank"] for row in rows] == [str(x) for x in r["input_lens"]["input_rank"][0]]
    q = md_table(text, "query head")
    assert len(q) == 4 and q[0]["top tokens (cosine)"].startswith(repr(hw["query"][0]["tokens"][0]))
    assert len(md_table(text, "key head")) == 2 and f"key heads **{hw['max_projection_key']:.2f}**" in text
    old = {k: v for k, v in r.items() if k not in ("dictionaries", "input_lens", "head_words")}
    assert "## Token dictionaries" not in report(old)  # files written before the sections still render
