import math
import dataclasses

import pytest
import torch

import train_llm
from configs import get_preset
from data import prepare_data
from models import MinimalLLM
from research.probing.callback import probe_callback
from research.probing.probe import KeyProbe, unwrap
from research.results import load_results
from tests.helpers import STEP_TOKENS, losses, quiet
from tests.tolerances import pr_rel_tol, sum_rel_tol, ulps, unit_roundoff
from training.trainer import Trainer

D_HEAD = 64  # the debug preset's head size: keys leave k_norm with norm sqrt(64) = 8
# k_norm gives |k| = sqrt(D ms / (ms + eps)) for a key projection of mean square ms: short of 8 by eps / (2 ms)
# relative, not by rounding (1e-5 at these inits: ms >= 0.03 on every host). This allows ms >= 5e-3, plus fp32's sum
# over D (key_metrics' |k|^2), whose margin also covers a few fp32 roundings of the keys.
NORM_REL_TOL = get_preset("debug").model.norm_eps / (2 * 5e-3) + sum_rel_tol("fp32", D_HEAD)


def model_for(mode: str) -> MinimalLLM:
    torch.manual_seed(0)
    return MinimalLLM(dataclasses.replace(get_preset("debug").model, qk_norm=mode))


def ids(B=3, T=24):
    return torch.randint(0, 512, (B, T), generator=torch.Generator().manual_seed(1))


def all_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("mode", ["learned", "frozen", "none"])
def test_probe_record_shapes_and_cleanup(mode):
    model = model_for(mode).train()
    rng = torch.get_rng_state()
    rec = KeyProbe(ids())(model)
    assert model.training and all_hooks(model) == 0
    assert torch.equal(torch.get_rng_state(), rng)
    assert len(rec["layers"]) == 2
    layer = rec["layers"][0]
    assert set(layer) >= {"layer", "k_norm", "k_rope", "attn", "gamma_k", "gamma_q", "means"}
    assert len(layer["k_norm"]["pr_sv"]) == 1 and len(layer["attn"]["entropy"]) == 2  # 1 KV head, 2 query heads
    assert (layer["gamma_k"] is None) == (mode == "none")
    assert rec["mean_pr"] == sum(r["means"]["k_norm.pr_sv"] for r in rec["layers"]) / 2  # the same float64 sum: exact


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["learned", "frozen"])
def test_keys_have_norm_sqrt_d_head_at_init(mode, precision):
    """In either probe precision: k_norm normalizes in fp32 and its output is rounded to the forward's precision
    (bf16 under autocast), RoPE (a rotation: preserves length) rounds it once more; each rounding of the components
    moves |k| by <= u of that precision (fp32's few roundings inside RoPE: within NORM_REL_TOL's margin)."""
    rec = KeyProbe(ids(), precision)(model_for(mode))
    assert rec["precision"] == precision
    for layer in rec["layers"]:
        for site, roundings in (("k_norm", 1), ("k_rope", 2)):
            rel = NORM_REL_TOL + roundings * unit_roundoff(precision)
            assert layer[site]["norm_mean"] == pytest.approx([8.0], rel=rel, abs=0), site
            assert layer[site]["norm_std"][0] < 8 * rel, site  # every |k| lies within 8 rel of 8
            if precision == "bf16":  # the hooks saw bf16 keys: their largest component is a bf16 number
                assert torch.tensor(layer[site]["max_abs"]).bfloat16().double().tolist() == layer[site]["max_abs"]
        assert layer["gamma_k"]["values"] == [1.0] * 64 and layer["gamma_k"]["cv"] == 0.0


def test_no_hook_survives_a_forward_that_raises():
    model = model_for("learned").train()

    def boom(*a, **k):
        raise RuntimeError("boom")
    model.blocks[1].ffn.forward = boom
    with pytest.raises(RuntimeError, match="boom"):
        KeyProbe(ids())(model)
    assert all_hooks(model) == 0 and model.training


def test_probe_sees_through_compile_wrapper():
    model = model_for("learned")
    compiled = torch.compile(model)
    assert unwrap(compiled) is model
    rec = KeyProbe(ids())(compiled)  # runs the plain module: no compilation happens here
    assert len(rec["layers"]) == 2


