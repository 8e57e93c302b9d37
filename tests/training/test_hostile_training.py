"""What a careless or hostile user does to a run folder, its data and its checkpoints: stray run files in
--out, a corpus edited between a run and its resume, wrong-typed values in state.json, Ctrl-C, a divergence,
a probe asking for more validation blocks than there are. Each case stops with one message naming the
problem and the fix (no traceback), or, where the run can go on, ends like the uninterrupted run
(conftest.straight_run)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import train_llm
from tests.helpers import REPO, STEP_TOKENS, assert_same_run, build_trainer, cli_args
from training.errors import NonFiniteLossError, RunInterrupted
from utils.errors import UserError
from training.run_files import RunFolder
from utils.testhook import DIR_ENV, ENV




def snapshot(out) -> dict:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
            and p.name != ".lock"}


# ------------------------------------------------------------------ (a) what counts as a run
def _complete_checkpoint(folder, step):
    d = folder / "checkpoints" / f"step-{step:06d}"
    d.mkdir(parents=True)
    for name in ("model.safetensors", "optim.pt", "state.json"):
        (d / name).write_text("x")


@pytest.mark.parametrize("layout,contents,resumable", [
    ({}, [], False),
    ({"results.json": "{}"}, ["results.json"], False),
    ({"metrics.jsonl": ""}, ["metrics.jsonl"], False),
    ({"summary.json": "{}"}, ["summary.json"], False),
    ({"tokenizer/tokenizer.json": "{}"}, ["tokenizer/"], False),
    ({"tensorboard/events": ""}, ["tensorboard/"], False),
    ({"checkpoints/step-000002/state.json": "{}"}, ["checkpoints/step-000002"], False),  # incomplete
    ({"checkpoints/step-000004.unreadable/state.json": "{}"}, ["checkpoints/step-000004.unreadable"], False),
    ({"config.json": "{}", "results.json": "{}"}, ["config.json", "results.json"], True),
    ({"notes.txt": "mine", ".lock": "", "checkpoints/keep-me": "x"}, [], False),  # not a run's
])
def test_every_file_a_run_writes_counts(tmp_path, layout, contents, resumable):
    for name, text in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    folder = RunFolder(tmp_path)
    assert folder.contents() == contents
    assert folder.holds_run() == bool(contents) and folder.resumable() == resumable
    _complete_checkpoint(tmp_path, 6)
    assert folder.resumable() and "checkpoints/step-000006" in folder.contents()


def test_a_folder_with_only_results_json_is_never_replaced(args, tmp_path, capsys, fails):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"steps": [0, 2, 4, 6]}))  # another run's probes
    before = snapshot(out)
    for extra in ((), ("--resume",)):
        msg = fails(args(2, *extra))
        assert f"{out} holds files of a run (results.json) but nothing to continue from" in msg
        assert "cannot be continued: move them away or choose another --out (nothing was overwritten)" in msg
        assert snapshot(out) == before


def test_run_files_without_config_or_checkpoint_get_one_message_with_or_without_resume(args, tmp_path, capsys, fails):
    """Defect 18: metrics alone were told 'pass --resume' without it and 'drop --resume' with it."""
    out = tmp_path / "run"
    train_llm.main(args(2, "--ckpt_every", "0", "--probe_every", "0"))
    shutil.rmtree(out / "checkpoints")
    (out / "config.json").unlink()
    before = snapshot(out)
    first, second = fails(args(2)), fails(args(2, "--resume"))
    assert first == second
    assert "metrics.jsonl" in first and "summary.json" in first and "tokenizer/" in first
    assert "cannot be continued" in first and "--resume" not in first
    assert snapshot(out) == before


def test_a_resumable_folder_without_resume_is_told_to_pass_it(args, tmp_path, capsys, fails):
    out = tmp_path / "run"
    train_llm.main(args(2))
    msg = fails(args(2))
    assert f"{out} already holds a run (config.json," in msg and "pass --resume to continue it" in msg


# ------------------------------------------------------------------ (b) the data of a resume
def _edit_words(path, n=3):
    text = path.read_text()
    for old in ("import", "return", "def")[:n]:
        text = text.replace(old, old.upper(), 1)
    path.write_text(text)


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["three words", "fewer blocks"])
def test_a_resume_on_changed_data_is_refused_before_the_checkpoints_are_tried(edit, corpus_file, tmp_path, capsys,
                                                                           fails):
    corpus = tmp_path / "corpus.txt"
    shutil.copy(corpus_file, corpus)
    argv = lambda steps, *extra: cli_args(corpus, tmp_path / "cache", tmp_path / "run", steps, *extra)  # noqa: E731
    out = tmp_path / "run"
    train_llm.main(argv(4))
    original = corpus.read_bytes()
    if edit == "three words":
        _edit_words(corpus)
    else:
        corpus.write_bytes(original[: len(original) * 2 // 3])
    before = snapshot(out)
    msg = fails(argv(6, "--resume"))
    assert f"cannot resume {out}: its data changed since step-000004 (step 4)" in msg and "corpus hash" in msg
    assert "tokenizer hash" in msg  # the BPE is trained on the corpus
    # the shipped corpus (tests/conftest.py, the same on every Python) makes 1,522 blocks of 33 tokens with the
    # debug preset's 512-token BPE: 2% (val_frac 0.02) is 30 validation blocks, the other 1,492 train
    assert edit == "three words" or "train blocks 1492 -> " in msg
    assert "Fix: restore the original data (the checkpoints are fine), or train the new data in another --out" \
        in msg and "Restore them" not in msg
    assert snapshot(out) == before and not (out / "checkpoints" / "step-000004.unreadable").exists()
    corpus.write_bytes(original)
    train_llm.main(argv(6, "--resume"))  # the original data: the run goes on
    assert json.loads((out / "summary.json").read_text())["steps"] == 6


def test_checkpoints_without_a_data_record_still_resume_and_are_checked_by_block_count(args, tmp_path,
                                                                                      straight_run, capsys, fails):
    out = tmp_path / "run"
    train_llm.main(args(4))
    paths = [out / "checkpoints" / f"step-{step:06d}" / "state.json" for step in (2, 4)]
    states = [json.loads(p.read_text()) for p in paths]
    for state in states:  # as written before checkpoints recorded their data
        del state["data"]
    n = states[0]["loader"]["n_blocks"]
    for p, state in zip(paths, states):  # what the older checkpoints of other data say
        p.write_text(json.dumps({**state, "loader": {**state["loader"], "n_blocks": n + 1}}))
    msg = fails(args(6, "--resume"))
    assert "its data changed" in msg and f"train blocks {n + 1} -> {n}" in msg and "Restore them" not in msg
    for p, state in zip(paths, states):
        p.write_text(json.dumps(state))
    capsys.readouterr()
    train_llm.main(args(6, "--resume"))
    assert f"continuing from {out / 'checkpoints' / 'step-000004'} (step 4)" in capsys.readouterr().out
    assert_same_run(straight_run, out, 6)


# ------------------------------------------------------------------ (c) wrong-typed values in state.json
def _set(state: dict, path: str, value) -> None:
    *parents, key = path.split(".")
    for p in parents:
        state = state[p]
    state[key] = value


@pytest.mark.parametrize("field,value", [
    ("wall_time", "abc"),
    ("tokens", "x"),
    ("loader.position", "3"),
    ("callbacks.probe.recent_losses", 5),
    ("callbacks.probe.last_probe_step", "2"),
])
def test_a_wrong_typed_state_makes_its_checkpoint_unreadable(field, value, args, tmp_path, straight_run, capsys):
    out = tmp_path / "run"
    train_llm.main(args(4))
    path = out / "checkpoints" / "step-000004" / "state.json"
    state = json.loads(path.read_text())
    _set(state, field, value)
    path.write_text(json.dumps(state))
    capsys.readouterr()
    train_llm.main(args(6, "--resume"))
    log = capsys.readouterr().out
    assert f"checkpoint {out / 'checkpoints' / 'step-000004'} cannot be loaded" in log
    assert f"continuing from {out / 'checkpoints' / 'step-000002'} (step 2)" in log
    assert (out / "checkpoints" / "step-000004.unreadable" / "state.json").exists()
    assert_same_run(straight_run, out, 6)


def test_the_loader_refuses_a_wrong_typed_state():
    from data import BlockLoader
    loader = BlockLoader(torch.zeros(10, 5, dtype=torch.int32), 2, seed=0)
    for bad in (5, {"epoch": 0, "position": "1", "seed": 0}, {"epoch": 0, "position": 1, "seed": 0.5},
                {"epoch": True, "position": 1, "seed": 0}, {"position": 1, "seed": 0}):
        with pytest.raises((TypeError, ValueError)):
            loader.load_state_dict(bad)
    assert (loader.epoch, loader.position, loader.seed) == (0, 0, 0)  # nothing changed


@pytest.mark.parametrize("field,value,words", [
    ("step", -1, "step should be a step (a whole number >= 0), found -1"),
    ("tokens", "x", "tokens should be a whole number >= 0, found 'x'"),
    ("wall_time", float("nan"), "wall_time should be a number of seconds, found nan"),
    ("loader", 3, "loader should be an object, found 3"),
    ("callbacks", {"probe": 5}, "callbacks['probe'] should be an object, found 5"),
])
def test_state_json_is_checked_against_its_declaration(field, value, words):
    from training.checkpoint import check_state
    with pytest.raises(ValueError, match=re.escape(words)):
        check_state({"step": 4, "loader": {}, field: value})
    with pytest.raises(ValueError, match="not a checkpoint state"):
        check_state({"step": 4})


def test_a_broken_config_json_is_named_with_its_field(args, tmp_path, capsys, fails):
    out = tmp_path / "run"
    train_llm.main(args(1, "--ckpt_every", "0"))  # its only checkpoint is written after the last step
    shutil.rmtree(out / "checkpoints")
    cfg = json.loads((out / "config.json").read_text())
    cfg["model"]["d_model"] = "128"
    (out / "config.json").write_text(json.dumps(cfg))
    msg = fails(args(2, "--resume"))
    assert f"{out / 'config.json'}: [model] d_model: expected a whole number, found '128'; fix or restore " \
           f"config.json" in msg


# ------------------------------------------------------------------ (e) Ctrl-C
@pytest.mark.slow
def test_ctrl_c_says_the_step_and_how_to_continue(args, tmp_path, straight_run, capsys):
    out, hook_dir = tmp_path / "run", tmp_path / "hook"
    hook_dir.mkdir()
    argv = args(6)
    env = {**os.environ, ENV: "pause:step:3", DIR_ENV: str(hook_dir), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    # SIGINT as a terminal delivers it: a shell's background job (CI) would hand the child SIGINT ignored
    proc = subprocess.Popen([sys.executable, str(REPO / "train_llm.py"), *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while not (hook_dir / "paused").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends, after step 3 (the checkpoint of step 2 is written)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert err.count("\n") == 1 and "Traceback" not in err, err[-3000:]
    assert err.startswith("interrupted at step 3; nothing is lost up to the last checkpoint (step 2)")
    assert err.strip().endswith(f"continue with: python train_llm.py {' '.join(argv)} --resume")
    train_llm.main(argv + ["--resume"])
    assert_same_run(straight_run, out, 6)


def test_ctrl_c_while_preparing_the_data_says_so(args, tmp_path, capsys, monkeypatch):
    import training.run

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(training.run, "prepare_data", interrupted)
    try:
        with pytest.raises(SystemExit) as stop:
            train_llm.main(args(2))
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt reached the caller")
    assert stop.value.code == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted while preparing the data, before training began")
    assert "run the same command again: python train_llm.py" in err and "--resume" not in err
    assert not issubclass(RunInterrupted, UserError)


# ------------------------------------------------------------------ (f) divergence advice
class _Poison:
    name = "poison"

    def __call__(self, info):  # NaN weights after step 1: step 2's loss is NaN, before the first checkpoint
        if info.step == 1:
            with torch.no_grad():
                info.model.blocks[0].ffn.up.weight.fill_(float("nan"))

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_divergence_advice_is_what_works(debug_cfg, tmp_path):
    cfg = debug_cfg(tokens=4 * STEP_TOKENS, ckpt_every=2)
    t = build_trainer(cfg, tmp_path)
    t.add_callback(_Poison())
    with pytest.raises(NonFiniteLossError) as e:
        t.fit()
    msg = str(e.value)
    assert msg.startswith("step 2: loss=nan") and "no checkpoint yet" in msg
    half = f"--muon_lr {cfg.train.muon_lr / 2:g} --adamw_lr {cfg.train.adamw_lr / 2:g}"
    assert f"train again in another --out with lower learning rates, e.g. {half}" in msg
    assert "a resume keeps the options that diverged" in msg and "Try lower" not in msg


def test_a_divergence_under_a_large_z_loss_names_z_loss(debug_cfg, tmp_path):
    """--z_loss 1e30 diverged and was told to lower the learning rates (issue 50). The rule: z_loss x ln(vocab_size)
    >= 1, where the z term z_loss x logsumexp^2 outweighs the cross-entropy from the first step (both start near
    ln(vocab_size): debug's 512 gives ln 512 = 6.24, the bound 1 / 6.24 = 0.16). The advice works: --z_loss 1e-4
    trains the same run."""
    cfg = debug_cfg(tokens=2 * STEP_TOKENS, z_loss=1e30)
    with pytest.raises(NonFiniteLossError) as e:
        build_trainer(cfg, tmp_path / "run").fit()
    msg = str(e.value)
    assert msg.startswith("step 1: ") and "lower learning rates" not in msg
    assert msg.endswith("train again in another --out with a smaller --z_loss, e.g. --z_loss 0.0001 (PaLM's): at "
                        "z_loss=1e+30 the z term z_loss x logsumexp^2 outweighs the cross-entropy from the first step "
                        "on (logsumexp starts near ln(vocab_size) = 6.24, the cross-entropy too, so from z_loss = "
                        "1/6.24 = 0.16)"), msg
    summary = build_trainer(debug_cfg(tokens=2 * STEP_TOKENS, z_loss=1e-4), tmp_path / "again").fit()
    assert summary["steps"] == 2


# ------------------------------------------------------------------ (g) the probe's batch
def test_a_probe_batch_larger_than_the_validation_set_is_refused_before_writing(args, tmp_path, capsys, fails):
    # the shipped corpus's 30 validation blocks (see the resume on changed data above), plus one: no machine's
    # memory check refuses it first
    msg = fails(args(2, "--probe_batch", "31"))
    assert "probe_batch=31 asks for more validation sequences than the 30 there are" in msg
    assert "lower --probe_batch to 30 or fewer" in msg and "--val_frac" in msg
    assert snapshot(tmp_path / "run") == {}
