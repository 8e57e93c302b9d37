import json

import pytest
import torch

from configs import PRESETS, ConfigError, apply_overrides, get_preset
from configs.files import load_run_config, run_config_from_dict, save_run_config
from models import MinimalLLM


@pytest.mark.parametrize("name,params", [("tiny", 1_706_368), ("88m", 88_630_528), ("1b", 1_577_199_616)])
def test_presets_have_the_stated_sizes(name, params):
    cfg = get_preset(name)
    with torch.device("meta"):  # no memory for the 1.5B weights
        model = MinimalLLM(cfg.model)
    assert model.num_params() == params
    assert cfg.model.d_head == (128 if name == "1b" else 64)


@pytest.mark.parametrize("name", ["tiny", "88m", "1b", "debug"])
def test_every_preset_has_the_writeups_optimizer_recipe(name):
    """Muon lr 0.024 (0.012 for 1b), momentum 0.95, Nesterov, 5 steps, no weight decay; AdamW lr 0.006
    (0.003), PyTorch's betas (0.9, 0.999), weight decay 0.2 including the norm gains; clip 1.0."""
    t = get_preset(name).train
    big = name == "1b"
    assert (t.muon_lr, t.momentum, t.nesterov, t.ortho_steps, t.muon_weight_decay) == \
        (0.012 if big else 0.024, 0.95, True, 5, 0.0)
    assert (t.adamw_lr, t.adam_beta1, t.adam_beta2, t.adamw_weight_decay, t.wd_on_gains) == \
        (0.003 if big else 0.006, 0.9, 0.999, 0.2, True)
    assert t.grad_clip == 1.0 and t.orthogonalizer == "polar_express"
    assert (t.schedule, t.warmup_frac) == (("cosine", 0.01) if big else ("constant", 0.0))
    assert (t.qk_optimizer, t.qk_lr_multiplier, t.muon_update_scale) == ("muon", 1.0, "none")  # variants off


def test_old_configs_keep_their_meaning():
    """Before Muon's weight decay had its own field, `weight_decay` decayed Muon's and AdamW's parameters."""
    d = get_preset("tiny").to_dict()
    for k in ("muon_weight_decay", "adamw_weight_decay"):
        del d["train"][k]
    d["train"]["weight_decay"] = 0.1
    t = run_config_from_dict(d).train
    assert (t.muon_weight_decay, t.adamw_weight_decay) == (0.1, 0.1)
    assert get_preset("1b").tokens_per_step == 8 * 4 * 2048


def test_config_round_trips_through_json(tmp_path):
    for name in PRESETS:
        cfg = get_preset(name)
        save_run_config(cfg, tmp_path / f"{name}.json")
        assert load_run_config(tmp_path / f"{name}.json") == cfg


def test_overrides_validate_and_unknown_fields_are_rejected():
    cfg = apply_overrides(get_preset("tiny"), {"n_layers": 8, "qk_norm": "none", "seq_len": 64})
    assert (cfg.model.n_layers, cfg.model.qk_norm, cfg.data.seq_len) == (8, "none", 64)
    with pytest.raises(ConfigError, match="seq_len=4096 exceeds max_seq_len=1024"):
        apply_overrides(get_preset("tiny"), {"seq_len": 4096})
    with pytest.raises(ConfigError, match="unknown config field 'layers'"):
        apply_overrides(get_preset("tiny"), {"layers": 8})
    with pytest.raises(ConfigError, match="source=files needs --paths"):
        apply_overrides(get_preset("tiny"), {"source": "files"})


@pytest.mark.parametrize("argv, line", [
    (["--qk_lr_multiplier", "0"], "error: qk_lr_multiplier=0.0 must be positive (1 keeps W_q and W_k at their "
                                  "optimizer's learning rate)"),
    (["--qk_lr_multiplier", "-2"], "error: qk_lr_multiplier=-2.0 must be positive (1 keeps W_q and W_k at their "
                                   "optimizer's learning rate)"),
    (["--qk_optimizer", "sgd"], "error: qk_optimizer='sgd': choose one of muon, adamw"),
    (["--muon_update_scale", "moonlight"], "error: muon_update_scale='moonlight': choose one of none, "
                                           "match_rms_adamw"),
])
def test_optimizer_variants_are_validated_before_anything_is_written(capsys, tmp_path, argv, line):
    import train_llm
    from tests.helpers import stops
    assert stops(capsys, train_llm.main, [*argv, "--out", str(tmp_path / "run")]) == line
    assert not (tmp_path / "run").exists()


