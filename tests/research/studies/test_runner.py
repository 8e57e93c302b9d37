"""The study runner end to end on the debug preset, resume, seeds, --help, and split_panels."""
import json
import re
import shutil
import subprocess
import sys

import pytest

from research import qk_norm_25m_study
from research.probing.ablation import MODES
from research.results import load_results
from research.studies import HEAD_SPECIALIZATION, KEY_DYNAMICS, PILOT, QK_NORM
from research.studies.runner import build_parser, run_study
from tests.helpers import REFERENCE, REPO, STEP_TOKENS, hold_lock, md_table, stops, train_rows


def study_args(corpus_file, cache_dir, out, tokens=4 * STEP_TOKENS, *extra):
    return ["--preset", "debug", "--source", "files", "--paths", str(corpus_file), "--cache_dir", str(cache_dir),
            "--precision", "fp32", "--tokens", str(tokens), "--probe_every", "2", "--eval_batches", "2",
            "--no_progress", "--out", str(out), *extra]


@pytest.mark.slow
def test_qk_norm_study_end_to_end_and_resume(corpus_file, cache_dir, tmp_path, capsys):
    out = tmp_path / "study"
    run_study(QK_NORM, study_args(corpus_file, cache_dir, out, 4 * STEP_TOKENS, "--seed", "0"))
    assert re.search(r"preset debug on (cpu|cuda:0) .*precision fp32", capsys.readouterr().out)  # cuda:0 on a GPU
    for name in ("1_loss.png", "2_key_pr_causal.png", "3_per_layer.png", "4_causal_decomposition.png",
                 "5_gamma_cv.png", "6_gain_vs_geometry.png", "report.md", "combined.json", "study.json"):
        assert (out / name).is_file(), name
    runs = {c: load_results(out / c / "results.json") for c in ("QK", "QK_frozen", "NoQK")}
    assert [r["tag"] for r in runs.values()] == ["QK", "QK_frozen", "NoQK"]
    assert [r["config"]["model"]["qk_norm"] for r in runs.values()] == ["learned", "frozen", "none"]
    # Same seed and data order: identical initial weights give identical step-0 probes for QK and QK_frozen.
    assert runs["QK"]["mean_pr"][0] == runs["QK_frozen"]["mean_pr"][0]
    assert runs["QK_frozen"]["gamma_cv"]["0"] == [0.0] * 3 and runs["NoQK"]["gamma_cv"] == {}
    # The learned gain's ablation after the last step; the pre-gain sites only where the gain is learned.
    ablation = runs["QK"]["gain_ablation"]
    assert set(ablation) == {"step", "precision", *MODES} and ablation["step"] == 4
    assert "gain_ablation" not in runs["QK_frozen"] and "gain_ablation" not in runs["NoQK"]
    assert "k_hat.pr_sv" in runs["QK"]["probes"][-1]["layers"][0]["means"]
    assert "k_hat.pr_sv" not in runs["QK_frozen"]["probes"][-1]["layers"][0]["means"]
    # The report is drawn from these files: its table holds each condition's last mean_pr.
    rows = md_table((out / "report.md").read_text(), "condition")
    assert [float(r["final PR (pr_sv)"]) for r in rows] == pytest.approx([r["mean_pr"][-1] for r in runs.values()],
                                                                        abs=0.05)
    combined = json.loads((out / "combined.json").read_text())
    assert combined["summary"]["NoQK"]["final_pr"] == pytest.approx(runs["NoQK"]["mean_pr"][-1])

    # Interrupt: NoQK loses its only checkpoint (killed before it), QK is finished and must be kept as it is.
    qk_before = {f: (out / "QK" / f).read_bytes() for f in ("results.json", "summary.json", "metrics.jsonl")}
    shutil.rmtree(out / "NoQK" / "checkpoints" / "step-000004")
    noqk_full = runs["NoQK"]
    run_study(QK_NORM, study_args(corpus_file, cache_dir, out, 4 * STEP_TOKENS, "--seed", "0"))
    assert {f: (out / "QK" / f).read_bytes() for f in qk_before} == qk_before  # nothing trained, nothing rewritten
    assert json.loads(qk_before["summary.json"])["final_loss"] is not None
    noqk = load_results(out / "NoQK" / "results.json")
    assert noqk["steps"] == noqk_full["steps"] and noqk["loss"] == noqk_full["loss"]
    assert [r[0] for r in train_rows(out / "NoQK")] == [1, 2, 3, 4]  # started again from 0: no step twice