def probed_trainer(cfg, out) -> Trainer:
    """A trainer with the probe callback attached when cfg.probe.probe_every > 0."""
    data = prepare_data(cfg, log=quiet)
    t = Trainer(cfg, data, out, progress=False, log=quiet)
    if cfg.probe.probe_every:
        t.add_callback(probe_callback(cfg, data, out, t.runtime))
    return t


def test_probing_every_step_does_not_change_training(debug_cfg, tmp_path):
    outs = {}
    for every in (0, 1):
        out = tmp_path / f"every{every}"
        probed_trainer(debug_cfg(tokens=5 * STEP_TOKENS, probe_every=every), out).fit()
        outs[every] = out
    assert losses(outs[0]) == losses(outs[1])
    res = load_results(outs[1] / "results.json")
    assert res["steps"] == [0, 1, 2, 3, 4, 5] and res["tokens"] == [s * STEP_TOKENS for s in range(6)]
    assert res["loss"][0] is None and res["loss"][1:] == losses(outs[0])  # one step per probe: its loss / 1, exact
    assert res["val_loss"][0] is None and all(v > 0 for v in res["val_loss"][1:])


def test_train_llm_probe_every_writes_results_and_resumes_identically(debug_cfg, tmp_path, corpus_file, cache_dir):
    common = ["--preset", "debug", "--source", "files", "--paths", str(corpus_file), "--cache_dir", str(cache_dir),
              "--precision", "fp32", "--no_progress", "--eval_batches", "2", "--probe_every", "2", "--ckpt_every", "2"]
    train_llm.main([*common, "--tokens", str(5 * STEP_TOKENS), "--out", str(tmp_path / "straight")])
    train_llm.main([*common, "--tokens", str(2 * STEP_TOKENS), "--out", str(tmp_path / "split")])
    train_llm.main([*common, "--tokens", str(5 * STEP_TOKENS), "--out", str(tmp_path / "split"), "--resume"])
    a, b = load_results(tmp_path / "straight" / "results.json"), load_results(tmp_path / "split" / "results.json")
    assert a["steps"] == [0, 2, 4, 5] and a["tag"] == "QK"
    for k in ("steps", "tokens", "loss", "val_loss", "mean_pr", "layer_pr", "gamma_cv", "gamma_final"):
        assert a[k] == b[k], k
    assert a["config"]["model"]["qk_norm"] == "learned" and a["provenance"]["torch"] == torch.__version__
    assert len(a["gamma_final"]["0"]) == 64 and len(a["gamma_cv"]["1"]) == 4


@pytest.mark.slow
def test_probing_a_compiled_training_run(debug_cfg, tmp_path):
    t = probed_trainer(debug_cfg(tokens=3 * STEP_TOKENS, probe_every=1, compile=True), tmp_path)
    t.fit()
    res = load_results(tmp_path / "results.json")
    assert res["steps"] == [0, 1, 2, 3] and all(h == 0 for h in [all_hooks(t.model)])
    # The probe runs the plain module; its keys at init are those of the uncompiled model.
    assert res["probes"][0]["layers"][0]["k_norm"]["norm_mean"] == pytest.approx([8.0], rel=NORM_REL_TOL, abs=0)


def model_with_random_gains(seed=0, q=False):
    model = model_for("learned")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.k_norm.weight.copy_(1 + 0.3 * torch.randn(64, generator=g))
            if q:
                block.attn.q_norm.weight.copy_(1 + 0.3 * torch.randn(64, generator=g))
    return model


def test_pre_gain_keys_undo_the_gain():
    """k_hat = k_norm output / gain: the normalized keys, norm sqrt(64) = 8 whatever the gain; only where the
    gain is learned."""
    rec = KeyProbe(ids())(model_with_random_gains())
    rel = NORM_REL_TOL + ulps("fp32", 2)  # fp32: k_hat = (x g) / g and RoPE round twice each
    for layer in rec["layers"]:
        m = layer["means"]
        assert m["k_hat.norm_mean"] == pytest.approx(8.0, rel=rel, abs=0)
        assert m["k_hat_rope.norm_mean"] == pytest.approx(8.0, rel=rel, abs=0)
        # separations, not rounding bounds: gains 1 + 0.3 N(0, 1) move |k| by ~0.35 and PR by ~5%
        assert abs(m["k_norm.norm_mean"] - 8.0) > 0.05  # the gain moved the keys' norm
        assert m["k_hat.pr_sv"] != pytest.approx(m["k_norm.pr_sv"], rel=1e-3)
    for mode in ("frozen", "none"):
        assert not any(k.startswith("k_hat") for k in KeyProbe(ids())(model_for(mode))["layers"][0]["means"])


