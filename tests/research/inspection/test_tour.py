"""Pretrained-model inspection (research/inspection/, research/inspect_pretrained.py) on tiny random
models of each supported family, built locally from configs (no download)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from research.access import InspectError, load_model
from research.inspection import inspect_model
from research.inspection.tour import SINK_THRESHOLD
from tests.research.inspection.builders import PROMPT, hf_config, make_hf_model
from tests.tolerances import logit_atol, sum_rel_tol, ulps
from tests.helpers import stops


def test_outputs_have_expected_shapes_and_json_roundtrip(results):
    for family, (model, tok, adapter, r) in results.items():
        L, Hq, Hkv, T = r["n_layers"], r["n_heads"], r["n_kv_heads"], r["n_tokens"]
        assert (L, Hq) == (3, 4) and Hkv == (4 if family in ("gpt2", "gpt_neox") else 2), family
        assert json.loads(json.dumps(r))["n_tokens"] == T
        assert all(len(r["weights"]["matrices"][m][o]) == L for m in "qkvo" for o in ("whole", "model_dim", "heads"))
        a = r["attention"]
        assert [len(row) for row in a["first_token"]] == [Hq] * L and len(a["heatmap"]) == Hq
        assert all(len(row) == T for row in a["heatmap"])
        assert a["heatmap"][0][0] == 1.0  # query 0 sees only token 0: softmax of one score is exactly 1
        h = r["hidden"]
        assert len(h["adjacent_mean"]) == len(h["adjacent_std"]) == L
        assert all(len(h["neighbour"][k]) == L + 1 for k in ("d1", "d2", "all_pairs"))
        assert h["gaps"]["5"]["measured"] == [] and h["gaps"]["15"]["predicted"] == []  # 3 layers only
        assert len(r["amplitude"]["rms"]) == L + 1 and all(len(g) == L for g in r["amplitude"]["mean_gain"].values())
        lens = r["logit_lens"]
        assert len(lens["layers"]) == L + 1 and lens["positions"] == [T - 1, 3]
        assert all(len(e["tokens"]) == 4 for layer in lens["layers"] for e in layer["positions"])
        sites = ["k_proj", "k_rope"] if family in ("llama", "gpt2", "gpt_neox") else ["k_proj", "k_norm", "k_rope"]
        assert r["keys"]["sites"] == sites
        for layer in r["keys"]["layers"]:
            assert all(len(layer[s]["pr_sv"]) == Hkv for s in sites)
            assert (layer["gamma_k"] is None) == ("k_norm" not in sites)
        assert r["memory"]["hidden_ring_bytes_peak"] <= r["memory"]["hidden_ring_bytes_bound"]


def test_param_tally_sums_to_model_count(results):
    for family, (model, tok, adapter, r) in results.items():
        p = r["params"]
        assert p["matches"] and p["total"] == adapter.model_param_count(), family
        assert sum(p["by_kind"].values()) == p["total"] and p["by_kind"]["other"] == 0
        assert all(p["by_kind"][k] > 0 for k in ("embeddings", "attention", "feed_forward", "norms"))


def test_logit_lens_last_layer_is_the_models_own_top_k(results):
    """The lens (final norm and LM head on the captured state) and the model's forward, both fp32: their top-4
    logits lie >= 20x the rounding bound (logit_atol) apart in these models, so the order is host-independent."""
    for family, (model, tok, adapter, r) in results.items():
        lens = r["logit_lens"]
        assert [e["ids"] for e in lens["layers"][-1]["positions"]] == lens["model_top_ids"], family
        ids = torch.tensor([r["token_ids"]])
        with torch.no_grad():
            logits = adapter.forward(ids)
        assert lens["model_top_ids"][0] == logits[0, -1].topk(4).indices.tolist()


@pytest.mark.slow
def test_capture_leaves_model_output_unchanged_and_attention_matches_eager(model_dirs):
    """The recomputed attention (inside the model's forward) equals eager output_attentions, and the
    model's logits under the capturing attention equal its eager logits (Gemma 3: sliding window 4). All fp32:
    the capturing attention (attention_metrics), transformers' eager attention and, after capture, SDPA."""
    from transformers import AutoModelForCausalLM

    from research.inspection.tour import _Collector
    ids = torch.randint(3, 300, (2, 12))
    for family in ("llama", "qwen3", "gemma3", "gpt2", "gpt_neox"):
        model, tok, adapter = load_model(str(model_dirs[family]))
        eager = AutoModelForCausalLM.from_pretrained(model_dirs[family], attn_implementation="eager",
                                                     dtype=torch.float32).eval()
        with torch.no_grad():
            ref = eager(input_ids=ids, output_attentions=True, use_cache=False)
        atol = logit_atol(ref.logits, adapter.n_layers, adapter.d_model)
        # probabilities (scale 1) from scores whose inputs carry the same layers' rounding as the logits
        p_atol = (adapter.n_layers + 1) * sum_rel_tol("fp32", adapter.d_model)
        for layer in range(adapter.n_layers):
            col = _Collector(adapter, [11], 3, heatmap_layer=layer)
            with torch.no_grad(), adapter.capture(col):
                logits = adapter.forward(ids)
            torch.testing.assert_close(logits, ref.logits, atol=atol, rtol=0)
            first = ref.attentions[layer][..., 0].mean(0)                # [H, T] mean over batch
            torch.testing.assert_close(torch.tensor(col.heatmap), first, atol=p_atol, rtol=0)
            torch.testing.assert_close(torch.tensor(col.attn[layer]["first_token"]), first.mean(1),
                                       atol=p_atol, rtol=0)
        col.on_attention = None  # the capturing attention is gone after capture: a forward never calls it
        with torch.no_grad():
            torch.testing.assert_close(adapter.forward(ids), ref.logits, atol=atol, rtol=0)


def test_uniform_attention_gives_one_over_t_plus_one(model_dirs, tmp_path):
    """Zero q and k projections: all scores 0, so query t attends 1/(t+1) to token 0; no sink heads."""
    for family in ("llama", "gpt2", "own"):
        model, tok, adapter = load_model(str(model_dirs[family]))
        with torch.no_grad():
            for i in range(adapter.n_layers):
                for m in ("q", "k"):
                    adapter.qkvo(i)[m].zero_()  # views of the real parameters (GPT-2: of c_attn)
                if family == "gpt2":
                    adapter.attn(i).c_attn.bias.zero_()
        r = inspect_model(adapter, tok, PROMPT, heatmap_layer=1)
        T = r["n_tokens"]
        expect = [1 / (t + 1) for t in range(T)]
        for row in r["attention"]["heatmap"]:  # exp(0) = 1 summed exactly: 1/(t + 1) rounded once (<= 0.5 eps)
            assert row == pytest.approx(expect, rel=ulps("fp32", 1), abs=0)
        mean = sum(expect) / T  # fp32 sum over T of those
        assert all(x == pytest.approx(mean, rel=sum_rel_tol("fp32", T), abs=0)
                   for row in r["attention"]["first_token"] for x in row)
        assert r["attention"]["sink_rate"] == (1.0 if mean > SINK_THRESHOLD else 0.0)


def test_weight_ratio_of_gaussian_is_sqrt_pi_over_2():
    from research.inspection.tour import GAUSSIAN_RATIO, sigma_over_mean_abs
    torch.manual_seed(0)
    w = torch.randn(512, 256)

    # sampling, not rounding (delta method; 300 seeds agree): over vectors of n draws the ratio is biased by
    # -0.68/n, and the mean over all w.numel() draws has s.e. 0.27/sqrt(w.numel()): bias + 5 s.e.
    def sampling(n):
        return 0.68 / n + 5 * 0.27 / math.sqrt(w.numel())
    assert sigma_over_mean_abs(w) == pytest.approx(GAUSSIAN_RATIO, rel=sampling(w.numel()))
    assert sigma_over_mean_abs(w, dim=0) == pytest.approx(GAUSSIAN_RATIO, rel=sampling(512))
    assert sigma_over_mean_abs(w, dim=1) == pytest.approx(GAUSSIAN_RATIO, rel=sampling(256))


def test_hidden_gap_prediction_is_product_of_adjacent(tmp_path):
    d = make_hf_model("llama", tmp_path / "deep")
    import transformers as tf
    cfg = hf_config("llama")
    cfg.num_hidden_layers = 6
    torch.manual_seed(1)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    model, tok, adapter = load_model(str(d))
    r = inspect_model(adapter, tok, PROMPT)
    g = r["hidden"]["gaps"]["5"]
    assert g["start_layer"] == [0, 1]
    adj = r["hidden"]["adjacent_mean"]
    assert g["predicted"][1] == math.prod(adj[1:6])  # the same product of the same floats: exact
    assert all(-1 <= x <= 1 for x in g["measured"])


@pytest.mark.slow
def test_cli_writes_json_figures_report_and_clear_errors(model_dirs, tmp_path, capsys):
    from research import inspect_pretrained
    from research.plots.inspection import FIGURES
    out = tmp_path / "out"
    assert inspect_pretrained.main(["--model", str(model_dirs["qwen3"]), "--prompt", PROMPT, "--out", str(out),
                                    "--positions", "-1", "2", "--layer", "0"]) == 0
    assert all((out / f).is_file() for f in ("inspect.json", "report.md", *FIGURES))
    assert "Sink rate" in (out / "report.md").read_text()
    assert "not found" in stops(capsys, inspect_pretrained.main, ["--model", str(tmp_path / "missing"), "--out",
                                                                  str(out)])


def test_missing_and_unsupported_models_raise_clear_errors(tmp_path, monkeypatch):
    import transformers as tf
    with pytest.raises(InspectError, match="not found"):
        load_model(str(tmp_path / "nope"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InspectError, match="no config.json"):
        load_model(str(empty))
    bert = tmp_path / "bert"
    tf.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64).save_pretrained(bert)
    with pytest.raises(InspectError, match="unsupported architecture 'bert'"):
        load_model(str(bert))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InspectError, match="local Hugging Face cache"):
        load_model("no-such-owner/no-such-model")


