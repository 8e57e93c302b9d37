"""Key trajectories across saved checkpoints (research/checkpoint_keys_study.py): the step each checkpoint is
read at, the weights hash that names duplicates, and the study end to end on a tiny run of this project trained
for a few steps and exported per step with research/export_hf.py --step, offline; its files redrawn without the
study (--render_only, split_panels) and a damaged results file refused in one line."""
from __future__ import annotations

import json

import pytest
import torch

from research import checkpoint_keys_study as study
from research.studies import checkpoint_keys
from research import export_hf, split_panels
from research.analysis import trajectory as A
from research.export import ExportError, export_run
from research.access import InspectError
from research.access.checkpoints import read_step, step_from_revision, weights_sha256
from research.results import ResultsError
from research.results.trajectory import FILE, load_trajectory
from tests.research.inspection.builders import SENTENCES, make_tokenizer
from tests.helpers import stops

STEPS = (0, 3, 6)  # the checkpoints the tiny run keeps


# ---------------------------------------------------------------- the step of a checkpoint, known by hand

def test_step_from_export_json_comes_before_trainer_state_and_the_folder_name(tmp_path):
    d = tmp_path / "checkpoint-7"
    d.mkdir()
    assert read_step(str(d)) == (7, "folder name checkpoint-7")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": 40, "epoch": 1.0}))
    assert read_step(str(d)) == (40, "trainer_state.json")
    (d / "export.json").write_text(json.dumps({"step": 120, "checkpoint": "step-000120"}))
    assert read_step(str(d)) == (120, "export.json")
    assert read_step(str(tmp_path)) is None  # nothing says: the study asks for --steps


def test_step_from_a_revision_name_is_its_last_number():
    assert step_from_revision("step1000") == 1000
    assert step_from_revision("stage1-step2000") == 2000
    assert step_from_revision("main") is None
    assert step_from_revision("stage1-step11931-tokens50B") == 11931  # OLMo: the token count comes last
    assert step_from_revision("stage2-ingredient1-step23852-tokens100B") == 23852
    assert step_from_revision("global_500") == 500
    assert read_step("EleutherAI/pythia-70m", "step143000") == (143000, "revision name step143000")


def test_a_damaged_step_file_is_named(tmp_path):
    (tmp_path / "export.json").write_text("{\"step\": ")
    with pytest.raises(InspectError, match=r"export\.json cannot be read .*--steps"):
        read_step(str(tmp_path))
    (tmp_path / "export.json").write_text(json.dumps({"step": -3}))
    with pytest.raises(InspectError, match=r"step should be a step .*found -3"):
        read_step(str(tmp_path))


def test_steps_given_override_and_checkpoints_are_sorted_by_step(tmp_path):
    dirs = []
    for name, step in (("late", 50), ("early", 10)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "export.json").write_text(json.dumps({"step": step}))
        dirs.append(str(tmp_path / name))
    args = checkpoint_keys.parse_args(["--checkpoints", *dirs])
    assert [(e["label"], e["step"], e["step_from"]) for e in checkpoint_keys.plan(args)] == [
        ("early", 10, "export.json"), ("late", 50, "export.json")]
    args = checkpoint_keys.parse_args(["--checkpoints", *dirs, "--steps", "50", "10"])  # agreeing with the files
    assert [(e["label"], e["step"], e["step_from"]) for e in checkpoint_keys.plan(args)] == [("early", 10, "--steps"),
                                                                                  ("late", 50, "--steps")]
    bare = []
    for name in ("b1", "b2"):  # nothing recorded: --steps says
        (tmp_path / name).mkdir()
        bare.append(str(tmp_path / name))
    args = checkpoint_keys.parse_args(["--checkpoints", *bare, "--steps", "5", "2"])
    assert [(e["label"], e["step"], e["step_from"]) for e in checkpoint_keys.plan(args)] == [("b2", 2, "--steps"),
                                                                                  ("b1", 5, "--steps")]
    args = checkpoint_keys.parse_args(["--checkpoints", "org/model", "--revisions", "stage1-step2000", "step1000"])
    assert [(e["label"], e["step"], e["revision"]) for e in checkpoint_keys.plan(args)] == [
        ("step1000", 1000, "step1000"), ("stage1-step2000", 2000, "stage1-step2000")]
    args = checkpoint_keys.parse_args(["--checkpoints", "org/model", "--revisions", "main", "step1000"])
    with pytest.raises(InspectError, match=r"no training step found for main .*pass --steps"):
        checkpoint_keys.plan(args)