@pytest.mark.slow
def test_seeds_give_one_folder_per_seed(corpus_file, cache_dir, tmp_path):
    out = tmp_path / "pilot"
    run_study(PILOT, study_args(corpus_file, cache_dir, out, 2 * STEP_TOKENS, "--seeds", "0", "1"))
    a = load_results(out / "qk_norm" / "seed_0" / "results.json")
    b = load_results(out / "qk_norm" / "seed_1" / "results.json")
    assert (a["seed"], b["seed"]) == (0, 1) and a["mean_pr"][0] != b["mean_pr"][0]
    combined = json.loads((out / "combined_results.json").read_text())
    assert set(combined) == {"qk_norm", "no_qk_norm"}
    for name in ("panel_a_loss.png", "panel_b_pr_trajectory.png", "panel_c_per_layer.png", "panel_d_delta.png",
                 "layer_pr_heatmap_500k.png", "report.md"):
        assert (out / name).is_file(), name


@pytest.mark.parametrize("study,files", [
    (KEY_DYNAMICS, ["key_analysis_report_QK.png", "key_norm_evolution_QK.png", "key_analysis_report_QK_no_gain_wd.png",
                    "key_norm_evolution_QK_no_gain_wd.png", "report.md"]),
    (HEAD_SPECIALIZATION, ["norm_divergence.png", "entropy_norm_scatter.png", "effective_rank.png",
                           "gamma_heatmap.png", "report.md"]),
])
@pytest.mark.slow
def test_single_condition_studies(study, files, corpus_file, cache_dir, tmp_path):
    out = tmp_path / study.name
    run_study(study, study_args(corpus_file, cache_dir, out, 6 * STEP_TOKENS, "--n_layers", "6"))
    for name in files:
        assert (out / name).is_file(), name
    index = json.loads((out / "study.json").read_text())
    assert index["seeds"] == [0, 1, 2] and index["margin"] == 0.03  # the defaults: three seeds, a 3% margin
    assert all(len(paths) == 3 for paths in index["conditions"].values())


@pytest.mark.slow
def test_split_panels_on_writeup_results_without_torch(tmp_path):
    src, folder = tmp_path / "ref", tmp_path / "figures"
    shutil.copytree(REFERENCE, src)
    before = sorted(p.name for p in src.rglob("*"))
    script = REPO / "research" / "split_panels.py"
    code = (f"import runpy, sys; sys.argv = ['split_panels.py', {str(src)!r}, '--out', {str(folder)!r}]; "
            f"runpy.run_path({str(script)!r}, run_name='__main__'); "
            "assert 'torch' not in sys.modules, 'split_panels imported torch'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("1_loss.png", "2_key_pr_causal.png", "3_per_layer.png", "4_causal_decomposition.png",
                 "5_gamma_cv.png", "report.md"):
        assert (folder / name).stat().st_size > 1000, name
    assert sorted(p.name for p in src.rglob("*")) == before  # --out leaves the study folder untouched
    report = (folder / "report.md").read_text()
    for value in ("65.7", "59.6", "63.3", "3.618", "3.614", "3.683"):
        assert value in report, value


def test_split_panels_names_the_problem(tmp_path, capsys):
    from research.split_panels import main
    assert "no study found" in stops(capsys, main, [str(tmp_path)])
    (tmp_path / "QK").mkdir()
    (tmp_path / "QK" / "results.json").write_text("{ not json")
    assert "QK/results.json: not valid JSON" in stops(capsys, main, [str(tmp_path)])


def test_split_panels_writes_nothing_until_every_file_validates(tmp_path, capsys):
    from research.results import save_results
    from research.split_panels import main
    from tests.research.synthetic import make_results
    for cond, mode in (("QK", "learned"), ("QK_frozen", "frozen"), ("NoQK", "none")):
        save_results(tmp_path / cond / "results.json", make_results(cond, qk_norm=mode))
    main([str(tmp_path)])
    drawn = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p.name != ".lock"}
    assert {"1_loss.png", "report.md", "combined.json"} <= set(drawn)
    bad = json.loads((tmp_path / "NoQK" / "results.json").read_text())
    bad["layer_pr"]["0"][2] = "n/a"  # plotting would crash on it after the first figure
    (tmp_path / "NoQK" / "results.json").write_text(json.dumps(bad))
    assert stops(capsys, main, [str(tmp_path)]) == (
        f"error: {tmp_path / 'NoQK' / 'results.json'}: layer_pr['0'][2] should be a number or null, found 'n/a'. The "
        f"file was damaged or edited: restore it from a copy, or train that condition again")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p.name != ".lock"} == drawn