def test_each_family_gets_its_adapter(results):
    expect = {"llama": "HFAdapter", "qwen3": "Qwen3Adapter", "gemma3": "Gemma3Adapter", "gpt2": "GPT2Adapter",
              "gpt_neox": "GPTNeoXAdapter", "own": "OwnAdapter"}
    for family, (model, tok, adapter, r) in results.items():
        assert type(adapter).__name__ == expect[family] and r["family"] == adapter.family
    assert results["gemma3"][2].gain_offset == 1.0 and results["llama"][2].gain_offset == 0.0


def test_figures_and_report_draw_the_inspection(results):
    from research.plots import inspection as plots
    from tests.helpers import labelled_lines, md_table
    r = results["qwen3"][3]
    figs = plots.figures(r)
    keys = labelled_lines(figs["key_metrics.png"].axes[0])  # pr_sv per layer at each site
    assert set(keys) == {"k_proj", "k_norm", "k_rope"}
    # the figures plot the dict's floats as they are (float64): equal exactly
    assert keys["k_norm"].tolist() == [ly["means"]["k_norm.pr_sv"] for ly in r["keys"]["layers"]]
    heat = figs["first_token_attention.png"].axes[0].images[0].get_array()
    assert heat.T.ravel().tolist() == sum(r["attention"]["first_token"], [])  # layers x heads
    rms = labelled_lines(figs["amplitude.png"].axes[0])["all tokens"]
    assert rms.tolist() == r["amplitude"]["rms"]
    report = plots.report(r)
    rows = {row["kind"]: row for row in md_table(report, "kind")}
    assert rows["total"]["parameters"] == f"{r['params']['total']:,}"
    assert f"**{r['attention']['sink_rate']:.3f}**" in report


def test_a_corrupt_checkpoint_is_named_and_the_older_one_inspected(straight_run, tmp_path, capsys):
    import shutil

    from research import inspect_pretrained
    run = tmp_path / "run"
    shutil.copytree(straight_run, run)  # checkpoints at steps 4 and 6
    newest = run / "checkpoints" / "step-000006" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:1000])
    _, _, adapter = load_model(str(run))
    assert adapter.source.endswith("(checkpoint step 4)")
    assert f"checkpoint {newest.parent} cannot be loaded: model.safetensors cannot be read" in capsys.readouterr().err
    older = run / "checkpoints" / "step-000004" / "model.safetensors"
    older.write_bytes(b"garbage")
    err = stops(capsys, inspect_pretrained.main, ["--model", str(run), "--out", str(tmp_path / "out")])
    assert f"error: no checkpoint under {run / 'checkpoints'} can be loaded (step-000006: model.safetensors" in err
    assert "step-000004: model.safetensors cannot be read" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