def test_a_checkpoint_that_is_not_there_is_told_to_check_its_path(tmp_path):
    """A missing folder was told to "pass --steps" (issue 65): its fix is the path."""
    (tmp_path / "checkpoint-100").mkdir()
    missing = str(tmp_path / "runs" / "step-200")
    args = checkpoint_keys.parse_args(["--checkpoints", missing, str(tmp_path / "checkpoint-100")])
    with pytest.raises(InspectError) as e:
        checkpoint_keys.plan(args)
    assert str(e.value) == f"checkpoint {missing!r} not found: no such folder or file. Fix: check the path"
    # a name spelled as a hub id may be one
    args = checkpoint_keys.parse_args(["--checkpoints", str(tmp_path / "checkpoint-100"), "runs/step-200"])
    with pytest.raises(InspectError) as e:
        checkpoint_keys.plan(args)
    assert str(e.value) == ("no training step found for step-200: 'runs/step-200' is no folder or file here, and a "
                            "hub id at its main revision names no step. Fix: check the path, or for a hub model give "
                            "--revisions (e.g. step1000) or --steps")


def test_options_that_cannot_work_are_refused(tmp_path, capsys):
    for argv, msg in ((["--checkpoints", "a"], "2 or more checkpoints"),
                      (["--checkpoints", "a", "b", "--steps", "1"], "--steps gives 1 steps for 2 checkpoints"),
                      (["--checkpoints", "a", "b", "--revisions", "r1", "r2"], "--revisions takes one hub id"),
                      ([], "--checkpoints: give the checkpoints")):
        with pytest.raises(SystemExit):
            checkpoint_keys.parse_args(argv)
        assert msg in capsys.readouterr().err


def test_the_hash_sees_one_changed_value_and_nothing_else():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    assert weights_sha256(a) == weights_sha256(b)
    with torch.no_grad():
        b.bias[1] = torch.nextafter(b.bias[1], torch.tensor(1.0))  # one ulp
    assert weights_sha256(a) != weights_sha256(b)
    assert weights_sha256(a) != weights_sha256(a.double())  # the dtype counts


# ---------------------------------------------------------------- a tiny run, exported per step