def test_a_study_folder_in_use_stops_a_second_run(corpus_file, cache_dir, tmp_path, capsys):
    out = tmp_path / "study"
    holder = hold_lock(out)
    try:
        msg = stops(capsys, qk_norm_25m_study.main, study_args(corpus_file, cache_dir, out, 4 * STEP_TOKENS, "--seed",
                                                               "0"))
    finally:
        holder.kill()
        holder.wait()
    assert msg.startswith(f"error: {out} is in use by pid {holder.pid} on ")
    assert [p.name for p in out.iterdir()] == [".lock"]  # nothing else was written


def _help_default(help_text: str, option: str) -> str:
    """The 'default: X' an option's help shows (argparse may wrap it onto the next line)."""
    flat = " ".join(help_text.split())
    return flat.split(f"{option} ", 1)[1].split("Default: ", 1)[1].split(" --", 1)[0].strip()


def test_help_shows_the_defaults_a_user_gets(capsys):
    import train_llm
    assert _help_default(train_llm.build_parser(["--preset", "88m"]).format_help(), "--n_layers N") == "22"
    assert _help_default(train_llm.build_parser([]).format_help(), "--n_layers N") == "6"
    pilot = build_parser(PILOT, argv=["--device", "cpu"]).format_help()
    assert "Defaults below are those of the tiny preset" in pilot
    assert _help_default(pilot, "--tokens N") == "500000"  # the pilot's own token count on tiny
    assert _help_default(pilot, "--probe_every N") == "steps // 20 (12 with these defaults)"
    qk = build_parser(QK_NORM, argv=["--preset", "88m"]).format_help()
    assert _help_default(qk, "--tokens N") == "8000000" and _help_default(qk, "--d_model N") == "512"


def test_margins_are_checked_and_recorded(corpus_file, cache_dir, tmp_path, capsys):
    assert "--margin 3.0 must be a share of the mean" in stops(
        capsys, qk_norm_25m_study.main, study_args(corpus_file, cache_dir, tmp_path / "x", 4 * STEP_TOKENS, "--margin",
                                                   "3"))
    from research.split_panels import main
    assert "--loss_margin 0.0 must be" in stops(capsys, main, [str(tmp_path), "--loss_margin", "0"])


@pytest.mark.slow
def test_lr_study_records_a_divergence_and_goes_on_and_resumes(corpus_file, cache_dir, tmp_path, monkeypatch, capsys):
    """The learning-rate grid on the debug preset; the 64x runs of NoQK are made to diverge at step 2 (a
    non-finite loss is injected), which must be recorded, not raised, and kept on a second run."""
    from research.studies import LR_SENSITIVITY
    from training.trainer import Trainer
    real_step = Trainer.train_step

    def step(self):
        if self.cfg.model.qk_norm == "none" and not self.cfg.train.qk_clip and self.cfg.train.muon_lr > 1 \
                and self.step == 1:
            self._fail_non_finite(float("nan"), float("nan"))
        return real_step(self)
    monkeypatch.setattr(Trainer, "train_step", step)
    out = tmp_path / "lr"
    args = study_args(corpus_file, cache_dir, out, 4 * STEP_TOKENS, "--seeds", "0", "1", "--lr_multipliers", "1", "64")
    run_study(LR_SENSITIVITY, args)
    noqk = load_results(out / "NoQK" / "lr_64" / "seed_0" / "results.json")
    assert noqk["diverged"] == {"step": 2} and noqk["steps"] == [0]
    assert "diverged" not in load_results(out / "NoQK_clip" / "lr_64" / "seed_0" / "results.json")
    qk = load_results(out / "QK" / "lr_64" / "seed_1" / "results.json")
    assert qk["config"]["train"]["muon_lr"] == pytest.approx(64 * 0.024) and qk["init_val_loss"] > 0
    index = json.loads((out / "study.json").read_text())
    assert sorted(index["conditions"]) == sorted(f"{c}@{m}" for c in ("QK", "QK_frozen", "NoQK", "NoQK_clip")
                                                 for m in ("1", "64"))
    report = (out / "report.md").read_text()
    assert "| no QK-norm | 64x | n/a | 2/2 |" in report
    for name in ("lr_final_loss.png", "lr_max_logit.png", "lr_sensitivity.png", "lr_keys.png"):
        assert (out / name).is_file(), name
    capsys.readouterr()
    run_study(LR_SENSITIVITY, args)  # again: every run finished or diverged, nothing is trained
    assert capsys.readouterr().out.count("diverged at step 2 before: kept as it is") == 2


