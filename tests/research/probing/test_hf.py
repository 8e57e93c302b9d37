"""The key probe of Hugging Face models: each family's record, the model's own attention kept, the Trainer callback
(loss windows, resume), the recorder of a loop of one's own, and refusals in one clear message."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from research.probing.hf import HFKeyProbe, KeyProbeCallback, KeyRecorder, ProbeError, record_keys
from research.results import load_results
from utils.errors import ConfigError
from tests.research.inspection.builders import make_hf
from tests.tolerances import sum_rel_tol, ulps

FAMILIES = ["llama", "qwen3", "gemma3", "gpt2", "gpt_neox", "apertus", "arcee"]
WITH_K_NORM = {"qwen3", "gemma3", "apertus"}


def ids(B=2, T=24, seed=1):
    return torch.randint(3, 290, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def models():
    return {f: make_hf(f).float().eval() for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_record_of_each_family(models, family):
    """Sites as the model has them; the batch's loss is the model's own (fp32: both sums of T log-terms); the gains
    as the model applies them; logit_max = scale |q| |k| cos; the model's attention implementation unchanged."""
    model, x = models[family], ids()
    rec = HFKeyProbe(x)(model)
    layer = rec["layers"][1]
    sites = {k for k in layer if k not in ("layer", "means", "gamma_k", "gamma_q", "pair_share")}
    has_norm = family in WITH_K_NORM
    assert sites == ({"k_norm", "k_proj", "k_hat", "k_rope", "attn"} if has_norm else {"k_norm", "k_rope", "attn"})
    n_kv = 4 if family in ("gpt2", "gpt_neox") else 2  # GPT-2 and GPT-NeoX have no grouped queries
    assert len(rec["layers"]) == 3 and len(layer["k_norm"]["pr_sv"]) == n_kv and len(layer["attn"]["entropy"]) == 4
    with torch.no_grad():
        ref = model(input_ids=x, labels=x).loss.item()
    assert rec["loss"] == pytest.approx(ref, rel=4 * sum_rel_tol("fp32", x.numel()))
    assert model.config._attn_implementation == "sdpa" and not model.training
    attn = layer["attn"]
    for h in range(len(attn["logit_max"])):
        raw = attn["logit_scale"][h] * attn["logit_q_norm"][h] * attn["logit_k_norm"][h] * attn["logit_cos"][h]
        assert raw == pytest.approx(attn["logit_max"][h], rel=1e-5)
    if has_norm:
        gain = model.model.layers[1].self_attn.k_norm.weight.double() + (1.0 if family == "gemma3" else 0.0)
        # the adapter forms 1 + w in fp32: one rounding of each value
        assert layer["gamma_k"]["mean"] == pytest.approx(gain.mean().item(), rel=ulps("fp32", 1))
        # k_hat is RMSNorm's output before the gain: every key has length sqrt(D) (up to RMSNorm's eps)
        assert layer["k_hat"]["norm_mean"] == pytest.approx([4.0] * 2, rel=1e-3)
        assert len(attn["logit_k_gain"]) == 4 and all(0.5 < g < 1.5 for g in attn["logit_q_gain"])
    else:
        assert layer["gamma_k"] is None and "logit_k_gain" not in attn
    if family == "gemma3":
        assert attn["logit_scale"] == pytest.approx([32 ** -0.5] * 4)