def test_gain_ablation_replaces_the_gains_and_puts_them_back():
    from research.probing.ablation import MODES, gain_ablation, validation_loss
    model = model_with_random_gains(q=True).train()
    trained = [(b.attn.q_norm.weight.detach().clone(), b.attn.k_norm.weight.detach().clone()) for b in model.blocks]
    batches = [(ids(2, 24), ids(2, 24))]
    probe = KeyProbe(ids())
    learned = probe(model)
    out = gain_ablation(model, probe, batches)
    assert list(out) == list(MODES) == ["learned", "k_ones", "q_ones", "qk_ones", "k_mean", "q_mean", "qk_mean"]
    assert all(torch.equal(b.attn.q_norm.weight, q) and torch.equal(b.attn.k_norm.weight, k)
               for b, (q, k) in zip(model.blocks, trained)) and model.training
    assert out["learned"]["val_loss"] == validation_loss(model, batches, "fp32")
    assert out["learned"]["mean_pr"] == learned["mean_pr"]  # the same weights and fp32 forward: exact, as val_loss
    # In the first layer (its input depends on no gain): k gain 1 leaves the pre-gain keys, and a scalar gain
    # only scales them, which PR does not see. Later layers also see the changed attention before them.
    pre_gain = learned["layers"][0]["means"]["k_hat.pr_sv"]
    # fp32: k_hat = (x g) / g and x * 1 or x * c differ by <= 4 roundings (4u = 2 EPS) per component
    rel = pr_rel_tol(ulps("fp32", 2), D_HEAD, pre_gain)
    for mode in ("k_ones", "k_mean", "qk_ones", "qk_mean"):
        assert out[mode]["layer_pr"][0] == pytest.approx(pre_gain, rel=rel, abs=0)
    # The q gain does not touch the first layer's keys: bitwise the trained model's there
    assert out["q_ones"]["layer_pr"][0] == learned["layers"][0]["means"]["k_norm.pr_sv"]
    assert out["q_ones"]["layer_pr"][0] != out["k_ones"]["layer_pr"][0]
    # Each replacement changes the loss, and q and k together is neither of them alone
    losses = {m: out[m]["val_loss"] for m in MODES}
    assert len(set(losses.values())) == len(MODES)
    # q and k gains at 1 is the frozen condition's forward: a copy with both gains set to 1 gives its loss
    frozen = model_with_random_gains(q=True)
    frozen.load_state_dict(model.state_dict())
    with torch.no_grad():
        for b in frozen.blocks:
            b.attn.q_norm.weight.fill_(1.0), b.attn.k_norm.weight.fill_(1.0)
    assert out["qk_ones"]["val_loss"] == validation_loss(frozen.eval(), batches, "fp32")
    assert gain_ablation(model_for("frozen"), probe, batches) == {}


def test_the_probe_gives_the_loss_of_its_first_sequences_from_its_own_forward():
    from tests.tolerances import forward_rel_tol
    model = model_with_random_gains(q=True).eval()
    x, y = ids(4, 24), ids(4, 24).roll(1, dims=1)
    probe = KeyProbe(x, targets_BT=y)
    plain = probe(model)
    for n in (2, 4):
        record, loss = probe.measure(model, n)
        assert {k: v for k, v in record.items() if k != "probe_time_s"} == \
               {k: v for k, v in plain.items() if k != "probe_time_s"}  # the same forward: the same numbers
        with torch.no_grad():
            want = model(x[:n], y[:n]).item()
        cfg = model.cfg  # batches of another size may sum in another order, nothing more
        assert loss == pytest.approx(want, rel=forward_rel_tol(cfg.n_layers, cfg.d_model), abs=0)
    assert probe.measure(model)[1] is None
    with pytest.raises(ValueError, match="loss_rows=5"):
        probe.measure(model, 5)


