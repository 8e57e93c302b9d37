"""A study's runs get their conditions' own fields, over the command line's (research.studies.runner)."""
import json

import pytest

from research import study
from research.studies import LR_SENSITIVITY
from research.studies.runner import base_config, run_config
from tests.helpers import STEP_TOKENS, md_table, stops
from utils.compare import flatten


def _args(corpus_file, cache_dir, out, *extra):
    return ["--out", str(out), "--source", "files", "--paths", str(corpus_file), "--cache_dir", str(cache_dir),
            "--precision", "fp32", "--eval_batches", "1", "--no_progress", *extra]


OWN_FIELDS = f"""
name: own_fields
seeds: [0]
baseline: base
preset: debug
tokens: {STEP_TOKENS}
probe_every: 1
conditions:
  base:
  LowLR: {{muon_lr: 0.001, adamw_lr: 0.0005, schedule: cosine, warmup_frac: 0.5}}
  Small: {{n_layers: 1, attn_softcap: 30}}
"""


@pytest.mark.slow
def test_every_field_a_condition_sets_reaches_its_runs_config(corpus_file, cache_dir, tmp_path, capsys):
    """Rates and schedule (LowLR), model and variant (Small) fields are in each condition's config.json and are all
    that differ from the baseline's; --muon_lr 0.01 is the shared config's (base and Small train at it) and LowLR
    keeps its own 0.001 (debug: muon_lr 0.024, adamw_lr 0.006, constant schedule, 2 layers, no cap). The report's
    condition table gives the baseline's value of every field that differs, and each other condition's changes."""
    path = tmp_path / "s.yaml"
    path.write_text(OWN_FIELDS)
    out = tmp_path / "out"
    study.main([str(path), *_args(corpus_file, cache_dir, out, "--muon_lr", "0.01")])
    assert "note: muon_lr=0.01 (the options) is the shared config's: condition(s) LowLR keep their own muon_lr" in \
        capsys.readouterr().out
    configs = {c: flatten(json.loads((out / c / "config.json").read_text())) for c in ("base", "LowLR", "Small")}
    base = configs["base"]
    assert (base["train.muon_lr"], base["train.adamw_lr"], base["train.schedule"], base["train.warmup_frac"],
            base["model.n_layers"], base["model.attn_softcap"], base["train.seed"]) == \
        (0.01, 0.006, "constant", 0.0, 2, 0.0, 0)
    changed = {c: {k: v for k, v in cfg.items() if v != base[k]} for c, cfg in configs.items()}
    assert changed == {"base": {}, "LowLR": {"train.muon_lr": 0.001, "train.adamw_lr": 0.0005,
                                             "train.schedule": "cosine", "train.warmup_frac": 0.5},
                       "Small": {"model.n_layers": 1, "model.attn_softcap": 30.0}}
    rows = {r["condition"]: r["what it sets"] for r in md_table((out / "report.md").read_text(), "condition")}
    assert rows == {"base (baseline)": "n_layers=2, attn_softcap=0.0, muon_lr=0.01, adamw_lr=0.006, "
                                       "schedule=constant, warmup_frac=0.0",
                    "LowLR": "muon_lr=0.001, adamw_lr=0.0005, schedule=cosine, warmup_frac=0.5",
                    "Small": "n_layers=1, attn_softcap=30.0"}


def test_a_non_finite_rate_of_a_condition_is_refused_as_a_shared_one(tmp_path, capsys):
    """The condition's muon_lr reaches the config check that refuses a NaN of the shared config."""
    path = tmp_path / "s.yaml"
    path.write_text(OWN_FIELDS.replace("{muon_lr: 0.001,", "{muon_lr: .nan,"))
    assert stops(capsys, study.main, [str(path), "--out", str(tmp_path / "out")]) == \
        f"error: {path}: condition LowLR: muon_lr=nan must be a finite number (nothing was trained)"
    path.write_text(OWN_FIELDS.replace("probe_every: 1", "probe_every: 1\nmuon_lr: .nan"))
    assert stops(capsys, study.main, [str(path), "--out", str(tmp_path / "out")]) == \
        f"error: {path}: the shared config: muon_lr=nan must be a finite number"
    assert not (tmp_path / "out").exists()


def test_the_lr_multiplier_scales_the_rates_of_the_lr_grid_only():
    """debug's rates 0.024 and 0.006: at 4x, 0.096 and 0.024; a condition's own muon_lr 0.01 at 4x is 0.04. A run
    without a multiplier (any other study) keeps the condition's rates as they are."""
    base = base_config(LR_SENSITIVITY, "debug", {})
    runs = {c: run_config(base, o, 0) for c, o in LR_SENSITIVITY.runs() if c.endswith("@4")}
    assert len(runs) == 4 and {(r.train.muon_lr, r.train.adamw_lr) for r in runs.values()} == {(0.024 * 4, 0.006 * 4)}
    own = run_config(base, {"muon_lr": 0.01, "lr_multiplier": 4}, 0).train
    assert (own.muon_lr, own.adamw_lr) == (0.01 * 4, 0.006 * 4)
    assert run_config(base, {"muon_lr": 0.01}, 0).train.muon_lr == 0.01