def _train_run(run_dir):
    """A debug-preset run folder trained with AdamW on the builders' sentences, a checkpoint kept at each of STEPS."""
    from configs import get_preset
    from configs.files import save_run_config
    from models.llm import MinimalLLM
    from training.checkpoint import save_checkpoint
    cfg = get_preset("debug")
    cfg.model.vocab_size, cfg.model.n_layers, cfg.model.qk_norm = 300, 3, "learned"
    cfg.model.n_heads, cfg.model.n_kv_heads, cfg.model.d_model = 4, 2, 64
    run_dir.mkdir(parents=True)
    save_run_config(cfg, run_dir / "config.json")
    tok = make_tokenizer(run_dir / "tokenizer")
    ids = torch.tensor(tok(" ".join(SENTENCES * 4))["input_ids"][:4 * 24]).view(4, 24)
    torch.manual_seed(0)
    model = MinimalLLM(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(STEPS[-1] + 1):
        if step in STEPS:
            save_checkpoint(run_dir / "checkpoints", step, model, [], {"tokens": step * ids.numel()},
                            keep_last=len(STEPS))
        loss = model(ids[:, :-1], ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return run_dir


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("trajectory")
    run = _train_run(root / "run")
    out = {}
    for step in reversed(STEPS):  # given out of order: the study sorts by step
        assert export_hf.main([str(run), str(root / f"hf-{step}"), "--step", str(step)]) == 0
        out[step] = root / f"hf-{step}"
    assert export_hf.main([str(run), str(root / "hf-3-again"), "--step", "3"]) == 0
    out["again"] = root / "hf-3-again"
    text = root / "text.txt"
    text.write_text(" ".join(SENTENCES * 40))
    return run, out, text


@pytest.mark.slow
def test_export_step_writes_that_checkpoint_and_names_the_steps_held(exports, tmp_path, capsys):
    run, out, _ = exports
    assert [json.loads((out[s] / "export.json").read_text())["step"] for s in STEPS] == list(STEPS)
    with pytest.raises(ExportError, match=r"no complete checkpoint of step 4 \(steps held: 0, 3, 6\)"):
        export_run(run, tmp_path / "x", step=4)
    assert "steps held: 0, 3, 6" in stops(capsys, export_hf.main, [str(run), str(tmp_path / "y"), "--step", "4"])


@pytest.fixture(scope="module")
def measured(exports, tmp_path_factory):
    _, out, text = exports
    dest = tmp_path_factory.mktemp("study") / "out"
    argv = ["--checkpoints", str(out[6]), str(out[3]), str(out[0]), str(out["again"]), "--text", str(text),
            "--batches", "3", "--batch", "2", "--seq_len", "16", "--out", str(dest), "--no_progress"]
    assert study.main(argv) == 0
    return dest


@pytest.mark.slow
def test_the_study_follows_the_steps_and_names_the_duplicate(measured):
    res = load_trajectory(measured / FILE)
    ck = res["checkpoints"]
    assert [c["step"] for c in ck] == [0, 3, 3, 6]
    assert [c["label"] for c in ck] == ["hf-0", "hf-3", "hf-3-again", "hf-6"]
    assert [c["duplicate_of"] for c in ck] == [None, None, "hf-3", None]
    assert ck[1]["sha256"] == ck[2]["sha256"] and len({ck[0]["sha256"], ck[1]["sha256"], ck[3]["sha256"]}) == 3
    assert "batches" not in ck[2] and all(len(c["batches"]) == 3 for c in ck if c["duplicate_of"] is None)
    assert {c["step_from"] for c in ck} == {"export.json"}
    assert res["model"]["n_layers"] == 3 and res["text"]["seq_len"] == 16
    t = A.analyze(res)
    assert t.steps == [0, 3, 6] and t.labels == ["hf-0", "hf-3", "hf-6"]  # the duplicate is no point of a line
    assert t.duplicates == [{"label": "hf-3-again", "step": 3, "duplicate_of": "hf-3", "duplicate_step": 3,
                             "source": ck[2]["source"]}]
    loss = t.series[A.LOSS]["model"][0]
    assert loss[-1] < loss[0]  # the run trained: its loss on its own sentences fell
    assert t.site == "k_norm" and A.GAIN_CV in t.series
    assert {(c.metric, c.group) for c in t.changes} >= {("pr_sv@k_norm", "early"), ("sink_mass", "final"), ("loss",
                                                                                                          "model")}
    report = (measured / "report.md").read_text()
    assert "**hf-3-again** (step 3" in report and "same weights as **hf-3**" in report
    for name in ("key_trajectories.png", "attention_trajectories.png"):
        assert (measured / name).stat().st_size > 1000


def test_a_verdict_never_says_more_than_its_interval():
    from research.analysis.rules import Paired, decide
    flat = decide({"x": Paired.of({0: 10.0, 1: 10.2, 2: 9.9}, {0: 10.0, 1: 10.1, 2: 10.0})}, 0.03)["x"]
    assert flat.outcome == "equal"
    assert A.verdict("pr_sv", "early", "a", "b", flat, 0.03).endswith("unchanged within \u00b13%.")
    down = decide({"x": Paired.of({0: 5.0, 1: 5.1, 2: 4.9}, {0: 10.0, 1: 10.1, 2: 10.0})}, 0.03)["x"]
    text = A.verdict("pr_sv", "early", "a", "b", down, 0.03)
    assert down.outcome == "different, beyond the margin" and "fell, by more than \u00b13%" in text
    assert "10 at a -> 5 at b" in text
    noisy = decide({"x": Paired.of({0: 5.0, 1: 15.0, 2: 10.0}, {0: 10.0, 1: 10.0, 2: 10.0})}, 0.03)["x"]
    text = A.verdict("pr_sv", "early", "a", "b", noisy, 0.03)
    assert noisy.outcome == "inconclusive" and "inconclusive, no change shown" in text and "fell" not in text


@pytest.mark.slow
def test_render_only_and_split_panels_redraw_from_the_json(measured, tmp_path, capsys):
    assert study.main(["--render_only", "--out", str(measured)]) == 0
    split_panels.main([str(measured), "--out", str(tmp_path / "redrawn")])
    for name in ("key_trajectories.png", "attention_trajectories.png", "report.md"):
        assert (tmp_path / "redrawn" / name).is_file(), name
    assert (tmp_path / "redrawn" / "report.md").read_text() == (measured / "report.md").read_text()


@pytest.mark.slow
def test_split_panels_draws_the_study_without_torch_or_training(measured, tmp_path):
    import subprocess
    import sys

    from tests.helpers import REPO
    code = (f"import runpy, sys; sys.argv = ['split_panels.py', {str(measured)!r}, '--out', "
            f"{str(tmp_path / 'o')!r}]; runpy.run_path({str(REPO / 'research' / 'split_panels.py')!r}, "
            f"run_name='__main__'); import research.results.trajectory, research.analysis.trajectory, "
            f"research.plots.trajectory; bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', "
            f"'models', 'training', 'data') or m.startswith('research.probing')); assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "o" / "report.md").is_file()


@pytest.mark.slow
def test_a_damaged_results_file_gives_one_clear_error(measured, tmp_path, capsys):
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(measured, bad)
    res = json.loads((bad / FILE).read_text())
    res["checkpoints"][2]["duplicate_of"] = "hf-9"
    (bad / FILE).write_text(json.dumps(res))
    with pytest.raises(ResultsError, match=r"checkpoints\[2\]\.duplicate_of 'hf-9' should name an earlier measured"):
        load_trajectory(bad / FILE)
    res["checkpoints"][2]["duplicate_of"] = "hf-3"
    res["checkpoints"][3]["batches"][1]["keys"]["k_norm"]["pr_sv"] = [[1.0]]
    (bad / FILE).write_text(json.dumps(res))
    err = stops(capsys, study.main, ["--render_only", "--out", str(bad)])
    assert r"checkpoints[3].batches[1].keys.k_norm.pr_sv should be 3 lists" in err and "run research/" in err
    (bad / FILE).write_text("{\"schema\": ")
    assert "not readable JSON" in stops(capsys, split_panels.main, [str(bad)])


@pytest.mark.slow
def test_checkpoints_of_another_architecture_or_a_run_folder_are_refused(exports, tmp_path, capsys):
    from tests.research.inspection.builders import make_hf_model
    run, out, text = exports
    other = make_hf_model("llama", tmp_path / "llama")
    argv = ["--checkpoints", str(out[0]), str(other), "--steps", "0", "1", "--text", str(text), "--batches", "2",
            "--batch", "2", "--seq_len", "16", "--out", str(tmp_path / "o"), "--no_progress"]
    assert "is not the architecture of hf-0" in stops(capsys, study.main, argv)
    assert not (tmp_path / "o" / FILE).exists()
    with pytest.raises(SystemExit):
        checkpoint_keys.parse_args(["--checkpoints", str(run), str(out[0])])
    assert "export the steps to follow first" in capsys.readouterr().err
