"""Each config field is declared once (configs/config.py, configs.fields.knob), and what reads the declaration: a
field declared by a test appears in --help, a study file and the condition table with nothing else edited; the sets
derived from the declarations are the ones the project kept by hand before."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

import pytest

from configs import presets
from configs.config import SECTIONS, ConfigError, ModelConfig, declared, field_choices, variant_fields
from configs.fields import knob

TOY_HELP = "A toy gate on each head's output, declared by a test."


@dataclass
class ToyModelConfig(ModelConfig):
    """ModelConfig with one field more, declared as every field is."""

    toy_gate: Literal["none", "sigmoid"] = knob("none", TOY_HELP, variant=True)


@pytest.fixture
def toy_field(monkeypatch):
    """The config with the toy field: the sections and the presets build ToyModelConfig (a real field is added to
    ModelConfig itself, which both already name)."""
    monkeypatch.setitem(SECTIONS, "model", ToyModelConfig)
    monkeypatch.setattr(presets, "ModelConfig", ToyModelConfig)


def _option_help(parser: argparse.ArgumentParser, option: str) -> str:
    action = next(a for a in parser._actions if option in a.option_strings)
    return " ".join(parser._get_formatter()._expand_help(action).split())


def test_a_declared_field_is_an_option_with_its_help_choices_and_default(toy_field):
    import train_llm
    from configs.cli import config_from_args
    parser = train_llm.build_parser([])
    assert _option_help(parser, "--toy_gate") == f"[model] {TOY_HELP} Choices: none, sigmoid. Default: none"
    assert "--toy_gate STR" in parser.format_help()
    assert config_from_args(parser.parse_args(["--toy_gate", "sigmoid"])).model.toy_gate == "sigmoid"
    with pytest.raises(ConfigError, match="toy_gate='sideways': choose one of none, sigmoid"):
        config_from_args(parser.parse_args(["--toy_gate", "sideways"]))


STUDY = """
name: toy
seeds: [0, 1]
baseline: A
preset: debug
conditions:
  A:
  B: {toy_gate: sigmoid}
