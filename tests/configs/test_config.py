import json

import pytest
import torch

from configs import PRESETS, ConfigError, RunConfig, apply_overrides, get_preset
from models import MinimalLLM


@pytest.mark.parametrize("name,params", [("tiny", 1_706_368), ("88m", 88_630_528), ("1b", 1_577_199_616)])
def test_presets_have_the_stated_sizes(name, params):
    cfg = get_preset(name)
    with torch.device("meta"):  # no memory for the 1.5B weights
        model = MinimalLLM(cfg.model)
    assert model.num_params() == params
    assert cfg.model.d_head == (128 if name == "1b" else 64)


def test_writeup_optimizer_settings():
    m88, b1 = get_preset("88m").train, get_preset("1b").train
    assert (m88.muon_lr, m88.adamw_lr, m88.weight_decay, m88.grad_clip) == (0.024, 0.006, 0.2, 1.0)
    assert (b1.muon_lr, b1.adamw_lr, b1.schedule, b1.warmup_frac) == (0.012, 0.003, "cosine", 0.01)
    assert get_preset("1b").tokens_per_step == 8 * 4 * 2048


def test_config_round_trips_through_json(tmp_path):
    for name in PRESETS:
        cfg = get_preset(name)
        cfg.save(tmp_path / f"{name}.json")
        assert RunConfig.load(tmp_path / f"{name}.json") == cfg


def test_overrides_validate_and_unknown_fields_are_rejected():
    cfg = apply_overrides(get_preset("tiny"), {"n_layers": 8, "qk_norm": "none", "seq_len": 64})
    assert (cfg.model.n_layers, cfg.model.qk_norm, cfg.data.seq_len) == (8, "none", 64)
    with pytest.raises(ConfigError, match="seq_len=4096 exceeds max_seq_len=1024"):
        apply_overrides(get_preset("tiny"), {"seq_len": 4096})
    with pytest.raises(ConfigError, match="unknown config field 'layers'"):
        apply_overrides(get_preset("tiny"), {"layers": 8})
    with pytest.raises(ConfigError, match="source=files needs --paths"):
        apply_overrides(get_preset("tiny"), {"source": "files"})


def test_corrupted_config_file_gets_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model": {"n_layers": 2}')
    with pytest.raises(ConfigError, match="cannot read config .*config.json"):
        RunConfig.load(tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps({"model": {}, "train": {}}))
    with pytest.raises(ConfigError, match="expected keys model, train, data"):
        RunConfig.load(tmp_path / "config.json")