def test_the_models_own_attention_computes_the_output(models, monkeypatch):
    """The probe observes: the attention function of the model's implementation runs once per layer, and the
    hidden states are those of a plain forward, bit for bit."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as registry
    model, x = models["qwen3"], ids()
    sdpa, calls = registry["sdpa"], []

    def counted(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)
    monkeypatch.setitem(registry._local_mapping, "sdpa", counted)
    with torch.no_grad():
        plain = model.model(input_ids=x).last_hidden_state
    probe = HFKeyProbe(x)
    probe.adapter(model)
    from research.probing.probe import LayerSink
    sink = LayerSink(probe.current, probe.ropes, lambda window: x.shape[1])
    calls.clear()
    with torch.no_grad(), probe.current.capture(sink):
        probed = model.model(input_ids=x).last_hidden_state
    assert len(calls) == 3 and torch.equal(plain, probed)
    assert registry._local_mapping["sdpa"] is counted  # put back as it was


def test_probing_changes_nothing(models):
    model = models["llama"]
    model.train()
    torch.manual_seed(5)
    state = torch.get_rng_state()
    HFKeyProbe(ids())(model)
    assert model.training and torch.equal(torch.get_rng_state(), state)
    model.eval()


def test_unknown_family_is_refused():
    with pytest.raises(ProbeError, match=r"cannot read a model of type 'opt'.*reads .*gemma3_text.*gpt_neox.*qwen3"):
        HFKeyProbe(ids())(make_hf("opt"))


def test_token_ids_beyond_the_embedding_are_refused(models):
    with pytest.raises(ProbeError, match="token id 400 but the model's embedding has 300 rows"):
        HFKeyProbe(torch.full((1, 4), 400))(models["llama"])


# ---------------------------------------------------------------- a loop of one's own

def test_recorder_writes_the_projects_schema(models, tmp_path):
    model, path = models["gemma3"], tmp_path / "results.json"
    rec = KeyRecorder(path, ids(), tag="gemma", header={"seed": 3})
    rec.record(model, step=0, tokens=0)
    rec.record(model, step=10, tokens=480, loss=2.5, wall_time_s=1.0)
    res = load_results(path)
    assert res["steps"] == [0, 10] and res["tokens"] == [0, 480] and res["loss"] == [None, 2.5]
    assert res["val_loss"][0] is None and res["val_loss"][1] == pytest.approx(res["init_val_loss"])  # same weights
    assert res["config"]["model"]["qk_norm"] == "learned" and res["seed"] == 3
    assert sorted(res["layer_pr"]) == ["0", "1", "2"] and len(res["gamma_cv"]["0"]) == 2
    with pytest.raises(ProbeError, match="step 10: this recorder's last probe was at step 10, and records only "
                                         "append"):
        rec.record(model, step=10, tokens=480)
    with pytest.raises(ProbeError, match="holds probes of another run.*starts at step 0"):
        KeyRecorder(path, ids(), tag="gemma").record(model, step=0, tokens=0)
    with pytest.raises(ProbeError, match="another probe batch"):
        KeyRecorder(path, ids(seed=2), tag="gemma").record(model, step=20, tokens=960)
    before = path.read_bytes()
    with pytest.raises(ProbeError, match=r"step 5: .*results.json holds probes up to step 10 and only appends.* "
                                         r"passes resumed_at=<its step>"):
        KeyRecorder(path, ids(), tag="gemma").record(model, step=5, tokens=240, loss=2.6)
    assert path.read_bytes() == before  # nothing truncated
    again = KeyRecorder(path, ids(), tag="gemma")  # resumed from a checkpoint at step 4: the probe at 10 is dropped
    again.resume(model, 4, every=10)
    again.record(model, step=5, tokens=240, loss=2.6)
    assert load_results(path)["steps"] == [0, 5]


def test_record_keys_one_call_at_a_time(models, tmp_path):
    path = tmp_path / "results.json"
    for step in (0, 5, 10):
        record_keys(path, models["llama"], ids(), step=step, tokens=8 * step, loss=None if step == 0 else 3.0)
    res = load_results(path)
    assert res["steps"] == [0, 5, 10] and res["tokens"] == [0, 40, 80] and res["config"]["model"]["qk_norm"] == "none"
    before = path.read_bytes()
    for step in (5, 10, 0):  # a loop that restarts its counter per epoch, or repeats a step: refused, nothing cut
        with pytest.raises(ProbeError, match=f"step {step}: .* holds probes up to step 10 and only appends"
                           if step else "holds probes of another run"):
            record_keys(path, models["llama"], ids(), step=step, tokens=40, loss=2.0)
        assert path.read_bytes() == before
    record_keys(path, models["llama"], ids(), step=6, tokens=48, loss=2.0, resumed_at=5)  # a resumed loop
    assert load_results(path)["steps"] == [0, 5, 6] and load_results(path)["loss"] == [None, 3.0, 2.0]
    with pytest.raises(ProbeError, match="step 5, resumed_at 5: the first probe after a resume comes after"):
        record_keys(path, models["llama"], ids(), step=5, tokens=48, resumed_at=5)


@pytest.mark.parametrize("values, message", [
    ({"step": 2.0}, r"step=2.0 \(float\): give the number of optimizer steps done as a whole number >= 0"),
    ({"step": True}, r"step=True \(bool\): give the number of optimizer steps done"),
    ({"step": -1}, r"step=-1 \(int\): give the number of optimizer steps done as a whole number >= 0"),
    ({"tokens": "abc"}, r"tokens='abc' \(str\): give the number of training tokens seen as a whole number >= 0"),
    ({"tokens": -8}, r"tokens=-8 \(int\): give the number of training tokens seen"),
    ({"tokens": 8.5}, r"tokens=8.5 \(float\)"),
    ({"loss": float("nan")}, r"loss=nan \(float\): give the mean training loss since the previous probe as a "
                             r"finite number, or None"),
    ({"loss": float("inf")}, r"loss=inf \(float\)"),
    ({"loss": "2.5"}, r"loss='2.5' \(str\)"),
])
def test_the_probe_api_refuses_values_of_the_wrong_type(models, tmp_path, values, message):
    path = tmp_path / "results.json"
    args = {"step": 3, "tokens": 24, "loss": 2.0, **values}
    with pytest.raises(ProbeError, match=message):
        record_keys(path, models["llama"], ids(), **args)
    with pytest.raises(ProbeError, match=message):
        KeyRecorder(path, ids()).record(models["llama"], **args)
    assert not path.exists()
    record_keys(path, models["llama"], ids(), step=0, tokens=0)
    before = path.read_bytes()
    with pytest.raises(ProbeError, match=message):
        record_keys(path, models["llama"], ids(), **{**args, "step": 3 if "step" not in values else args["step"]})
    assert path.read_bytes() == before


def test_a_damaged_file_is_refused_not_overwritten(models, tmp_path):
    path = tmp_path / "results.json"
    path.write_text("{not json")
    with pytest.raises(ProbeError, match="not valid JSON.*does not write over a file it cannot read"):
        KeyRecorder(path, ids()).record(models["llama"], step=4, tokens=0)
    assert path.read_text() == "{not json"


def test_frozen_gains_are_recorded_as_frozen(tmp_path):
    model = make_hf("qwen3")
    for name, p in model.named_parameters():
        p.requires_grad_(not name.endswith(("q_norm.weight", "k_norm.weight")))
    KeyRecorder(tmp_path / "r.json", ids()).record(model, step=0, tokens=0)
    res = load_results(tmp_path / "r.json")
    assert res["config"]["model"]["qk_norm"] == "frozen" and res["gamma_final"] == {} and res["gamma_cv"]["0"]


# ---------------------------------------------------------------- transformers' Trainer

class Blocks(torch.utils.data.Dataset):
    def __init__(self, n=64, T=16):
        self.x = torch.randint(3, 290, (n, T), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def train(tmp_path, max_steps, every=3, resume=None, **cb):
    from transformers import Trainer, TrainingArguments
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=max_steps, per_device_train_batch_size=2,
                             logging_steps=2, save_steps=4, report_to=[], use_cpu=True, disable_tqdm=True,
                             include_num_input_tokens_seen=cb.pop("count_tokens", True), seed=0)
    callback = KeyProbeCallback(tmp_path / "results.json", ids(2, 16), every=every, **cb)
    trainer = Trainer(model=make_hf("qwen3"), args=args, train_dataset=Blocks(), callbacks=[callback])
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.mark.slow
def test_trainer_callback_and_resume(tmp_path):
    """Probes at 0, every 3 steps and the last; each loss is the step-weighted mean of the Trainer's logs since the
    previous probe; a resume from the checkpoint at step 4 keeps the probes up to 3 and takes 6 and 8 again."""
    trainer = train(tmp_path, 8)
    res = load_results(tmp_path / "results.json")
    assert res["steps"] == [0, 3, 6, 8] and res["tokens"] == [0, 96, 192, 256]
    logs = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    assert sorted(logs) == [2, 3, 4, 6, 8]  # logging_steps 2, and the probe steps 3 (forced)
    assert res["loss"][1] == pytest.approx((2 * logs[2] + logs[3]) / 3, rel=1e-12)
    assert res["loss"][2] == pytest.approx((logs[4] + 2 * logs[6]) / 3, rel=1e-12)
    assert res["loss"][3] == pytest.approx(logs[8], rel=1e-12)
    first = json.loads((tmp_path / "results.json").read_text())
    train(tmp_path, 8, resume=str(tmp_path / "out" / "checkpoint-4"))
    again = load_results(tmp_path / "results.json")
    assert again["steps"] == [0, 3, 6, 8] and again["probes"][1] == first["probes"][1]
    assert again["loss"][2] == pytest.approx(first["loss"][2], rel=1e-5)  # the same steps trained again
    (tmp_path / "results.json").unlink()
    with pytest.raises(ProbeError, match="cannot resume from step 4: .*results.json is missing"):
        train(tmp_path, 8, resume=str(tmp_path / "out" / "checkpoint-4"))


@pytest.mark.slow
def test_trainer_setups_the_probe_cannot_follow(tmp_path):
    with pytest.raises(ProbeError, match="include_num_input_tokens_seen=True"):
        train(tmp_path, 2, count_tokens=False)
    train(tmp_path / "per_step", 2, count_tokens=False, tokens_per_step=32)
    assert load_results(tmp_path / "per_step" / "results.json")["tokens"] == [0, 64]
    callback = KeyProbeCallback(tmp_path / "x.json", ids())
    for args in (SimpleNamespace(fsdp="full_shard"), SimpleNamespace(deepspeed="zero3.json")):
        with pytest.raises(ProbeError, match="needs the whole model .* shards it"):
            callback.on_train_begin(args, SimpleNamespace(global_step=0), None)
    with pytest.raises(ProbeError, match="every must be a whole number"):
        KeyProbeCallback(tmp_path / "x.json", ids(), every=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_probe_on_cuda_matches_cpu(models):
    """The same record on CUDA as on CPU, the model left on its device and in its mode. Both fp32 with TF32 off;
    two fp32 paths of 3 layers whose longest sums run over d_model x T terms: 4 x sum_rel_tol of those, each way."""
    torch.backends.cuda.matmul.allow_tf32 = False
    rel = 8 * sum_rel_tol("fp32", 64 * 24)
    cpu = HFKeyProbe(ids())(models["gemma3"])
    model = make_hf("gemma3").float().eval().cuda()
    gpu = HFKeyProbe(ids())(model)
    assert next(model.parameters()).is_cuda and not model.training
    assert gpu["loss"] == pytest.approx(cpu["loss"], rel=rel)
    for a, b in zip(cpu["layers"], gpu["layers"]):
        for site in ("k_norm", "k_hat", "k_rope"):
            assert b[site]["pr_sv"] == pytest.approx(a[site]["pr_sv"], rel=rel)
        assert b["attn"]["logit_max"] == pytest.approx(a["attn"]["logit_max"], rel=rel)


@pytest.mark.slow
def test_trainer_callback_spike_alarm(tmp_path, capsys):
    """grad_norm:0 is crossed at the first log (step 2) only; results.json keeps it, a resume neither repeats nor
    loses it; update_rms_adamw:0 is read from the weights the optimizer changed; a signal the Trainer does not give
    is refused."""
    trainer = train(tmp_path, 8, spike_alarm="grad_norm:0")
    first = {e["step"]: e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e}[2]
    assert [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("alarm:")] == \
        [f"alarm: grad_norm {first:.4g} >= 0 at step 2 (the gradient norm before clipping)"]
    alarms = [{"step": 2, "tokens": 64, "alarm": {"signal": "grad_norm", "value": first, "threshold": 0.0}}]
    assert load_results(tmp_path / "results.json")["alarms"] == alarms
    train(tmp_path, 8, resume=str(tmp_path / "out" / "checkpoint-4"), spike_alarm="grad_norm:0")
    assert "alarm:" not in capsys.readouterr().out
    assert load_results(tmp_path / "results.json")["alarms"] == alarms
    train(tmp_path / "update", 2, spike_alarm="update_rms_adamw:0")
    (alarm,) = load_results(tmp_path / "update" / "results.json")["alarms"]
    assert alarm["step"] == 2 and alarm["alarm"]["value"] > 0
    with pytest.raises(ConfigError, match="spike_alarm='key_norm:3': key_norm is recorded by this project's own "
                                          "trainer only. Fix: on a Hugging Face Trainer's run watch grad_norm"):
        KeyProbeCallback(tmp_path / "x.json", ids(), spike_alarm="key_norm:3")
