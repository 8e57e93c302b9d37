"""A study's runs get their conditions' own fields (over the command line's), and every run a study folder already
holds is compared with the config the study gives it now before anything trains (research.studies.runner)."""
import dataclasses
import json

import pytest

from configs import get_preset
from data.tokenizer import SMOLLM2_GGUF
from research import study
from research.studies import LR_SENSITIVITY, runner
from research.studies.recorded import check_recorded_runs
from research.studies.runner import StudyRun, base_config, run_config
from research.studies.study_file import read_study_file
from tests.helpers import STEP_TOKENS, md_table, stops
from training.errors import RunError
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


EDITED = f"""
name: edited
seeds: [0, 1]
preset: debug
tokens: {STEP_TOKENS}
schedule: cosine
probe_every: 1
conditions:
  A:
  B: {{muon_lr: 0.001}}
"""


@pytest.mark.slow
def test_a_changed_condition_is_refused_before_a_new_seed_trains(corpus_file, cache_dir, tmp_path, capsys,
                                                                 monkeypatch):
    """B trained at muon_lr 0.001 for seeds 0 and 1; the file now gives B 0.002 and lists a new seed 2 first, whose
    runs would train first: the study stops naming B's seed-0 folder and the field, and no run folder is created
    and no file changes."""
    path = tmp_path / "s.yaml"
    path.write_text(EDITED)
    out = tmp_path / "out"
    monkeypatch.setattr(runner, "render_study", lambda *args, **kwargs: [])  # the runs are what is compared
    study.main([str(path), *_args(corpus_file, cache_dir, out)])
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    path.write_text(EDITED.replace("seeds: [0, 1]", "seeds: [2, 0, 1]").replace("0.001", "0.002"))
    assert stops(capsys, study.main, [str(path), *_args(corpus_file, cache_dir, out)]) == (
        f"error: {out / 'B' / 'seed_0'} (condition B, seed 0) was trained with another config: "
        f"train.muon_lr: 0.001 -> 0.002 (recorded -> now). Fix: restore those values, or choose another --out for "
        f"the new config (nothing was trained)")
    assert [sorted(p.name for p in (out / c).iterdir()) for c in ("A", "B")] == [["seed_0", "seed_1"]] * 2
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == before

    # What a resume may change (training.resume) passes; more tokens under a cosine schedule, planned over the
    # total, do not without --replan_schedule (cosine over 1 step, then 2: the rate of step 2 would jump).
    path.write_text(EDITED)
    s = read_study_file(path)
    asked = {"source": "files", "paths": [str(corpus_file)], "precision": "fp32", "eval_batches": 1}
    runs = [StudyRun(c, seed, run_config(base, o, seed), out / c / f"seed_{seed}")
            for base in [base_config(s, "debug", {**asked, "log_every": 3, "ckpt_every": 7, "compile": "on",
                                                  "cache_dir": "x"})]
            for seed in (0, 1) for c, o in s.conditions.items()]
    check_recorded_runs(runs, replan_schedule=False)
    longer = [dataclasses.replace(r, cfg=run_config(base_config(s, "debug", {**asked, "tokens": 2 * STEP_TOKENS}),
                                                    s.conditions[r.cond], r.seed)) for r in runs]
    with pytest.raises(RunError, match=r"changes .*A.seed_0 from 1 to 2 steps.*\(nothing was trained\)$"):
        check_recorded_runs(longer, replan_schedule=False)
    check_recorded_runs(longer, replan_schedule=True)


def test_an_unreadable_recorded_config_is_refused_before_anything_trains(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(EDITED)
    out = tmp_path / "out"
    (out / "B" / "seed_1").mkdir(parents=True)
    (out / "B" / "seed_1" / "config.json").write_text("{not json")
    line = stops(capsys, study.main, [str(path), "--out", str(out), "--precision", "fp32"])
    assert line.startswith(f"error: cannot read config {out / 'B' / 'seed_1' / 'config.json'}: ") and \
        line.endswith("(nothing was trained)"), line
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.name != ".lock") == \
        ["B", "B/seed_1", "B/seed_1/config.json"]


def test_a_run_that_fell_back_offline_is_compared_on_the_data_it_asked_for(tmp_path):
    """An 88m run recorded with the offline fallback (data/offline.py: source english and the GGUF tokenizer in
    place of the Hub's) is the run the same config asks for; a changed n_layers is still named."""
    asked = dataclasses.replace(get_preset("88m"), preset="88m")
    used = dataclasses.replace(asked, data=dataclasses.replace(asked.data, source="english", tokenizer=SMOLLM2_GGUF,
                                                               offline_note="offline: asked for source=hub"))
    run_dir = tmp_path / "QK"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(used.to_dict()))
    check_recorded_runs([StudyRun("QK", 0, asked, run_dir)], replan_schedule=False)
    other = dataclasses.replace(asked, model=dataclasses.replace(asked.model, n_layers=4))
    with pytest.raises(Exception, match=r"model.n_layers: 22 -> 4 \(recorded -> now\)"):
        check_recorded_runs([StudyRun("QK", 0, other, run_dir)], replan_schedule=False)
