"""The light gain ablation (issue 66): six light probes (KeyProbe.measure_pr), the learned mode from the final
probe, give the entries that seven full probes gave, bit for bit."""
import json

import pytest
import torch

from research.probing import ablation
from research.probing.ablation import MODES, gain_ablation, learned_entry, validation_loss
from research.probing.probe import KeyProbe
from research.results.vocabulary import PR
from tests.research.probing.test_exact_savings import perturbed


def seven_full_probes(model, probe, batches) -> dict:
    """The gain ablation as it was: a full probe of every mode, the learned one included."""
    model.eval()
    gains = {"q": [b.attn.q_norm.weight for b in model.blocks], "k": [b.attn.k_norm.weight for b in model.blocks]}
    trained = {side: [g.detach().clone() for g in gs] for side, gs in gains.items()}
    shared, out = probe.covers(batches), {}
    with torch.no_grad():
        for mode in MODES:
            for side in gains:
                for g, t in zip(gains[side], trained[side]):
                    g.copy_(t)
            if mode != "learned":
                sides, how = mode.split("_")
                for side in sides:
                    for g, t in zip(gains[side], trained[side]):
                        g.copy_(torch.ones_like(t) if how == "ones" else t.mean().expand_as(t))
            rec, loss = probe.measure(model, shared)
            out[mode] = {"val_loss": loss if shared else validation_loss(model, batches, probe.precision),
                         "mean_pr": rec["mean_pr"], "layer_pr": [layer["means"][PR] for layer in rec["layers"]]}
        for side in gains:
            for g, t in zip(gains[side], trained[side]):
                g.copy_(t)
    return out


def setup(preset: str, covered: bool, precision: str = "fp32"):
    from configs import get_preset
    cfg = get_preset(preset)
    model = perturbed(preset, "learned", seed=3)
    g = torch.Generator().manual_seed(4)
    blocks = torch.randint(0, cfg.model.vocab_size, (cfg.probe.probe_batch, cfg.data.seq_len + 1), generator=g)
    probe = KeyProbe(blocks[:, :-1], precision, targets_BT=blocks[:, 1:])
    half = cfg.probe.probe_batch // 2
    rows = blocks[:half] if covered else torch.randint(0, cfg.model.vocab_size, blocks[:half].shape, generator=g)
    batches = [(rows[:half // 2, :-1], rows[:half // 2, 1:]), (rows[half // 2:, :-1], rows[half // 2:, 1:])]
    assert bool(probe.covers(batches)) == covered
    return model, probe, batches


@pytest.mark.parametrize("preset, covered, precision", [
    ("debug", True, "fp32"), ("debug", False, "fp32"), ("debug", True, "bf16"),
    pytest.param("tiny", True, "fp32", marks=pytest.mark.slow)])
def test_six_light_probes_give_what_seven_full_probes_gave(preset, covered, precision):
    model, probe, batches = setup(preset, covered, precision)
    want = seven_full_probes(model, probe, batches)
    record, loss = probe.measure(model, probe.covers(batches))  # the final probe, as the callback takes it
    forwards = []
    hidden = model.hidden
    model.hidden = lambda *a, **k: forwards.append(1) or hidden(*a, **k)
    got = gain_ablation(model.train(), probe, batches, learned=learned_entry(record, loss))
    assert json.dumps(got) == json.dumps(want)
    # one light probe per replaced mode (the learned one is the final probe's), and uncovered a validation of each
    assert len(forwards) == len(MODES) - 1 + (0 if covered else len(MODES) * len(batches))
    assert model.training
    # without the final probe's entry, the learned mode is measured too, by a light probe, and the same
    assert json.dumps(gain_ablation(model, probe, batches)) == json.dumps(want)


def test_a_light_probe_reads_what_the_full_probe_reads():
    model, probe, _ = setup("debug", True)
    record, loss = probe.measure(model, 3)
    layer_pr, mean_pr, light_loss = probe.measure_pr(model, 3)
    assert layer_pr == [layer["means"][PR] for layer in record["layers"]]
    assert (mean_pr, light_loss) == (record["mean_pr"], loss)


def test_the_light_ablation_runs_no_attention_metric(monkeypatch):
    model, probe, batches = setup("debug", True)
    record, loss = probe.measure(model, probe.covers(batches))
    monkeypatch.setattr("research.probing.probe.attention_metrics", None)  # a full probe would call it
    assert set(gain_ablation(model, probe, batches, learned=learned_entry(record, loss))) == set(MODES)
    assert ablation.MODES == MODES