def test_a_study_never_replaces_results_it_did_not_write(corpus_file, cache_dir, tmp_path, capsys):
    """The write-ups' folder holds results.json without config.json: its conditions cannot be continued, so the
    study stops at the first with one message, and every file stays as it was."""
    out = tmp_path / "writeups"
    shutil.copytree(REFERENCE, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    msg = stops(capsys, qk_norm_25m_study.main, study_args(corpus_file, cache_dir, out, 4 * STEP_TOKENS, "--seed", "0"))
    assert msg.startswith("error: in condition QK, seed 0: ") and "results.json" in msg and "(?)" not in msg
    assert "cannot be continued" in msg and "run the same command again" not in msg
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == before


@pytest.mark.parametrize("case", ["metrics only", "another study", "a run", "seeds twice"])
def test_a_study_refuses_what_it_cannot_continue_in_one_line(corpus_file, cache_dir, tmp_path, case, capsys):
    out = tmp_path / "study"
    out.mkdir()
    extra = ("--seed", "0")
    if case == "metrics only":
        (out / "QK").mkdir()
        (out / "QK" / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
        expect = "error: in condition QK, seed 0: "
    elif case == "another study":
        (out / "study.json").write_text(json.dumps({"study": "key_dynamics_study", "kind": "keys", "seeds": [0],
                                                    "preset": "debug", "margin": 0.03, "loss_margin": 0.005,
                                                    "conditions": {"QK": ["QK/results.json"]}}))
        expect = "belongs to the study 'key_dynamics_study' (kind keys), by its study.json"
    elif case == "a run":
        (out / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
        expect = "belongs to a training run (train_llm.py, or a study's condition), by its metrics.jsonl"
    else:
        extra = ("--seeds", "0", "1", "0")
        expect = "names seed(s) 0 more than once"
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert expect in stops(capsys, qk_norm_25m_study.main, study_args(corpus_file, cache_dir, out, 4 * STEP_TOKENS,
                                                                      *extra))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_ctrl_c_in_a_study_says_where_and_exits_130(corpus_file, cache_dir, tmp_path, monkeypatch, capsys):
    from research.studies import runner
    from training.errors import RunInterrupted

    def interrupted(cfg, run_dir, **kwargs):
        raise RunInterrupted(run_dir, 3, 2, True)
    monkeypatch.setattr(runner, "train_run", interrupted)
    err = stops(capsys, qk_norm_25m_study.main, study_args(corpus_file, cache_dir, tmp_path / "s", 4 * STEP_TOKENS,
                                                           "--seed", "0"), code=130)
    assert "interrupted in condition QK, seed 0, at step 3 (its checkpoint at step 2 is kept)" in err
    assert "run the same command again to continue the study" in err


@pytest.mark.slow
@pytest.mark.parametrize("held", ["results.json", "config.json", "another study"])
def test_split_panels_never_draws_into_a_folder_holding_others_results(tmp_path, held, capsys):
    from research.split_panels import main
    target = tmp_path / "target"
    target.mkdir()
    if held == "another study":
        (target / "study.json").write_text(json.dumps({"study": "key_dynamics_study", "kind": "keys", "seeds": [0],
                                                       "preset": "debug", "conditions": {"QK": ["QK/results.json"]}}))
    else:
        (target / held).write_text("{}")
    assert "pass another --out (nothing was written)" in stops(capsys, main, [str(REFERENCE), "--out", str(target)])
    assert sorted(p.name for p in target.iterdir()) == [
        "study.json" if held == "another study" else held]
    main([str(REFERENCE), "--out", str(tmp_path / "redrawn")])  # a folder of its own, drawn twice
    main([str(REFERENCE), "--out", str(tmp_path / "redrawn")])


def test_inspection_never_writes_into_a_run_or_study_folder(tmp_path, capsys):
    from research import inspect_pretrained, pretrained_keys_study
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text("{}")
    assert "by its results.json: inspect_pretrained.py writes only into a folder of its own (inspect)" in stops(
        capsys, inspect_pretrained.main, ["--model", "smollm2-135m", "--out", str(run)])
    assert "by its results.json: pretrained_keys_study.py writes only into a folder of its own" in stops(
        capsys, pretrained_keys_study.main, ["--out", str(run)])
    assert sorted(p.name for p in run.iterdir()) == ["results.json"]