"""


def _runs(study, conditions) -> dict:
    """Hand-made results (the quantities of research.simulations.conditions' TRUTH in every run) carrying the config
    each run of `study` gets, as the runner builds it."""
    from research.simulations.conditions import TRUTH, synthetic_run
    from research.studies.runner import base_config, run_config
    base = base_config(study, "debug", {})
    return {c: [{**synthetic_run(c, s, TRUTH), "config": run_config(base, study.conditions[c], s).to_dict()}
                for s in (0, 1)] for c in conditions}


def test_a_declared_field_is_a_condition_of_a_study_file_and_the_condition_table_names_it(toy_field, tmp_path):
    """B sets the toy field: the table's row of each condition names its value (the baseline's its own); where every
    run has one value, the report's shared line lists it among the variants, in declaration order (model, then
    train)."""
    from research.analysis.conditions import ConditionRuns, analyze
    from research.plots.conditions import report
    from research.studies.study_file import read_study_file
    from tests.helpers import md_table
    path = tmp_path / "toy.yaml"
    path.write_text(STUDY)
    study = read_study_file(path)
    assert study.conditions == {"A": {}, "B": {"toy_gate": "sigmoid"}}
    text = report(analyze(ConditionRuns(_runs(study, ("A", "B")), "A"), 0.03, 0.005))
    assert md_table(text, "condition") == [
        {"condition": "A (baseline)", "seeds": "0, 1", "what it sets": "toy_gate=none"},
        {"condition": "B", "seeds": "0, 1", "what it sets": "toy_gate=sigmoid"}]
    assert "Every run: qk_norm=learned, qk_norm_scope=head, qk_gain_shape=shared, qk_gain_on=both, qk_gain_init=1.0, " \
           "qk_mult=1.0, attn_scale=0.0, attn_softcap=0.0, attn_gate=none, rope_fraction=1.0, qk_clip=0.0, " \
           "z_loss=0.0, qk_optimizer=muon, qk_lr_multiplier=1.0, muon_update_scale=none." in text
    path.write_text(STUDY.replace("B: {toy_gate: sigmoid}", "B: {qk_norm: none}"))
    text = report(analyze(ConditionRuns(_runs(read_study_file(path), ("A", "B")), "A"), 0.03, 0.005))
    assert "Every run: qk_norm_scope=head, qk_gain_shape=shared, qk_gain_on=both, qk_gain_init=1.0, qk_mult=1.0, " \
           "attn_scale=0.0, attn_softcap=0.0, attn_gate=none, rope_fraction=1.0, toy_gate=none, qk_clip=0.0, " \
           "z_loss=0.0, qk_optimizer=muon, qk_lr_multiplier=1.0, muon_update_scale=none." in text


def test_a_study_file_condition_outside_the_declared_choices_is_refused_before_training(toy_field, tmp_path,
                                                                                           capsys):
    from research import study
    from tests.helpers import stops
    path = tmp_path / "toy.yaml"
    path.write_text(STUDY.replace("toy_gate: sigmoid", "toy_gate: sideways"))
    assert stops(capsys, study.main, [str(path), "--out", str(tmp_path / "out")]) == \
        f"error: {path}: condition B: toy_gate='sideways': choose one of none, sigmoid (nothing was trained)"
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- the sets kept by hand before

def test_the_derived_sets_are_the_ones_kept_by_hand_before():
    """The lists configs.config.FIELD_CHOICES, research/plots/conditions.py VARIANT_FIELDS, research/speed/
    variants.py VARIANTS and training/resume.py RESUMABLE_CHANGES held before the declarations, as sets (the
    declarations keep their own order)."""
    from research.speed.variants import variants
    from training.resume import RESUMABLE_CHANGES
    assert field_choices() == {
        "qk_norm": ("learned", "frozen", "none"), "schedule": ("constant", "cosine"),
        "orthogonalizer": ("polar_express", "newton_schulz"), "precision": ("auto", "fp32", "bf16"),
        "compile": ("auto", "on", "off"), "shard": ("none", "fsdp"), "source": ("english", "stdlib", "files", "hub"),
        "offline": ("error", "english"), "probe_precision": ("fp32", "bf16"), "qk_optimizer": ("muon", "adamw"),
        "muon_update_scale": ("none", "match_rms_adamw"), "attn_gate": ("none", "elementwise", "headwise"),
        "qk_norm_scope": ("head", "full"), "qk_gain_shape": ("shared", "per_head", "head_scalar"),
        "qk_gain_on": ("both", "q", "k")}
    assert set(variant_fields()) == {"qk_norm", "qk_norm_scope", "attn_softcap", "attn_gate", "z_loss",
                                     "qk_optimizer", "qk_lr_multiplier", "muon_update_scale", "qk_clip",
                                     "rope_fraction", "qk_gain_shape", "qk_gain_on", "qk_gain_init", "qk_mult",
                                     "attn_scale"}
    assert variants() == {
        "default": {}, "attn_softcap=15": {"attn_softcap": 15.0}, "attn_gate=elementwise": {"attn_gate": "elementwise"},
        "attn_gate=headwise": {"attn_gate": "headwise"}, "z_loss=1e-4": {"z_loss": 1e-4},
        "qk_norm_scope=full": {"qk_norm_scope": "full"}, "qk_optimizer=adamw": {"qk_optimizer": "adamw"},
        "qk_lr_multiplier=2": {"qk_lr_multiplier": 2.0},
        "muon_update_scale=match_rms_adamw": {"muon_update_scale": "match_rms_adamw"},
        "qk_gain_shape=per_head": {"qk_gain_shape": "per_head"}, "qk_gain_shape=head_scalar": {"qk_gain_shape":
                                                                                              "head_scalar"},
        "qk_gain_on=q": {"qk_gain_on": "q"}, "qk_gain_init=5.0": {"qk_gain_init": 5.0}, "qk_mult=1.3": {"qk_mult": 1.3},
        "attn_scale=1.0": {"attn_scale": 1.0}}
    assert RESUMABLE_CHANGES == {"tokens", "log_every", "eval_every", "ckpt_every", "keep_last", "device", "compile",
                                 "fused_loss", "cache_dir", "offline_note", "telemetry", "spike_alarm", "threads"}


def test_every_field_is_declared_with_a_help_sentence_and_the_variant_keys():
    for name, (_, f) in declared().items():
        assert set(f.metadata) == {"help", "variant", "timed", "results"}, name
        assert f.metadata["variant"] or not f.metadata["timed"], f"{name}: only a variant is timed"


def test_a_resume_may_change_only_the_fields_declared_not_to_change_results():
    """qk_norm_scope (changes results) is named; log_every and telemetry (declared results=False) are not."""
    from configs import apply_overrides, get_preset
    from training.resume import config_differences
    old = get_preset("debug")
    new = apply_overrides(old, {"log_every": 5, "telemetry": False, "qk_norm_scope": "full"})
    assert config_differences(old, new) == ["model.qk_norm_scope: 'head' -> 'full'"]
