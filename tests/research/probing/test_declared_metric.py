"""A metric declared once in research/probing/metrics.py (LAYER_METRICS), its name in the vocabulary, is recorded by
both probes through their one layer reducer: the training probe of this project's model and the Hugging Face
probe of any adapter's, whatever it reads (a site's keys, the queries, the RoPE, the attention's statistics)."""
import pytest
import torch

from research.probing import metrics
from research.probing.hf import HFKeyProbe
from research.probing.probe import KeyProbe
from research.results import vocabulary
from tests.research.inspection.builders import make_hf
from tests.research.probing.test_probe import ids, model_for


def toy_key_energy(layer):  # a site's metric: mean squared component of each KV head's keys
    return layer["k_norm"].float().square().mean((1, 2, 3))


def toy_query_turns(layer):  # an attention metric reading the queries, the RoPE and the attention's statistics
    turns = 0.0 if layer["rope"] is None else float(layer["rope"].frequencies.sum())
    return layer["q_rope"].float().square().mean((1, 2, 3)) * (1 + turns) + layer["attention"]["entropy"]


@pytest.fixture
def declared(monkeypatch):
    monkeypatch.setattr(metrics, "LAYER_METRICS", (("k_norm", "toy_energy", toy_key_energy),
                                                   ("attn", "toy_turns", toy_query_turns)))
    monkeypatch.setattr(vocabulary, "KEY_METRICS", (*vocabulary.KEY_METRICS, "toy_energy"))
    monkeypatch.setattr(vocabulary, "ATTENTION_METRICS", (*vocabulary.ATTENTION_METRICS, "toy_turns"))


def check(record, heads: int, q_heads: int):
    for layer in record["layers"]:
        assert len(layer["k_norm"]["toy_energy"]) == heads and all(v > 0 for v in layer["k_norm"]["toy_energy"])
        assert len(layer["attn"]["toy_turns"]) == q_heads and all(v > 0 for v in layer["attn"]["toy_turns"])
        assert layer["means"]["k_norm.toy_energy"] == pytest.approx(sum(layer["k_norm"]["toy_energy"]) / heads)
        assert "toy_energy" not in layer["k_rope"]


def test_a_declared_metric_appears_in_the_training_probes_and_the_hugging_face_probes_records(declared):
    check(KeyProbe(ids())(model_for("learned")), 1, 2)
    x = torch.randint(3, 290, (2, 24), generator=torch.Generator().manual_seed(1))
    check(HFKeyProbe(x)(make_hf("qwen3").float().eval()), 2, 4)


def test_without_a_declaration_the_records_are_as_before():
    layer = KeyProbe(ids())(model_for("learned"))["layers"][0]
    assert "toy_energy" not in layer["k_norm"] and "toy_turns" not in layer["attn"]
