"""A run or a study asked to measure what its settings cannot (configs.measured, issue 65): refused in one line before
anything trains, by the run (train_llm.py) and by every study entry point (the runner: research/study.py)."""
from pathlib import Path

import pytest

import train_llm
from configs import ConfigError, apply_overrides, get_preset
from configs.measured import KEY_CACHE, PROBE, check_measured
from research import study
from research.analysis.conditions import primary_needs
from tests.helpers import stops

KV_STUDY = Path(__file__).resolve().parents[2] / "configs" / "studies" / "kv_cache.yaml"


def test_what_each_quantity_needs_is_the_probe_or_the_key_cache():
    assert primary_needs(("rank90", "kv_loss_4bit", "val_loss", "kv_logit_error_4bit")) == {
        "primary quantity rank90": PROBE, "primary quantity val_loss": PROBE,
        "primary quantity kv_loss_4bit": KEY_CACHE, "primary quantity kv_logit_error_4bit": KEY_CACHE}


@pytest.mark.parametrize("fields,asked,said", [
    ({"probe_every": 5}, {"primary quantity kv_loss_4bit": KEY_CACHE},
     "primary quantity kv_loss_4bit asks for the key cache's costs, which this config does not measure: the key "
     "cache's measurement is off (kv_cache, kv_every_probe and kv_layer_bits false): set kv_cache true (--kv_cache "
     "true, or kv_cache: true in a study file); or leave primary quantity kv_loss_4bit out"),
    ({"kv_cache": True}, {}, "kv_cache true asks for the key probe, which this config does not measure: probe_every "
                             "is 0 (no probe): give probe_every > 0 (e.g. --probe_every 25); or leave kv_cache true "
                             "out"),
    ({"kv_layer_bits": True}, {}, "kv_layer_bits true asks for the key probe"),
])
def test_what_the_config_does_not_measure_is_refused(fields, asked, said):
    with pytest.raises(ConfigError) as e:
        check_measured(apply_overrides(get_preset("debug"), fields), asked)
    assert said in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("fields", [{"probe_every": 5, "kv_cache": True}, {"probe_every": 5, "kv_every_probe": True},
                                    {"probe_every": 5, "kv_layer_bits": True}])
def test_a_config_that_measures_the_key_cache_passes(fields):
    check_measured(apply_overrides(get_preset("debug"), fields), {"primary quantity kv_loss_3bit": KEY_CACHE})


def test_a_run_with_the_key_cache_and_no_probe_is_refused_before_anything_is_written(tmp_path, capsys):
    line = stops(capsys, train_llm.main, ["--preset", "debug", "--kv_cache", "true", "--out", str(tmp_path / "run")])
    assert "kv_cache true asks for the key probe, which this config does not measure: probe_every is 0" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("extra", [[], ["--until_decided", "6"]])
def test_a_study_of_key_cache_quantities_with_the_key_cache_off_is_refused_before_it_trains(tmp_path, capsys, extra):
    out = tmp_path / "out"
    line = stops(capsys, study.main, [str(KV_STUDY), "--kv_cache", "false", "--out", str(out), *extra])
    assert line == (f"error: {KV_STUDY}: condition QK: primary quantity kv_loss_4bit asks for the key cache's costs, "
                    f"which this config does not measure: the key cache's measurement is off (kv_cache, "
                    f"kv_every_probe and kv_layer_bits false): set kv_cache true (--kv_cache true, or kv_cache: true "
                    f"in a study file); or leave primary quantity kv_loss_4bit out (nothing was trained)")
    assert not out.exists()