def test_optimizer_variants_are_set_from_the_command_line_and_kept_in_config_json(tmp_path):
    import train_llm
    from configs import config_from_args
    argv = ["--qk_optimizer", "adamw", "--qk_lr_multiplier", "0.25", "--muon_update_scale", "match_rms_adamw"]
    cfg = config_from_args(train_llm.build_parser(argv).parse_args(argv))
    save_run_config(cfg, tmp_path / "config.json")
    t = load_run_config(tmp_path / "config.json").train
    assert (t.qk_optimizer, t.qk_lr_multiplier, t.muon_update_scale) == ("adamw", 0.25, "match_rms_adamw")


def test_corrupted_config_file_gets_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model": {"n_layers": 2}')
    with pytest.raises(ConfigError, match="cannot read config .*config.json"):
        load_run_config(tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps({"model": {}, "train": {}}))
    with pytest.raises(ConfigError, match="expected keys model, train, data"):
        load_run_config(tmp_path / "config.json")


@pytest.mark.parametrize("argv, line", [
    # debug: d_model 128, d_ff 256, so Muon's step is at most muon_lr x sqrt(256) = 16 x muon_lr; muon_lr 0.024,
    # adamw_lr 0.006, adam_beta1 0.9. The largest float32 is 3.4028e38; 3.4028e38 / 16 = 2.13e37.
    (["--muon_lr", "1e39"], "error: muon_lr=1e+39 is beyond what an optimizer step can hold: Muon multiplies it by up "
                            "to sqrt(max(d_model, d_ff)) = sqrt(256), giving 1.6e+40, past the largest float32 "
                            "(3.4e+38), the precision the weights are updated in (bf16 runs too). Fix: lower muon_lr "
                            "below 2.13e+37"),
    # 1e308 x 0.024 x 16 = 3.84e307; the bound 3.4028e38 / (0.024 x 16) = 8.86e38
    (["--qk_lr_multiplier", "1e308"], "error: qk_lr_multiplier=1e+308 is beyond what an optimizer step can hold: W_q's "
                                      "and W_k's rate is it x muon_lr (0.024), and Muon multiplies it by up to "
                                      "sqrt(max(d_model, d_ff)) = sqrt(256), giving 3.84e+307, past the largest "
                                      "float32 (3.4e+38), the precision the weights are updated in (bf16 runs too). "
                                      "Fix: lower qk_lr_multiplier below 8.86e+38"),
    # AdamW's first step: 4e37 / (1 - 0.9) = 4e38; the bound 3.4028e38 x 0.1 = 3.4e37
    (["--adamw_lr", "4e37"], "error: adamw_lr=4e+37 is beyond what an optimizer step can hold: AdamW's first step "
                             "divides it by 1 - adam_beta1 = 0.1, giving 4e+38, past the largest float32 (3.4e+38), "
                             "the precision the weights are updated in (bf16 runs too). Fix: lower adamw_lr below "
                             "3.4e+37"),
    # 1e308 x 0.006 / 0.1 = 6e306; the bound 3.4028e38 x 0.1 / 0.006 = 5.67e39
    (["--qk_optimizer", "adamw", "--qk_lr_multiplier", "1e308"], "error: qk_lr_multiplier=1e+308 is beyond what an "
     "optimizer step can hold: W_q's and W_k's rate is it x adamw_lr (0.006), and AdamW's first step divides it by 1 "
     "- adam_beta1 = 0.1, giving 6e+306, past the largest float32 (3.4e+38), the precision the weights are updated "
     "in (bf16 runs too). Fix: lower qk_lr_multiplier below 5.67e+39"),
    # 1e308 x 1 x 16 = 1.6e309: past the largest double (1.8e308), inf
    (["--muon_lr", "1", "--qk_lr_multiplier", "1e308"], "error: qk_lr_multiplier=1e+308 is beyond what an optimizer "
     "step can hold: W_q's and W_k's rate is it x muon_lr (1), and Muon multiplies it by up to sqrt(max(d_model, "
     "d_ff)) = sqrt(256), giving more than 1e308, past the largest float32 (3.4e+38), the precision the weights are "
     "updated in (bf16 runs too). Fix: lower qk_lr_multiplier below 2.13e+37"),
])
def test_a_rate_no_optimizer_step_can_hold_is_refused_at_the_config_check(capsys, tmp_path, argv, line):
    """It failed at the first step inside optimizers/muon.py with torch's 'value cannot be converted to type float
    without overflow' (issue 50); now one line before anything is written."""
    import train_llm
    from tests.helpers import stops
    assert stops(capsys, train_llm.main, ["--preset", "debug", *argv, "--out", str(tmp_path / "run")]) == line
    assert not (tmp_path / "run").exists()
    # just inside the bounds the config builds (such a run diverges: a non-finite loss, told in one line)
    for field, value in (("muon_lr", 2e37), ("adamw_lr", 3.4e37), ("qk_lr_multiplier", 8e38)):
        assert getattr(apply_overrides(get_preset("debug"), {field: value}).train, field) == value
