"""Studies a researcher writes: the study file, research/study.py end to end, and the 'conditions' kind's decisions."""
import json

import numpy as np
import pytest

from research import qk_norm_25m_study, split_panels, study
from research.analysis.conditions import QUANTITIES, ConditionRuns, analyze, comparisons
from research.analysis.rules import DIFFERENT, EQUAL, INCONCLUSIVE, NO_SPREAD
from research.results import load_results
from research.studies.runner import base_config, check_runs, run_config
from research.studies.study_file import read_study_file
from tests.helpers import STEP_TOKENS, stops
from utils.runtime import resolve_runtime


def write(tmp_path, text: str, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = """
name: my_study
seeds: [0, 1]
baseline: QK
margin: 0.05
preset: debug
tokens: 4096
model: {n_layers: 2}
conditions:
  QK: {qk_norm: learned}
  NoQK: {qk_norm: none, qk_clip: 50}
  plain:
"""


def test_a_study_file_is_read_into_a_study(tmp_path):
    s = read_study_file(write(tmp_path, GOOD))
    assert (s.name, s.kind, s.default_seeds, s.baseline, s.margin, s.loss_margin, s.preset) == \
        ("my_study", "conditions", (0, 1), "QK", 0.05, None, "debug")
    assert (s.primary, s.logit_margin, s.kv_loss_margin) == ((), None, None)
    s = read_study_file(write(tmp_path, GOOD.replace(
        "margin: 0.05", "primary: [val_loss, logit_max]\nlogit_margin: 1\nkv_loss_margin: 0.002")))
    assert (s.primary, s.logit_margin, s.kv_loss_margin) == (("val_loss", "logit_max"), 1.0, 0.002)
    assert s.conditions == {"QK": {"qk_norm": "learned"}, "NoQK": {"qk_norm": "none", "qk_clip": 50.0}, "plain": {}}
    assert s.shared == {"tokens": 4096, "n_layers": 2}  # typed as the fields: qk_clip 50 -> 50.0
    assert read_study_file(write(tmp_path, json.dumps({"name": "j", "seeds": [3], "conditions": {"A": {}}}),
                                 "s.json")).conditions == {"A": {}}


@pytest.mark.parametrize("text, message", [
    (GOOD.replace("tokens: 4096", "tokenz: 4096"),
     "s.yaml: unknown key 'tokenz': not a config field nor a section (model, train, data, probe, name, seeds, "
     "conditions, baseline, primary, margin, loss_margin, logit_margin, kv_loss_margin, preset); did you mean "
     "'tokens'?"),
    (GOOD.replace("{qk_norm: none, qk_clip: 50}", "{qk_norm: none, qk_clp: 50}"),
     "s.yaml: condition NoQK: unknown key 'qk_clp': not a config field nor a section (model, train, data, probe); "
     "did you mean 'qk_clip'?"),
    (GOOD.replace("tokens: 4096", "tokens: many"), "s.yaml: tokens: expected a whole number, found 'many'"),
    (GOOD.replace("  plain:", "  QK: {qk_norm: frozen}"),
     "s.yaml: key 'QK' appears twice in one mapping (line 12): a reader would keep only the last"),
    (GOOD.replace("baseline: QK", "baseline: QK_frozen"),
     "s.yaml: baseline 'QK_frozen' is not one of the conditions (QK, NoQK, plain). Fix: name one of them, or leave "
     "baseline out to compare every pair"),
    ("name: x\nseeds: [0]\nconditions: {}\n", "s.yaml: conditions: expected a mapping of at least one condition"),
    ("name: x\nseeds: [0]\n", "s.yaml: no conditions: a study file names the study, its seeds and its conditions"),
    (GOOD.replace("seeds: [0, 1]", "seeds: [0, 0]"), "s.yaml: seeds: 0 given more than once. Fix: give each seed once"),
    (GOOD.replace("  plain:", "  plain: {seed: 3}"),
     "s.yaml: condition plain: seed cannot be set here: the study's seeds are its `seeds` list"),
    (GOOD.replace("  plain:", "  plain: {preset: tiny}"),
     "s.yaml: condition plain: preset cannot be set per condition"),
    (GOOD.replace("  plain:", "  pl/ain:"), "s.yaml: conditions: condition 'pl/ain' is not a usable name"),
    (GOOD.replace("margin: 0.05", "margin: 5"), "s.yaml: margin 5 must be a share of the mean between 0 and 1"),
    (GOOD.replace("margin: 0.05", "primary: [logit_mx]"),
     "s.yaml: primary: 'logit_mx' is not a quantity of the study (pr_sv, pr_var, key_norm, max_abs, logit_max, "
     "entropy, sink_mass, val_loss, loss, rank90, low_freq_share, kv_loss_4bit, kv_loss_3bit, kv_logit_error_4bit, "
     "kv_loss_<format> of the key-cache formats); did you mean 'logit_max'? Fix: name quantities of that list"),
    (GOOD.replace("margin: 0.05", "primary: []"), "s.yaml: primary: expected a non-empty list of quantity keys"),
    (GOOD.replace("margin: 0.05", "primary: [val_loss, pr_sv, val_loss]"),
     "s.yaml: primary: val_loss named more than once. Fix: name each quantity once"),
    (GOOD.replace("margin: 0.05", "logit_margin: -0.25"),
     "s.yaml: logit_margin -0.25 must be a positive number of logits (e.g. 0.25)"),
    ("[1, 2]", "s.yaml: expected a mapping with name, seeds and conditions"),
    (GOOD.replace("  plain:", "  qk:"), "s.yaml: conditions 'QK' and 'qk' differ only in case: their folders would be "
                                        "one on a case-insensitive filesystem. Fix: rename one of them"),
])
def test_a_bad_study_file_is_one_line_naming_the_file_the_condition_and_the_field(tmp_path, capsys, text, message):
    line = stops(capsys, study.main, [str(write(tmp_path, text)), "--out", str(tmp_path / "out")])
    assert message in line, line
    assert str(tmp_path) in line and not (tmp_path / "out").exists()


TOP_LEVEL = "Fix: set it at the top level, so every condition shares it"


@pytest.mark.parametrize("body, line", [
    ("{tokens: 8192}", "tokens cannot be set per condition: it is the budget: a run trained longer would be compared "
                       f"at the shorter runs' budget, mid-schedule. {TOP_LEVEL}"),
    ("{qk_norm: none, probe: {probe_every: 2}}",  # in its section, too
     f"probe_every cannot be set per condition: the probe measures every condition one way. {TOP_LEVEL}"),
    ("{eval_batches: 4}", f"eval_batches cannot be set per condition: the validation measurement is the study's. "
                          f"{TOP_LEVEL}"),
    ("{precision: bf16}", "precision cannot be set per condition: every value is computed in it, and the study settles "
                          f"one precision for all its runs. {TOP_LEVEL}"),
    ("{seq_len: 16}", "seq_len cannot be set per condition: the text every condition is measured on (corpus, "
                      f"tokenizer, sequence length, validation split) is the study's. {TOP_LEVEL}"),
    ("{batch_size: 4}", "batch_size cannot be set per condition: it also sizes the validation set (eval_batches x "
                        "batch_size sequences); a condition of another batch per optimizer step sets grad_accum. "
                        f"{TOP_LEVEL}"),
])
def test_a_condition_cannot_set_the_budget_or_the_measurement(tmp_path, capsys, body, line):
    """Refused as the file is read, before any config is built or anything trains: one line naming the file, the
    condition, the field, why and the fix."""
    path = write(tmp_path, GOOD.replace("  plain:", f"  plain: {body}"))
    assert stops(capsys, study.main, [str(path), "--out", str(tmp_path / "out")]) == \
        f"error: {path}: condition plain: {line}"
    assert not (tmp_path / "out").exists()


def test_a_training_field_is_a_condition_and_grad_accum_one_at_the_same_tokens(tmp_path):
    """muon_lr, the schedule and grad_accum differ between conditions. debug: 8 x 32 = 256 tokens per step, 4,096
    tokens = 16 steps; grad_accum 2: 512 per step, 8 steps, the same 4,096 tokens: no refusal."""
    s = read_study_file(write(tmp_path, GOOD.replace("  plain:", "  plain: {muon_lr: 0.05, schedule: cosine, "
                                                                 "grad_accum: 2}")))
    assert s.conditions["plain"] == {"muon_lr": 0.05, "schedule": "cosine", "grad_accum": 2}
    base = base_config(s, "debug", {})
    check_runs(s, base, 0, resolve_runtime("cpu", "fp32"))
    assert [run_config(base, o, 0).steps for o in s.conditions.values()] == [16, 16, 8]


def test_a_model_field_is_a_condition_rope_fraction_included(tmp_path):
    """rope_fraction 0.25 of debug's d_head 64: 8 of its 32 rotary pairs rotate in that condition's runs alone."""
    from models import MinimalLLM
    s = read_study_file(write(tmp_path, GOOD.replace("  plain:", "  partial: {rope_fraction: 0.25}")))
    assert s.conditions["partial"] == {"rope_fraction": 0.25}
    base = base_config(s, "debug", {})
    models = {name: run_config(base, o, 0).model for name, o in s.conditions.items()}
    assert {name: m.rope_fraction for name, m in models.items()} == {"QK": 1.0, "NoQK": 1.0, "partial": 0.25}
    assert MinimalLLM(models["partial"]).rotary.n_rotated == 8


def test_a_condition_that_trains_other_tokens_is_refused_before_anything_trains(tmp_path, capsys):
    """grad_accum 3: 3 x 256 = 768 tokens per step, 4,096 // 768 = 5 steps = 3,840 tokens, not QK's 4,096 (16 x
    256). A multiple of lcm(256, 768) = 768 gives both the same; the largest up to 4,096 is 5 x 768 = 3,840."""
    path = write(tmp_path, GOOD.replace("  plain:", "  plain: {grad_accum: 3}"))
    assert stops(capsys, study.main, [str(path), "--out", str(tmp_path / "out")]) == (
        f"error: {path}: condition plain: grad_accum=3 trains 3,840 tokens (5 steps of 768), condition QK 4,096 tokens "
        f"(16 steps of 256): every condition must train the same tokens, or all are compared at the shortest run's "
        f"budget, the others mid-schedule. Fix: give tokens as a multiple of 768 (e.g. 3,840) (nothing was trained)")
    assert not (tmp_path / "out").exists()


def test_a_condition_that_cannot_build_is_refused_before_anything_trains(tmp_path, capsys):
    text = GOOD.replace("  plain:", "  plain: {n_heads: 3}")  # debug's d_model 128 is not divisible by 3
    line = stops(capsys, study.main, [str(write(tmp_path, text)), "--out", str(tmp_path / "out")])
    assert line == (f"error: {tmp_path / 's.yaml'}: condition plain: d_model=128 is not divisible by n_heads=3: pick "
                    f"n_heads so that d_model / n_heads is a whole head size (e.g. 64) (nothing was trained)")
    assert not (tmp_path / "out").exists()


def test_no_study_file_and_the_help(capsys):
    assert "no study file: python research/study.py STUDY_FILE" in stops(capsys, study.main, ["--seeds", "0"])
    study.main(["--help"])
    assert "conditions:                  # condition name -> the config fields" in capsys.readouterr().out


def test_an_out_holding_another_study_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    index = {"study": "qk_norm_50m_study", "kind": "qk_norm", "seeds": [0], "conditions": {"QK": ["QK/results.json"]}}
    (out / "study.json").write_text(json.dumps(index))
    line = stops(capsys, study.main, [str(write(tmp_path, GOOD)), "--out", str(out)])
    assert "belongs to the study 'qk_norm_50m_study' (kind qk_norm), by its study.json" in line
    assert sorted(p.name for p in out.iterdir()) == ["study.json"] and json.loads((out / "study.json").read_text()) \
        == index


def _args(corpus_file, cache_dir):
    return ["--source", "files", "--paths", str(corpus_file), "--cache_dir", str(cache_dir), "--precision", "fp32",
            "--eval_batches", "2", "--no_progress"]


def _untimed(value):
    """A results dict without what the clock measured (provenance, *time_s) and so differs between two runs."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k != "provenance" and not k.endswith("time_s")}
    return [_untimed(v) for v in value] if isinstance(value, list) else value


@pytest.mark.slow
def test_the_qk_norm_study_as_a_file_gives_the_same_results(corpus_file, cache_dir, tmp_path, capsys):
    """The write-ups' three conditions written as a study file train the same runs as qk_norm_25m_study.py for the
    same preset, tokens, probe interval and seed: every field of results.json but the provenance and the clock."""
    path = write(tmp_path, f"""
name: qk_as_a_file
seeds: [0]
preset: debug
tokens: {4 * STEP_TOKENS}
probe_every: 2
conditions:
  QK: {{qk_norm: learned}}
  QK_frozen: {{qk_norm: frozen}}
  NoQK: {{qk_norm: none}}
""")
    study.main([str(path), "--out", str(tmp_path / "file"), *_args(corpus_file, cache_dir)])
    qk_norm_25m_study.main(["--preset", "debug", "--tokens", str(4 * STEP_TOKENS), "--probe_every", "2", "--seeds",
                            "0", "--out", str(tmp_path / "script"), *_args(corpus_file, cache_dir)])
    for cond in ("QK", "QK_frozen", "NoQK"):
        a, b = (load_results(tmp_path / where / cond / "results.json") for where in ("file", "script"))
        assert a["loss"] and a["probes"][-1]["layers"][0]["means"]["k_norm.pr_sv"] > 0
        assert _untimed(a) == _untimed(b), cond
    out = tmp_path / "file"
    names = {p.name for p in out.iterdir()}
    assert {"trajectories.png", "per_layer.png", "comparisons.png", "report.md", "combined.json", "study.json"} <= names
    report = (out / "report.md").read_text()
    # 9 as before, and the key cache's two every probe records (rank90, low_freq_share); without --kv_cache no
    # run holds the quantized-key losses, so they are not compared
    assert "The study compares every pair of conditions in 11 quantities" in report
    assert "| QK_frozen | 0 | qk_norm=frozen |" in report
    combined = json.loads((out / "combined.json").read_text())
    assert set(combined["decisions"]) == {q.key for q in QUANTITIES} | {"rank90", "low_freq_share"}
    assert set(combined["decisions"]["pr_sv"]) == {"QK-QK_frozen", "QK-NoQK", "QK_frozen-NoQK"}
    assert combined["decisions"]["pr_sv"]["QK-NoQK"]["outcome"] == "descriptive"  # one seed: no test
    before = report
    (out / "report.md").unlink()
    split_panels.main([str(out)])  # redrawn from the results alone, byte for byte
    assert (out / "report.md").read_text() == before


# ----------------------------------------------------------------------------- the decisions, known by hand

def _run(seed: int, pr: float, loss: float) -> dict:
    layer = {"layer": 0, "means": {"k_norm.pr_sv": pr, "k_norm.pr_var": pr / 2, "k_norm.norm_mean": 8.0,
                                   "k_norm.max_abs": 2.0, "attn.logit_max": 5.0, "attn.entropy": 1.0,
                                   "attn.sink_mass": 0.2}}
    return {"seed": seed, "tokens": [0, 1000], "loss": [5.0, loss], "val_loss": [5.0, loss],
            "probes": [{"tokens": 0, "layers": [layer]}, {"tokens": 1000, "layers": [layer]}]}


def test_each_condition_against_the_baseline_in_one_family_per_quantity():
    assert comparisons(["A", "B", "C"], None) == [("A", "B"), ("A", "C"), ("B", "C")]
    assert comparisons(["A", "B", "C"], "B") == [("A", "B"), ("C", "B")]
    runs = {"base": [_run(s, 30.0, 4.0) for s in (0, 1, 2)],
            "up": [_run(s, 30.0 + d, 4.0) for s, d in zip((0, 1, 2), (1.0, 2.0, 3.0))],
            "same": [_run(s, 30.0 + (0.0, 0.1, -0.1)[s], 4.0) for s in (0, 1, 2)]}
    a = analyze(ConditionRuns(runs, "base"), margin=0.03, loss_margin=0.005)
    d = a.decisions["pr_sv"][("up", "base")]
    # key PR is decided on log ratios: ln(31/30), ln(32/30), ln(33/30), mean 0.064213, sd 0.031261 (the differences
    # 1, 2, 3 have mean 2); two comparisons in the family, so the interval is at 1 - 0.05/2 = 97.5%: t(2 dof,
    # 0.9875) = 6.2053, half width 6.2053 x 0.031261 / sqrt(3) = 0.111999
    assert (d.n, d.diff, d.ci_level) == (3, 2.0, 0.975) and d.sd == pytest.approx(0.031261, abs=1e-6)
    assert d.ci == pytest.approx((0.064213 - 0.111999, 0.064213 + 0.111999), abs=1e-6)
    assert d.outcome == INCONCLUSIVE  # 0 in it, past ln(1.015/0.985) = 0.0300
    same = a.decisions["pr_sv"][("same", "base")]  # ln(1), ln(30.1/30), ln(29.9/30): [-0.0119, +0.0119] inside
    assert same.diff == pytest.approx(0.0) and same.sd == pytest.approx(0.0033333, abs=1e-6) and same.outcome == EQUAL
    assert a.decisions["val_loss"][("up", "base")].outcome == NO_SPREAD  # 4.0 in every run: no interval to read
    assert a.summary["pr_sv"]["up"]["mean"] == pytest.approx(32.0) and a.summary["pr_sv"]["up"]["n"] == 3
    far = {"base": runs["base"], "up": [_run(s, 40.0 + 0.1 * s, 4.0) for s in (0, 1, 2)]}
    assert analyze(ConditionRuns(far, None), 0.03, 0.005).decisions["pr_sv"][("base", "up")].outcome == DIFFERENT
    assert np.isclose(a.budget_tokens, 1000)


def test_in_short_says_each_outcome_and_no_more():
    """Differences 0.8-1.4 (mean 1.1) on values near 30.5, two comparisons in the family. Key PR is decided on log
    ratios: ln(31/30), ln(31.2/30), ln(31.4/30), ln(30.8/30), mean 0.035985, sd 0.008302, so the 97.5% interval
    0.035985 +- t(3, 0.9875) 4.1765 x 0.008302 / 2 = [0.018647, 0.053322], a ratio of +3.7% [+1.9%, +5.5%], excludes
    0 but reaches inside the margin ln(1.015/0.985) = 0.0300: real, its size unresolved. The key norms are 8.0 in
    every run: no spread, not "within the margin"."""
    from research.plots.conditions import in_short
    seeds = (0, 1, 2, 3)
    runs = {"base": [_run(s, 30.0, 4.0) for s in seeds],
            "up": [_run(s, 30.0 + d, 4.0) for s, d in zip(seeds, (1.0, 1.2, 1.4, 0.8))],
            "same": [_run(s, 30.0 + (0.0, 0.1, -0.1, 0.0)[s], 4.0) for s in seeds]}
    up = next(line for line in in_short(analyze(ConditionRuns(runs, "base"), 0.03, 0.005))
              if line.startswith("- up − base: "))
    assert up.startswith("- up − base: **differs, by a size the margin does not settle**\u2021, in key PR (pr_sv) "
                         "ratio up/base +3.7% [+1.9%, +5.5%]; centered key PR (pr_var) ratio up/base +3.7% [+1.9%, "
                         "+5.5%], and **shows no spread** in key norm ratio up/base +0.0% (mean difference +0.000); ")
    # pr_var is pr_sv/2: the same ratio; margins and mean differences stand in the tables
    assert "lies within the margin" not in up and "differs beyond the margin" not in up


def _synthetic_study(folder, **index) -> None:
    """QK and NoQK over seeds 0-2 (synthetic runs: the largest logit 8.2 and 8.4 +- 0.1), indexed as the runner
    indexes a study file's folder."""
    from research.results import save_results
    from research.results.layout import condition_dir, write_study_index
    from research.simulations.conditions import TRUTH, synthetic_run
    paths = {}
    for cond, logit in (("QK", 8.2), ("NoQK", 8.4)):
        for s in range(3):
            spread = (0.0, 0.1, -0.1)[s] * (1 if cond == "QK" else 2)
            run_dir = condition_dir(folder, cond, s, several_seeds=True)
            save_results(run_dir / "results.json", synthetic_run(cond, s, {
                **{k: v + spread for k, v in TRUTH.items()}, "logit_max": logit + spread}))
            paths.setdefault(cond, []).append(str((run_dir / "results.json").relative_to(folder)))
    write_study_index(folder, name="syn", kind="conditions", seeds=[0, 1, 2], preset="tiny", conditions=paths,
                      margin=0.03, loss_margin=0.005, baseline="QK", **index)


def test_a_study_folder_keeps_its_primary_quantities_and_logit_margin(tmp_path, capsys):
    """study.json records what the study file named, and split_panels redraws the report from it byte for byte.
    NoQK - QK in the largest logit is 0.2 + 0.1 x (0, 1, -1) per seed: sd 0.1, a family of one comparison, so
    +0.2 +- t(2, 0.975) 4.3027 x 0.1 / sqrt(3) = [-0.05, +0.45], 0.2 / 8.2 = +2.4% of QK; inside the study's
    margin of 1 logit (the default 0.25 would leave it inconclusive)."""
    folder = tmp_path / "study"
    _synthetic_study(folder, primary=("logit_max",), logit_margin=1.0, kv_loss_margin=0.002)
    index = json.loads((folder / "study.json").read_text())
    assert (index["primary"], index["logit_margin"], index["kv_loss_margin"]) == (["logit_max"], 1.0, 0.002)
    split_panels.main([str(folder)])
    report = (folder / "report.md").read_text()
    assert "The study's primary quantities (largest attention logit) are read as one family of k = 1" in report
    assert "largest attention logit +0.20 [-0.05, +0.45] logits (+2.4% of QK)" in report  # In short
    assert "| \u00b11.00 logits |" in report  # the study's margin, in the table
    combined = json.loads((folder / "combined.json").read_text())
    assert (combined["primary"], combined["logit_margin"], combined["family_k"]["logit_max"]) == (["logit_max"], 1.0, 1)
    assert combined["kv_loss_margin"] == 0.002
    split_panels.main([str(folder), "--out", str(tmp_path / "again")])
    assert (tmp_path / "again" / "report.md").read_text() == report


@pytest.mark.parametrize("field, message", [
    ({"primary": ["pr_sv2"]}, "primary: 'pr_sv2' is not a quantity of the study (pr_sv, pr_var, key_norm, max_abs, "
                              "logit_max, entropy, sink_mass, val_loss, loss, rank90, low_freq_share, kv_loss_4bit, "
                              "kv_loss_3bit, kv_logit_error_4bit, kv_loss_<format> of the key-cache formats); did "
                              "you mean 'pr_sv'?"),
    ({"primary": ["pr_sv", "pr_sv"]}, "primary: expected each quantity once, found pr_sv more than once"),
    ({"primary": []}, "primary: expected a non-empty list of quantity keys, found an empty list"),
    ({"logit_margin": 0}, "logit_margin 0 must be a positive number of logits"),
    ({"kv_loss_margin": 1.5}, "kv_loss_margin 1.5 must be a share of the mean between 0 and 1"),
])
def test_a_study_json_with_bad_primary_quantities_or_logit_margin_is_refused(tmp_path, capsys, field, message):
    folder = tmp_path / "study"
    _synthetic_study(folder)
    index = json.loads((folder / "study.json").read_text())
    (folder / "study.json").write_text(json.dumps({**index, **field}))
    line = stops(capsys, split_panels.main, [str(folder)])
    assert f"{folder / 'study.json'}: " in line and message in line, line


def test_the_study_files_the_project_ships_read_and_build():
    """configs/studies/attention_variants.yaml (docs/study_files.md's worked study) reads as its comments say: four
    conditions against QK, three primary quantities, 300k tokens on tiny, and every run's config builds."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[3] / "configs" / "studies" / "attention_variants.yaml"
    s = read_study_file(path)
    assert (list(s.conditions), s.baseline, s.primary) == (["QK", "NoQK", "NoQK_softcap", "QK_gated"], "QK",
                                                           ("logit_max", "val_loss", "pr_sv"))
    assert (s.preset, s.shared["tokens"], s.default_seeds) == ("tiny", 300000, (0, 1, 2, 3))
    base = base_config(s, "tiny", {})
    runs = {c: run_config(base, o, 0) for c, o in s.conditions.items()}
    assert {c: (r.train.tokens, r.model.qk_norm, r.model.attn_softcap, r.model.attn_gate) for c, r in runs.items()} \
        == {"QK": (300000, "learned", 0.0, "none"), "NoQK": (300000, "none", 0.0, "none"),
            "NoQK_softcap": (300000, "none", 15.0, "none"), "QK_gated": (300000, "learned", 0.0, "elementwise")}


def test_the_key_cache_study_file_reads_and_builds():
    """configs/studies/kv_cache.yaml (issue 54's study, docs/study_files.md): four QK-norm conditions against QK,
    the key cache's three primary quantities, 300k tokens on tiny, and `kv_cache: true` at the top level reaching
    every run's probe section (the default is off, so a run without it would have no kv_loss_4bit)."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[3] / "configs" / "studies" / "kv_cache.yaml"
    s = read_study_file(path)
    assert (list(s.conditions), s.baseline, s.primary) == (["QK", "QK_frozen", "NoQK", "QK_full"], "QK",
                                                           ("rank90", "kv_loss_4bit", "low_freq_share"))
    assert (s.preset, s.shared, s.default_seeds) == ("tiny", {"tokens": 300000, "kv_cache": True}, (0, 1, 2, 3))
    base = base_config(s, "tiny", {})
    runs = {c: run_config(base, o, 0) for c, o in s.conditions.items()}
    assert {c: (r.train.tokens, r.model.qk_norm, r.model.qk_norm_scope, r.probe.kv_cache) for c, r in runs.items()} \
        == {"QK": (300000, "learned", "head", True), "QK_frozen": (300000, "frozen", "head", True),
            "NoQK": (300000, "none", "head", True), "QK_full": (300000, "learned", "full", True)}


# ------------------------------------------------------------------ values too large to show
def alias_bomb(levels: int = 8) -> str:
    """YAML of a list whose last item holds 10**levels zeros through shared lists (a few hundred bytes on disk, and
    in memory as PyYAML builds it): its whole repr would need gigabytes."""
    items = ["&l0 [" + ", ".join(["0"] * 10) + "]"]
    items += [f"&l{k} [" + ", ".join([f"*l{k - 1}"] * 10) + "]" for k in range(1, levels + 1)]
    return "[" + ", ".join(items) + "]"


BOMB_SHOWN = "[[0, 0, 0, 0, 0, 0, ...], [[0, 0, 0, 0, 0, 0, ...], "  # the start of its 200 characters


@pytest.mark.parametrize("key, message", [
    ("seeds", f"s.yaml: seeds: expected a non-empty list of whole numbers >= 0, found {BOMB_SHOWN}"),
    ("name", f"s.yaml: name {BOMB_SHOWN}"),
    ("conditions", f"s.yaml: conditions: expected a mapping of at least one condition name to its config fields, "
                   f"found {BOMB_SHOWN}"),
    ("baseline", f"s.yaml: baseline {BOMB_SHOWN}"),
    ("primary", "s.yaml: primary: [0, 0, 0, 0, 0, 0, ...] is not a quantity of the study"),  # its first item
    ("margin", "s.yaml: margin [[0, 0, 0, 0, 0, 0, ...]...], ...], ...] must be a share"),  # in 40 characters
    ("tokens", f"s.yaml: tokens: expected a whole number, found {BOMB_SHOWN}"),
    ("plain", f"s.yaml: condition plain: expected a mapping of config fields (e.g. {{qk_norm: none}}; {{}} for the "
              f"shared config alone), found {BOMB_SHOWN}"),
])
def test_a_huge_value_is_refused_in_one_short_line(tmp_path, capsys, key, message):
    """An alias bomb (10**8 zeros through shared lists) where any value of the study file goes: refused in one line
    that shows at most 200 characters of it, where formatting it whole ran out of memory (issue 50)."""
    text = GOOD.replace("margin: 0.05", "margin: 0.05\nprimary: [val_loss]\n")
    if key == "plain":
        text = text.replace("  plain:", f"  plain: {alias_bomb()}")
    else:
        lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key}:")]
        text = "\n".join(lines + [f"{key}: {alias_bomb()}"] if key != "conditions" else
                         [f"{key}: {alias_bomb()}"] + [ln for ln in lines if not ln.startswith("  ")])
    line = stops(capsys, study.main, [str(write(tmp_path, text)), "--out", str(tmp_path / "out")])
    assert message in line and len(line) < 600, line
    assert not (tmp_path / "out").exists()


def test_a_huge_name_or_key_is_shown_cut(tmp_path, capsys):
    """A condition name of 100,000 letters and an unknown key of as many (JSON: YAML's plain keys stop at 1,024
    characters): each shown in 200 characters, a repr of the quote, 130 letters, '...', 65 letters, the quote."""
    long, cut = "x" * 100_000, f"'{'x' * 130}...{'x' * 65}'"
    study_file = {"name": "s", "seeds": [0], "conditions": {long: {}}}
    line = stops(capsys, study.main, [str(write(tmp_path, json.dumps(study_file), "s.json")), "--out",
                                      str(tmp_path / "out")])
    assert line.endswith(f"s.json: conditions: condition {cut} is not a usable name: a letter, then letters, digits, "
                         f"'_' or '-' (at most 64), since it names a folder. Fix: rename the condition"), line
    study_file = {"name": "s", "seeds": [0], "conditions": {"A": {}}, long: 1}
    line = stops(capsys, study.main, [str(write(tmp_path, json.dumps(study_file), "s.json")), "--out",
                                      str(tmp_path / "out")])
    assert f"s.json: unknown key {cut}: not a config field nor a section" in line, line
    assert not (tmp_path / "out").exists()


def test_yaml_merge_keys_work_in_a_study_file(tmp_path):
    """A condition built on another's fields with `<<: *anchor` (standard YAML, which yaml.safe_load reads) was
    refused as invalid YAML (issue 50): its own fields override the merged ones."""
    text = GOOD.replace("  NoQK: {qk_norm: none, qk_clip: 50}", "  NoQK: &noqk {qk_norm: none, qk_clip: 50}\n"
                                                                  "  NoQK_softcap: {<<: *noqk, qk_clip: 30, "
                                                                  "attn_softcap: 20}")
    s = read_study_file(write(tmp_path, text))
    assert s.conditions == {"QK": {"qk_norm": "learned"}, "NoQK": {"qk_norm": "none", "qk_clip": 50.0},
                            "NoQK_softcap": {"qk_norm": "none", "qk_clip": 30.0, "attn_softcap": 20.0}, "plain": {}}


# ------------------------------------------------------------------ a study too large, a file that is not one
def test_a_study_of_more_runs_than_max_runs_is_refused_before_planning(tmp_path, capsys):
    """200,000 seeds x 2 conditions = 400,000 runs > the default --max_runs 10,000: one line, before any config is
    built; the seeds' repeat check is linear (value.count per seed took hours: 4e10 comparisons) and still names a
    repeat; --max_runs 400000 lets the same study through to its plan (issue 50)."""
    import time
    seeds = list(range(200_000))
    path = write(tmp_path, json.dumps({"name": "big", "seeds": seeds, "preset": "debug",
                                       "conditions": {"A": {}, "B": {"qk_norm": "none"}}}), "big.json")
    start = time.perf_counter()
    assert stops(capsys, study.main, [str(path), "--out", str(tmp_path / "out")]) == (
        f"error: {path}: the study has 400,000 runs (2 conditions x 200,000 seeds), more than --max_runs 10,000. Fix: "
        f"fewer seeds or conditions, or --max_runs 400000 if that many is meant (nothing was written)")
    assert time.perf_counter() - start < 30
    study.main([str(path), "--out", str(tmp_path / "out"), "--max_runs", "400000", "--plan"])
    assert "big: the largest of its 2 runs" in capsys.readouterr().out  # one plan per condition, whatever the seeds
    assert stops(capsys, study.main, [str(path), "--seeds", "0", "1", "2", "--max_runs", "5"]).startswith(
        f"error: {path}: the study has 6 runs (2 conditions x 3 seeds), more than --max_runs 5.")
    path = write(tmp_path, json.dumps({"name": "big", "seeds": seeds + [7, 199_999], "conditions": {"A": {}}}),
                 "twice.json")
    assert stops(capsys, study.main, [str(path)]) == \
        f"error: {path}: seeds: 7, 199999 given more than once. Fix: give each seed once"
    assert not (tmp_path / "out").exists()


def test_a_study_file_that_is_not_a_file_is_refused(tmp_path, capsys):
    """A named pipe blocked the read forever (nothing writes to it); a folder and a device are refused the same way,
    in one line, before anything is read (issue 50)."""
    import os
    fifo = tmp_path / "s.yaml"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a named pipe (FIFO)"), (tmp_path, "a folder"), ("/dev/null", "a character device")):
        assert stops(capsys, study.main, [str(path), "--out", str(tmp_path / "out")]) == (
            f"error: {path}: {kind}, not a file: a study file is read whole before anything trains, and again when "
            f"the same command continues the study. Fix: give the path of a YAML or JSON file")
    assert not (tmp_path / "out").exists()
