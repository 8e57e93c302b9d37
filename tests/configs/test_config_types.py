"""Values of the wrong type or out of range: refused where they are read, naming the file, the field and the fix,
never later inside the run (after config.json was written) nor as a raw traceback."""
import json

import pytest
import torch

import train_llm
from configs import ConfigError, apply_overrides, get_preset
from configs.files import load_run_config, run_config_from_dict
from training import memory_fit
from training.memory_fit import MemoryPlanError, check_fits
from tests.helpers import stops
from utils.runtime import Runtime


def _saved(tmp_path, edit) -> str:
    """The message load_run_config gives for a debug config.json changed by edit(dict)."""
    d = get_preset("debug").to_dict()
    edit(d)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError) as e:
        load_run_config(path)
    msg = str(e.value)
    assert str(path) in msg and "fix or restore config.json" in msg and "\n" not in msg
    return msg


@pytest.mark.parametrize("section,key,value,message", [
    ("model", "d_model", "128", "[model] d_model: expected a whole number, found '128'"),
    ("model", "n_layers", 2.0, "[model] n_layers: expected a whole number, found 2.0"),
    ("train", "nesterov", "maybe", "[train] nesterov: expected true or false, found 'maybe'"),
    ("train", "muon_lr", [1], "[train] muon_lr: expected a number, found [1]"),
    ("data", "paths", 5, "[data] paths: expected a list of strings, found 5"),
    ("data", "cache_dir", {"a": 1}, "[data] cache_dir: expected a string, found {'a': 1}"),
    ("probe", "probe_batch", True, "[probe] probe_batch: expected a whole number, found True"),
    ("model", "layers", 2, "unknown key 'layers' in section 'model'; the fields of model are: vocab_size,"),
    ("model", "n_layers", -1, "n_layers=-1 must be positive"),
])
def test_config_json_values_are_type_checked_as_a_config_file(tmp_path, section, key, value, message):
    msg = _saved(tmp_path, lambda d: d[section].__setitem__(key, value))
    assert f"{tmp_path / 'config.json'}: {message}" in msg


def test_config_json_sections_and_top_level_keys_are_checked(tmp_path):
    assert "section 'train' must be a mapping of its fields, found [1, 2]" in \
        _saved(tmp_path, lambda d: d.__setitem__("train", [1, 2]))
    assert "unknown key(s) 'extra'" in _saved(tmp_path, lambda d: d.__setitem__("extra", 1))
    assert "preset: expected a string, found 3" in _saved(tmp_path, lambda d: d.__setitem__("preset", 3))
    assert "expected keys model, train, data" in _saved(tmp_path, lambda d: d.pop("data"))
    # what a config.json holds is read back as it was written, legacy fields included
    d = get_preset("tiny").to_dict()
    assert run_config_from_dict(json.loads(json.dumps(d))) == get_preset("tiny")


@pytest.mark.parametrize("overrides,message", [
    ({"init_std": -1.0}, "init_std=-1.0 must be positive"),
    ({"init_std": 0.0}, "init_std=0.0 must be positive"),
    ({"norm_eps": -1.0}, "norm_eps=-1.0 must be positive"),
    ({"muon_lr": float("nan")}, "muon_lr=nan must be a finite number"),
    ({"adamw_lr": float("inf")}, "adamw_lr=inf must be a finite number"),
    ({"rope_theta": float("inf")}, "rope_theta=inf must be a finite number"),
    ({"grad_clip": float("inf")}, "grad_clip=inf must be a finite number"),
    ({"adamw_weight_decay": float("inf")}, "adamw_weight_decay=inf must be a finite number"),
    ({"hub_docs": 0}, "hub_docs=0 must be positive"),
    ({"stdlib_max_bytes": -5}, "stdlib_max_bytes=-5 must be positive"),
    ({"seed": -1}, "seed=-1 must be in [0, 2**63)"),
    ({"text_field": ""}, "text_field must not be empty"),
    ({"tokenizer": True}, "tokenizer=True must be text"),
])
def test_values_out_of_range_are_refused_with_the_config(overrides, message):
    with pytest.raises(ConfigError) as e:
        apply_overrides(get_preset("debug"), overrides)
    assert message in str(e.value)


@pytest.mark.parametrize("option,message", [
    (["--init_std", "-1"], "init_std=-1.0 must be positive"),
    (["--norm_eps", "-1"], "norm_eps=-1.0 must be positive"),
    (["--muon_lr", "inf"], "muon_lr=inf must be a finite number"),
    (["--muon_lr", "nan"], "muon_lr=nan must be a finite number"),
])
def test_late_failing_options_are_refused_before_anything_is_written(tmp_path, option, message, capsys):
    out = tmp_path / "run"
    assert stops(capsys, train_llm.main, ["--preset", "debug", "--out", str(out), *option]).startswith(
        f"error: {message}")
    assert not out.exists()


def test_rope_tables_that_cannot_fit_in_memory_are_refused_naming_a_max_seq_len_that_fits(monkeypatch):
    monkeypatch.setattr(memory_fit, "available_memory", lambda: 2 ** 30)  # a machine with 1 GiB free
    cfg = apply_overrides(get_preset("debug"), {"max_seq_len": 2 ** 22})  # d_head 64: ~1.0 GiB of RoPE tables
    with pytest.raises(MemoryPlanError) as e:
        check_fits(cfg, Runtime(torch.device("cpu"), "fp32"))
    msg = str(e.value)
    assert "the largest contributor is --max_seq_len 4,194,304 (the debug preset has 64)" in msg and "\n" not in msg
    fits = int(msg.split("Fix: --max_seq_len ")[1].split()[0].replace(",", ""))
    assert cfg.data.seq_len <= fits < 2 ** 22
    check_fits(apply_overrides(cfg, {"max_seq_len": fits}), Runtime(torch.device("cpu"), "fp32"))  # named: fits
    with pytest.raises(MemoryPlanError):
        check_fits(apply_overrides(cfg, {"max_seq_len": fits + 1}), Runtime(torch.device("cpu"), "fp32"))  # largest