def test_covers_says_when_validation_batches_are_the_probes_first_sequences():
    from data import val_batches
    blocks = torch.randint(0, 512, (10, 25), generator=torch.Generator().manual_seed(2))
    probe = KeyProbe(blocks[:8, :-1].long(), targets_BT=blocks[:8, 1:].long())
    assert probe.covers(val_batches(blocks, 4, 2)) == 8
    assert probe.covers(val_batches(blocks, 2, 3)) == 6  # a prefix: the loss of the first 6
    assert probe.covers(val_batches(blocks, 4, 3)) == 0  # sequences the probe does not read
    assert probe.covers([(blocks[1:3, :-1], blocks[1:3, 1:])]) == 0  # not its first ones
    assert probe.covers([(blocks[:4, :-1], blocks[:4, 1:]), (blocks[4:6, :-1], blocks[4:6, 1:])]) == 0  # uneven
    assert probe.covers([(blocks[:4, :-1], blocks[1:5, 1:])]) == 0  # other targets
    assert KeyProbe(blocks[:8, :-1]).covers(val_batches(blocks, 4, 2)) == 0  # no targets, no loss


def test_the_probe_and_the_validation_share_one_forward_where_their_sequences_are_the_same(debug_cfg, tmp_path):
    from tests.tolerances import forward_rel_tol
    results, calls = {}, {}
    for probe_batch in (8, 16):  # the validation set: eval_batches 2 x batch_size 8 = the first 16 sequences
        cfg = debug_cfg(tokens=5 * STEP_TOKENS, probe_every=1, probe_batch=probe_batch)
        t = probed_trainer(cfg, tmp_path / str(probe_batch))
        counted, evaluate = [], t.evaluate
        t.evaluate = lambda: counted.append(t.step) or evaluate()
        t.fit()
        results[probe_batch], calls[probe_batch] = load_results(tmp_path / str(probe_batch) / "results.json"), counted
    # Shared: the trainer validates at the last step only (the callback's second call there reads its cache)
    assert calls[8] == [0, 1, 2, 3, 4, 5, 5] and calls[16] == [5, 5]
    shared, own = results[16], results[8]
    assert shared["steps"] == own["steps"] and shared["loss"] == own["loss"]
    tol = forward_rel_tol(cfg.model.n_layers, cfg.model.d_model)  # one batch of 16 against two of 8
    assert shared["init_val_loss"] == pytest.approx(own["init_val_loss"], rel=tol, abs=0)
    assert shared["val_loss"][1:] == pytest.approx(own["val_loss"][1:], rel=tol, abs=0)
    assert shared["val_loss"][-1] == own["val_loss"][-1]  # the trainer's validation at the last step, as before


# ---------------------------------------------------------------------------------------------- attention variants

def variant_model(**kw) -> MinimalLLM:
    torch.manual_seed(0)
    return MinimalLLM(dataclasses.replace(get_preset("debug").model, n_heads=4, n_kv_heads=2, **kw))


def test_a_soft_capped_model_is_probed_capped_with_the_uncapped_logit_beside():
    """The capped records are those of the logits the softmax saw (at most the cap); the uncapped largest logit
    and its split are recorded beside them, and equal the uncapped model's (same weights, same q and k)."""
    cap = 0.5
    capped, plain = variant_model(attn_softcap=cap), variant_model()
    capped_rec, plain_rec = KeyProbe(ids())(capped), KeyProbe(ids())(plain)
    from research.results.vocabulary import UNCAPPED_SPLIT
    for c, p in zip(capped_rec["layers"], plain_rec["layers"]):
        attn, ref = c["attn"], p["attn"]
        assert all(v <= cap for v in attn["logit_max"]) and all(v > cap for v in attn["logit_max_uncapped"])
        assert set(UNCAPPED_SPLIT) <= set(attn) and not set(UNCAPPED_SPLIT) & set(ref)
        assert attn["logit_max"] == pytest.approx([cap * math.tanh(v / cap) for v in attn["logit_max_uncapped"]],
                                                  rel=1e-6)
    c, p = capped_rec["layers"][0]["attn"], plain_rec["layers"][0]["attn"]  # the first layer's q and k are the same
    for name in ("logit_max", "logit_q_norm", "logit_k_norm", "logit_cos", "logit_query_pos", "logit_key_dist"):
        assert c[f"{name}_uncapped"] == pytest.approx(p[name], rel=1e-6), name
    assert capped_rec["layers"][1]["means"]["attn.entropy"] != plain_rec["layers"][1]["means"]["attn.entropy"]


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
def test_the_probe_records_the_gate_mean_and_spread(gate):
    model = variant_model(attn_gate=gate)
    seen = []
    h = model.blocks[0].attn.hook_gate.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    with torch.no_grad():
        model.eval()(ids())
    h.remove()
    g = seen[0]                                                                    # [B, T, H, D or 1]
    rec = KeyProbe(ids())(model)
    attn = rec["layers"][0]["attn"]
    per_head = g.double().permute(2, 0, 1, 3).flatten(1)                          # [H, B*T*(D or 1)]
    assert attn["gate_mean"] == pytest.approx(per_head.mean(1).tolist(), rel=1e-12)
    assert attn["gate_std"] == pytest.approx(per_head.std(1, correction=0).tolist(), rel=1e-12)
    assert rec["layers"][1]["means"]["attn.gate_mean"] == pytest.approx(sum(rec["layers"][1]["attn"]["gate_mean"]) / 4)
    assert all_hooks(model) == 0 and "gate_mean" not in KeyProbe(ids())(model_for("learned"))["layers"][0]["attn"]


