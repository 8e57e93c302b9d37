"""Export to Hugging Face (research/export/, research/export_hf.py): tiny run folders of each qk_norm mode,
exported and loaded with AutoModelForCausalLM (a built-in class, no trust_remote_code), give the native
model's logits, greedy generations and inspection metrics; the command line fails cleanly."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from research.export import export_run
from tests.helpers import REPO, stops
from tests.research.inspection.builders import PROMPT, make_tokenizer
from tests.tolerances import forward_rel_tol, logit_atol

ARCHITECTURE = {"learned": "ApertusForCausalLM", "frozen": "ApertusForCausalLM", "none": "ArceeForCausalLM"}
SPECIALS = ["<pad>", "</s>", "<s>", "[UNK]"]  # pad 0, eos 1, bos 2: none of them Apertus' defaults (1, 2, 3)
KEY_UNITS = ("norm_mean", "norm_std", "max_abs", "mean_max_abs", "std")  # key metrics in the keys' units
UNIT_SCALE = ("cos_mean", "peak_frac", "first_token", "entropy")  # cosines, shares, probabilities, nats (<= ln T)


# Tolerances: tests/tolerances.py forward_rel_tol and logit_atol (both sides fp32). transformers' RoPE tables (fp32
# angles; ours fp64) differ by up to 2e-6 at 64 positions, about one more rounded term: the margin covers it (no
# growth with position is measured).


def make_run(run_dir, qk_norm, seed=0):
    """A run folder with two checkpoints: step 2 (initial weights) and step 5 (every trainable gain randomized,
    so q and k gains differ); returns the step-5 model."""
    from configs import get_preset
    from configs.files import save_run_config
    from models.llm import MinimalLLM
    from training.checkpoint import save_checkpoint
    cfg = get_preset("debug")  # 2 layers, d_model 128, vocab 512, max_seq_len 64
    cfg.model.qk_norm, cfg.model.n_heads, cfg.model.n_kv_heads = qk_norm, 4, 2  # d_head 32, 2 query heads per KV head
    torch.manual_seed(seed)
    model = MinimalLLM(cfg.model)
    run_dir.mkdir(parents=True)
    save_run_config(cfg, run_dir / "config.json")
    save_checkpoint(run_dir / "checkpoints", 2, model, [], {"tokens": 0}, keep_last=2)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1 and p.requires_grad:  # frozen q/k gains keep their exact ones
                p.mul_(1 + 0.3 * torch.randn_like(p))
    save_checkpoint(run_dir / "checkpoints", 5, model, [], {"tokens": 5 * 256}, keep_last=2)
    make_tokenizer(run_dir / "tokenizer", SPECIALS, pad_token="<pad>")
    return model.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    out = {}
    for mode in ARCHITECTURE:
        native = make_run(root / mode / "run", mode)
        export_run(root / mode / "run", root / mode / "hf")
        out[mode] = (native, root / mode / "run", root / mode / "hf")
    return out


def load_hf(path, **kwargs):
    """fp32, in eval mode (from_pretrained's own default); no trust_remote_code."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)


def random_ids(vocab, B=2, T=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    ids[:, 5] = 0  # the pad id: an Embedding with padding_idx must still return its row
    return ids


# ----------------------------------------------------------------------------------------------
# The exported model is the native model

@pytest.mark.parametrize("mode", list(ARCHITECTURE))
def test_export_loads_as_a_builtin_class_with_every_default_overridden(exported, mode):
    import transformers
    from transformers import AutoTokenizer
    native, run_dir, out = exported[mode]
    model, info = load_hf(out, output_loading_info=True)
    assert type(model) is getattr(transformers, ARCHITECTURE[mode])  # the class transformers itself exports
    assert type(model).__module__.startswith("transformers.models.") and not list(out.glob("*.py"))
    assert all(not info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert not model.training
    c = model.config
    assert c.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert (c.rms_norm_eps, c.max_position_embeddings, c.hidden_act) == (1e-6, 64, "relu2")
    assert (c.num_attention_heads, c.num_key_value_heads, c.hidden_size // c.num_attention_heads) == (4, 2, 32)
    assert c.tie_word_embeddings is False
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (2, 1, 0)
    g = model.generation_config
    assert (g.bos_token_id, g.eos_token_id, g.pad_token_id) == (2, 1, 0)
    ours, theirs = AutoTokenizer.from_pretrained(run_dir / "tokenizer"), AutoTokenizer.from_pretrained(out)
    assert theirs(PROMPT)["input_ids"] == ours(PROMPT)["input_ids"]
    meta = json.loads((out / "export.json").read_text())
    assert (meta["step"], meta["qk_norm"], meta["architecture"]) == (5, mode, ARCHITECTURE[mode])  # the newest


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", list(ARCHITECTURE))
def test_logits_equal_the_native_model(exported, mode, impl):
    """Both fp32 (load_hf; the native model is built in fp32 and runs without autocast): ours with SDPA, the
    export with `impl`."""
    native, run_dir, out = exported[mode]
    model = load_hf(out, attn_implementation=impl)
    assert model.config._attn_implementation == impl
    ids = random_ids(native.cfg.vocab_size)  # 64 tokens: every RoPE position of the run
    with torch.no_grad():
        ref, got = native(ids), model(input_ids=ids).logits
    assert ref.std() > 0.1  # not a degenerate model whose logits agree trivially
    torch.testing.assert_close(got, ref, atol=logit_atol(ref, native.cfg.n_layers, native.cfg.d_model), rtol=0)


def test_the_tolerance_sees_swapped_qk_gains_and_an_unscaled_embedding(exported):
    """Negative controls: exports with k_norm and q_norm gains swapped, or the embedding not scaled, miss the
    logit tolerance by 100x (both fp32, both SDPA)."""
    from transformers import ApertusForCausalLM

    from research.export.hf import hf_config, hf_state_dict
    native, run_dir, out = exported["learned"]
    cfg = native.cfg
    ids = random_ids(cfg.vocab_size)
    good = hf_state_dict(cfg, native.state_dict())
    swapped = {k.replace("q_norm", "K").replace("k_norm", "q_norm").replace("K", "k_norm"): v for k, v in good.items()}
    unscaled = {**good, "model.embed_tokens.weight": good["lm_head.weight"]}
    model = ApertusForCausalLM(hf_config(cfg, {}, torch.float32)).eval()
    with torch.no_grad():
        ref = native(ids)
        for bad in (swapped, unscaled):
            model.load_state_dict(bad, strict=True)
            assert (model(input_ids=ids).logits - ref).abs().max() > 100 * logit_atol(ref, cfg.n_layers, cfg.d_model)


@pytest.mark.parametrize("mode", list(ARCHITECTURE))
def test_greedy_generate_continues_as_the_native_model(exported, mode):
    """generate() (with its KV cache, so RoPE at offset positions) picks the native model's argmax tokens; both
    fp32 (the export SDPA), and the top two logits lie > 1e4 x logit_atol apart at every step here: no tie flips."""
    native, run_dir, out = exported[mode]
    model = load_hf(out)
    prompt = random_ids(native.cfg.vocab_size, B=1, T=8, seed=3)
    with torch.no_grad():
        got = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False)
        ids = prompt
        for _ in range(6):
            ids = torch.cat([ids, native(ids)[:, -1:].argmax(-1)], dim=1)
    assert got.shape == (1, 14) and got.tolist() == ids.tolist()


@pytest.mark.parametrize("mode", list(ARCHITECTURE))
def test_inspection_of_the_export_matches_the_run_folder(exported, mode):
    """inspect_pretrained's tour gives the same key and attention metrics on both. Both fp32 (load_model's
    default), each model's own forward with the capturing attention: the keys agree within R = forward_rel_tol of
    their scale |k|, so metrics in key units within R |k|, cosines, shares, probabilities and nats within R
    absolute, the rest (dimension counts, ratios, RMS) relative. (The norm_std of unit-gain keys, ~1e-5,
    is set by the norms' eps, not by rounding: it is compared on the scale |k| like any key length.)"""
    from research.access import load_model
    from research.inspection import inspect_model
    native, run_dir, out = exported[mode]
    runs = []
    for path in (run_dir, out):
        model, tok, adapter = load_model(str(path))
        runs.append(inspect_model(adapter, tok, PROMPT, positions=[-1, 3], top_k=4))
    a, b = runs
    assert b["family"] == ("arcee" if mode == "none" else "apertus") and a["family"] == "minimal_llm"
    assert a["keys"]["sites"] == b["keys"]["sites"] == (["k_proj", "k_rope"] if mode == "none"
                                                        else ["k_proj", "k_norm", "k_rope"])
    R = forward_rel_tol(native.cfg.n_layers, native.cfg.d_model)

    def close(values, name, key_scale=None):  # within R of the metric's scale (0: relative only)
        metric = name.split(".")[-1]
        scale = key_scale if metric in KEY_UNITS else 1.0 if metric in UNIT_SCALE else 0.0
        return pytest.approx(values, rel=R, abs=R * scale)
    for la, lb in zip(a["keys"]["layers"], b["keys"]["layers"], strict=True):
        for site in a["keys"]["sites"]:
            assert la[site].keys() == lb[site].keys()
            for name, values in la[site].items():
                assert lb[site][name] == close(values, name, max(la[site]["norm_mean"])), (site, name)
        assert lb["means"].keys() == la["means"].keys()
        for name, value in la["means"].items():
            assert lb["means"][name] == close(value, name, la["means"][name.split(".")[0] + ".norm_mean"]), name
        assert lb["gamma_k"] == la["gamma_k"] and lb["gamma_q"] == la["gamma_q"]  # the same gains, copied
    for key in ("first_token", "entropy", "qk_ratio"):
        assert sum(b["attention"][key], []) == close(sum(a["attention"][key], []), key), key
    assert b["amplitude"]["rms"] == close(a["amplitude"]["rms"], "rms")  # the folded embedding included
    # top-4 logits of the lens lie >= 17x logit_atol apart here: the same ids on any host
    assert [ly["positions"][0]["ids"] for ly in b["logit_lens"]["layers"]] == \
           [ly["positions"][0]["ids"] for ly in a["logit_lens"]["layers"]]
    V, d = native.cfg.vocab_size, native.cfg.d_model
    assert b["params"]["total"] == a["params"]["total"] + V * d  # the untied LM head


# ----------------------------------------------------------------------------------------------
# Study conditions, the command line

@pytest.mark.slow
def test_every_qk_norm_study_condition_exports(corpus_file, cache_dir, tmp_path):
    """Condition folders written by the study runner's own training path (seed_<s> layout), trained two steps
    with a checkpoint at each: the newest is exported, with its trained gains, and gives the native logits.
    Other studies' conditions differ from these only in training fields (wd_on_gains), not in the model."""
    from configs import apply_overrides
    from models.llm import MinimalLLM
    from research.results.layout import condition_dir
    from research.studies import QK_NORM
    from research.studies.runner import base_config, train_condition
    from tests.helpers import STEP_TOKENS
    from training.checkpoint import latest_checkpoint, load_model_weights
    base = base_config(QK_NORM, "debug", {"source": "files", "paths": [str(corpus_file)], "cache_dir": str(cache_dir),
                                          "precision": "fp32", "tokens": 2 * STEP_TOKENS, "probe_every": 1,
                                          "eval_batches": 2, "ckpt_every": 1})
    for cond, overrides in QK_NORM.conditions.items():
        cfg = apply_overrides(base, {**overrides, "seed": 0})
        run_dir = condition_dir(tmp_path / "study", cond, 0, several_seeds=True)
        train_condition(cfg, run_dir, cond, progress=False)
        meta = export_run(run_dir, tmp_path / "hf" / cond)
        assert (meta["step"], meta["architecture"]) == (2, ARCHITECTURE[cfg.model.qk_norm])
        native = MinimalLLM(cfg.model)
        load_model_weights(latest_checkpoint(run_dir / "checkpoints").path, native)
        model = load_hf(tmp_path / "hf" / cond)
        ids = random_ids(cfg.model.vocab_size, seed=4)
        with torch.no_grad():  # both fp32: trained with precision fp32, exported and loaded as fp32
            ref = native.eval()(ids)
            atol = logit_atol(ref, cfg.model.n_layers, cfg.model.d_model)
            torch.testing.assert_close(model(input_ids=ids).logits, ref, atol=atol, rtol=0)
        c = model.config  # the byte-level BPE has an end-of-text token only
        assert (c.bos_token_id, c.pad_token_id) == (None, None) and c.eos_token_id == native_eos(run_dir)
        if cfg.model.qk_norm != "none":
            gains = torch.stack([layer.self_attn.k_norm.weight for layer in model.model.layers])
            assert (gains == 1).all() == (cfg.model.qk_norm == "frozen")  # frozen: exactly 1; learned: trained


def native_eos(run_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(run_dir / "tokenizer").eos_token_id


def export_cli(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "research/export_hf.py", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing run", "no checkpoint", "non-empty output"])
def test_cli_errors_are_one_clear_line(exported, tmp_path, case):
    native, run_dir, out = exported["learned"]
    if case == "missing run":
        args, expect = (tmp_path / "nope", tmp_path / "hf"), "not found"
    elif case == "no checkpoint":
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "config.json").write_text((run_dir / "config.json").read_text())
        args, expect = (tmp_path / "run", tmp_path / "hf"), "no checkpoint that reads back"
    else:
        (tmp_path / "hf").mkdir()
        (tmp_path / "hf" / "notes.txt").write_text("mine")
        args, expect = (run_dir, tmp_path / "hf"), "is not empty"
    proc = export_cli(*args)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("error: ") and expect in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert [p.name for p in (tmp_path / "hf").glob("*")] == (["notes.txt"] if case == "non-empty output" else [])


def test_force_replaces_the_exports_files_and_keeps_others(exported, tmp_path, capsys):
    from research import export_hf
    native, run_dir, out = exported["none"]
    target = tmp_path / "hf"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    (target / "config.json").write_text("{}")
    assert "--force" in stops(capsys, export_hf.main, [str(run_dir), str(target)])
    assert (target / "config.json").read_text() == "{}"
    assert export_hf.main([str(run_dir), str(target), "--force"]) == 0
    assert "as ArceeForCausalLM" in capsys.readouterr().out
    assert (target / "notes.txt").read_text() == "mine" and json.loads((target / "config.json").read_text())[
        "model_type"] == "arcee"
    assert not list(tmp_path.glob(".tmp-*"))  # the staging folder is gone
    before = (run_dir / "config.json").read_text()
    err = stops(capsys, export_hf.main, [str(run_dir), str(run_dir), "--force"])  # never over the run's config.json
    assert "run folder itself" in err and (run_dir / "config.json").read_text() == before


def test_unreadable_runs_are_named(exported, tmp_path):
    from research.export import ExportError
    native, run_dir, out = exported["frozen"]
    with pytest.raises(ExportError, match="no config.json"):
        export_run(tmp_path, tmp_path / "hf")
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    for step in ("step-000005", "step-000002"):
        (broken / "checkpoints" / step / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ExportError, match="no checkpoint that reads back .*step-000005: .*step-000002: "):
        export_run(broken, tmp_path / "hf")
    shutil.copy(run_dir / "checkpoints" / "step-000002" / "model.safetensors", broken / "checkpoints" / "step-000002")
    shutil.rmtree(broken / "tokenizer")
    shutil.rmtree(broken / "checkpoints" / "step-000005")
    with pytest.raises(ExportError, match="no tokenizer/ folder"):
        export_run(broken, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_damaged_newest_checkpoint_is_named_and_the_one_before_is_exported(tmp_path, capsys):
    run = tmp_path / "run"
    make_run(run, "learned")  # checkpoints at steps 2 and 5
    (run / "checkpoints" / "step-000005" / "model.safetensors").write_bytes(b"not safetensors")
    info = export_run(run, tmp_path / "hf")
    assert info["checkpoint"] == "step-000002" and info["step"] == 2
    assert "skipped step-000005" in capsys.readouterr().err


def test_a_planted_link_in_the_tokenizer_is_never_exported(exported, tmp_path):
    from research.export import ExportError
    native, run_dir, out = exported["learned"]
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (tmp_path / "secret.txt").write_text("the secret")
    (run / "tokenizer" / "special_notes.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(ExportError, match=r"special_notes.txt -> .*secret.txt.*Remove it"):
        export_run(run, tmp_path / "hf")
    (run / "tokenizer" / "special_notes.txt").unlink()
    (run / "tokenizer" / "special_notes.txt").symlink_to(run / "tokenizer" / "tokenizer.json")  # a link inside the run
    with pytest.raises(ExportError, match="is a link"):
        export_run(run, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("where", ["its checkpoint", "another run", "another run's tokenizer"])
def test_force_never_reaches_into_a_run_folder(exported, tmp_path, where, capsys):
    from research import export_hf
    native, run_dir, out = exported["learned"]
    other = tmp_path / "b"
    shutil.copytree(run_dir, other)
    target = {"its checkpoint": other / "checkpoints" / "step-000005", "another run": other,
              "another run's tokenizer": other / "tokenizer"}[where]
    before = {p: p.read_bytes() for p in other.rglob("*") if p.is_file()}
    source = other if where == "its checkpoint" else run_dir
    assert "never writes into a run's files, even with --force" in stops(capsys, export_hf.main,
                                                                          [str(source), str(target), "--force"])
    assert {p: p.read_bytes() for p in other.rglob("*") if p.is_file()} == before
    assert export_hf.main([str(source), str(other / "hf")]) == 0  # a new folder beside the run's files is fine


@pytest.mark.parametrize("field, value, line", [
    ("attn_softcap", 30.0, "attn_softcap=30: the Hugging Face export cannot express attention-logit soft-capping "
                           "(Apertus and Arcee have no attn_logit_softcapping); export a run trained without this "
                           "variant"),
    ("attn_gate", "elementwise", "attn_gate=elementwise: the Hugging Face export cannot express gated attention "
                                 "(Apertus and Arcee have no gate on the heads' outputs); export a run trained "
                                 "without this variant"),
    ("attn_gate", "headwise", "attn_gate=headwise: the Hugging Face export cannot express gated attention (Apertus "
                              "and Arcee have no gate on the heads' outputs); export a run trained without this "
                              "variant"),
    ("qk_norm_scope", "full", "qk_norm_scope=full: the Hugging Face export cannot express q/k norms over the whole "
                              "projection (Apertus normalizes each head); export a run trained without this variant"),
    ("rope_fraction", 0.5, "rope_fraction=0.5: the Hugging Face export cannot express rotating only the "
                           "highest-frequency pairs (Apertus and Arcee rotate every pair); export a run trained "
                           "without this variant"),
    ("qk_gain_shape", "head_scalar", "qk_gain_shape=head_scalar: the Hugging Face export cannot express a q/k norm "
                                     "gain per head (Apertus's q_norm and k_norm have one gain of head_dim shared by "
                                     "the heads); export a run trained without this variant"),
])
def test_variants_the_export_cannot_express_are_refused_in_one_line(tmp_path, capsys, field, value, line):
    from research import export_hf
    run = tmp_path / "run"
    make_run(run, "learned")
    cfg = json.loads((run / "config.json").read_text())
    cfg["model"][field] = value
    (run / "config.json").write_text(json.dumps(cfg))
    err = stops(capsys, export_hf.main, [str(run), str(tmp_path / "hf")])
    assert err == f"error: {run}: {line}"
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".tmp-*"))


def test_a_z_loss_run_exports_as_any_run(tmp_path):
    run = tmp_path / "run"
    make_run(run, "learned")
    cfg = json.loads((run / "config.json").read_text())
    cfg["train"]["z_loss"] = 1e-4
    (run / "config.json").write_text(json.dumps(cfg))
    assert export_run(run, tmp_path / "hf")["architecture"] == "ApertusForCausalLM"


@pytest.mark.parametrize("mode,settings", [("learned", {"qk_mult": 1.3, "qk_gain_on": "q", "qk_gain_init": 2.0}),
                                           ("frozen", {"attn_scale": 1.0}), ("none", {"attn_scale": 0.5})])
def test_the_logit_scale_and_gain_settings_export_folded_in(tmp_path, mode, settings):
    """attn_scale and qk_mult fold into the q norm's gain (W_q without a q norm), qk_gain_on and qk_gain_init are
    the gains' values: the export's logits equal the native model's."""
    from configs import get_preset
    from configs.files import save_run_config
    from models.llm import MinimalLLM
    from training.checkpoint import save_checkpoint
    cfg = get_preset("debug")
    cfg.model.qk_norm, cfg.model.n_heads, cfg.model.n_kv_heads = mode, 4, 2
    for k, v in settings.items():
        setattr(cfg.model, k, v)
    cfg.model.__post_init__()
    torch.manual_seed(0)
    native = MinimalLLM(cfg.model).eval()
    run = tmp_path / "run"
    run.mkdir()
    save_run_config(cfg, run / "config.json")
    save_checkpoint(run / "checkpoints", 3, native, [], {"tokens": 0}, keep_last=1)
    make_tokenizer(run / "tokenizer", SPECIALS, pad_token="<pad>")
    export_run(run, tmp_path / "hf")
    model = load_hf(tmp_path / "hf")
    ids = random_ids(cfg.model.vocab_size)
    with torch.no_grad():
        ref, got = native(ids), model(input_ids=ids).logits
    torch.testing.assert_close(got, ref, atol=logit_atol(ref, cfg.model.n_layers, cfg.model.d_model), rtol=0)