def test_full_scope_gains_are_probed_and_ablated():
    """qk_norm_scope full: gains of H x D (q) and K x D (k); k_hat undoes each head's part of the gain."""
    from research.probing.ablation import gain_ablation
    model = variant_model(qk_norm_scope="full")
    with torch.no_grad():
        for b in model.blocks:
            b.attn.k_norm.weight.mul_(1 + 0.3 * torch.randn_like(b.attn.k_norm.weight))
            b.attn.q_norm.weight.mul_(1 + 0.3 * torch.randn_like(b.attn.q_norm.weight))
    rec = KeyProbe(ids())(model)
    layer = rec["layers"][0]
    assert len(layer["gamma_k"]["values"]) == 2 * 32 and len(layer["gamma_q"]["values"]) == 4 * 32  # d_head 32
    assert len(layer["attn"]["logit_q_gain"]) == 4
    # the whole projection's rms is 1 over K x D components: per head, |k_hat|^2 averages to D over the heads
    assert sum(v ** 2 for v in layer["k_hat"]["norm_mean"]) / 2 == pytest.approx(32.0, rel=0.05)
    out = gain_ablation(model, KeyProbe(ids()), [(ids(2, 24), ids(2, 24))])
    assert set(out) >= {"learned", "qk_ones", "qk_mean"}


def test_gate_saturation_planted_as_marins_layer_0_is_read_by_the_probe_and_the_telemetry():
    """marin's 535B run (#8818): its layer-0 gate shut (below 0.05) for 98.3% of token x head gates. Headwise gate
    weights planted so that layer 0's gates are sigmoid(-4.6) on 189 of its 192 token x head values and sigmoid(0)
    on 3 (head 0): the probe's closed share is 189/192 = 0.984 (per head 45/48 and 1), the telemetry's the same;
    at initialization both are 0, and each head's gate-weight norm is its rows' norm."""
    from training.observers import GateClosed
    model = variant_model(attn_gate="headwise").eval()
    x_ids = torch.randperm(512, generator=torch.Generator().manual_seed(2))[:48].view(2, 24)  # 48 distinct tokens
    attn = model.blocks[0].attn
    seen = []
    h = attn.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().reshape(-1, args[0].shape[-1])))
    with torch.no_grad():
        model(x_ids)
    h.remove()
    X = seen[0].double()                                                           # [48 tokens, d]
    rec = KeyProbe(x_ids)(model)["layers"][0]
    assert rec["means"]["attn.gate_closed"] == 0 and rec["means"]["attn.gate_open"] == 0  # sigmoid(~0) at init
    Z = torch.full((48, 4), -4.6, dtype=torch.float64)
    Z[:3, 0] = 0.0
    with torch.no_grad():
        attn.wg.weight.copy_((Z.T @ torch.linalg.pinv(X.T)).float())             # W x_t = z_t for every token
    rec = KeyProbe(x_ids)(model)["layers"][0]
    assert rec["attn"]["gate_closed"] == pytest.approx([45 / 48, 1, 1, 1], abs=1e-12)
    assert rec["means"]["attn.gate_closed"] == pytest.approx(0.983, abs=0.005) and rec["attn"]["gate_open"] == [0] * 4
    assert rec["attn"]["gate_weight_norm"] == pytest.approx(attn.wg.weight.double().norm(dim=1).tolist(), rel=1e-6)
    watch = GateClosed(model.blocks, torch.device("cpu"), on=True)
    with torch.no_grad():
        model.train()(x_ids)
    watch.remove()
    closed, forwards = watch.sums[0].tolist()
    assert forwards == 1 and closed == pytest.approx(189 / 192, abs=1e-6)
