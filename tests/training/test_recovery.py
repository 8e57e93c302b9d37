"""Damaged run folders and refused resumes, in process: corrupt checkpoints, torn metrics, lost results,
a full disk at each write, the resume rules, and leftovers of killed runs. Each case checks that the files
written before are intact, that the message names the problem and the fix, and, where the run can go on,
that it ends exactly like the uninterrupted run (conftest.straight_run)."""
from __future__ import annotations

import errno
import json

import pytest
from safetensors import SafetensorError

import train_llm
from tests.helpers import STEP_TOKENS, assert_same_run, hidden_files, train_rows
from training.schedule import lr_factor




def snapshot(out) -> dict:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != ".lock"}


CORRUPTIONS = {
    "model.safetensors": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),  # truncated
    "optim.pt": lambda p: p.write_bytes(b"\x80garbage" * 40),
    "state.json": lambda p: p.write_text('{"step": 4, "loa'),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_a_corrupt_checkpoint_is_named_and_the_one_before_is_used(name, args, tmp_path, straight_run, capsys):
    out = tmp_path / "run"
    train_llm.main(args(4))  # checkpoints at steps 2 and 4
    CORRUPTIONS[name](out / "checkpoints" / "step-000004" / name)
    damaged = (out / "checkpoints" / "step-000004" / name).read_bytes()
    capsys.readouterr()
    train_llm.main(args(6, "--resume"))
    log = capsys.readouterr().out
    assert f"checkpoint {out / 'checkpoints' / 'step-000004'} cannot be loaded: {name} cannot be read" in log
    assert f"continuing from {out / 'checkpoints' / 'step-000002'} (step 2)" in log
    assert_same_run(straight_run, out, 6)
    assert (out / "checkpoints" / "step-000004.unreadable" / name).read_bytes() == damaged  # kept to look at


def test_no_loadable_checkpoint_stops_and_changes_nothing(args, tmp_path, capsys, fails):
    out = tmp_path / "run"
    train_llm.main(args(4))
    for step in (2, 4):
        CORRUPTIONS["state.json"](out / "checkpoints" / f"step-{step:06d}" / "state.json")
    before = snapshot(out)
    msg = fails(args(6, "--resume"))
    assert f"no checkpoint under {out / 'checkpoints'} can be loaded" in msg and "Restore them" in msg
    assert snapshot(out) == before
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002", "step-000004"]


def test_a_torn_metrics_line_is_dropped_with_a_warning(args, tmp_path, straight_run, capsys):
    out = tmp_path / "run"
    train_llm.main(args(4))
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "tokens": 1280, "lo')  # a kill or a full disk in the middle of a line
    capsys.readouterr()
    train_llm.main(args(6, "--resume"))
    assert "(the last, cut off)" in capsys.readouterr().out
    assert_same_run(straight_run, out, 6)


@pytest.mark.parametrize("damage,steps", [("deleted", 6), ("garbage", 4)])
def test_lost_results_json_stops_the_resume(damage, steps, args, tmp_path, capsys, fails):
    """Mid-run (6 > 4 steps) or finished (4): never a fresh results.json starting at the resume step."""
    out = tmp_path / "run"
    train_llm.main(args(4))
    if damage == "deleted":
        (out / "results.json").unlink()
    else:
        (out / "results.json").write_text('{"tag": "QK", "tokens": [0, 2')
    before = snapshot(out)
    msg = fails(args(steps, "--resume"))
    assert "cannot resume from step 4" in msg and "results.json" in msg
    assert ("is missing" if damage == "deleted" else "not valid JSON") in msg and "Restore results.json" in msg
    assert snapshot(out) == before and (out / "checkpoints" / "step-000004").is_dir()


def test_resuming_a_finished_run_rewrites_nothing(args, tmp_path, capsys):
    out = tmp_path / "run"
    first = train_llm.main(args(4))
    before = snapshot(out)
    again = train_llm.main(args(4, "--resume"))
    assert "nothing to train" in capsys.readouterr().out
    assert snapshot(out) == before and again == first and again["final_loss"] is not None


def test_resume_rules(args, tmp_path, capsys, fails):
    out = tmp_path / "run"
    msg = fails(args(4, "--resume"))  # nothing there yet
    assert f"--resume: {out} holds no run to continue" in msg and "drop --resume" in msg
    assert not (out / "config.json").exists()
    train_llm.main(args(4, "--schedule", "cosine"))
    before = snapshot(out)
    msg = fails(args(2, "--schedule", "cosine", "--resume"))
    assert "has already trained 4 steps (1,024 tokens)" in msg and "Fix: pass --tokens 1024 or more" in msg
    msg = fails(args(6, "--schedule", "cosine", "--resume"))
    jump = f"from {lr_factor(4, 4, _cosine()):.4g} to {lr_factor(4, 6, _cosine()):.4g}"
    assert "from 4 to 6 steps" in msg and jump in msg and "--replan_schedule" in msg
    assert snapshot(out) == before  # refused before anything was written
    train_llm.main(args(6, "--schedule", "cosine", "--resume", "--replan_schedule"))
    factors = [r[3] for r in train_rows(out)]
    assert factors[4:] == pytest.approx([lr_factor(4, 6, _cosine()), lr_factor(5, 6, _cosine())])  # the new plan
    assert json.loads((out / "config.json").read_text())["train"]["tokens"] == 6 * STEP_TOKENS


def _cosine():
    from configs import TrainConfig
    return TrainConfig(schedule="cosine")


def test_config_errors_name_the_fix(args, capsys, fails):
    msg = fails(args(4, "--seq_len", "64", "--max_seq_len", "64", "--batch_size", "32", "--tokens", "1000"))
    assert "tokens=1,000 is less than one optimizer step" in msg and "tokens_per_step" in msg and "2,048" in msg
    msg = fails(args(4, "--device", "tpu"))
    assert "--device tpu" in msg and "available here: cpu" in msg


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device", "x")


FULL_DISK = {  # where the disk fills up: (module, attribute, the call that fails)
    "metrics": ("training.run_files", "append_line", 3),  # the row of step 3; the checkpoint of step 2 exists
    "results": ("research.probing.callback", "save_results", 2),  # the probe at step 2, before any checkpoint
    "checkpoint": ("training.checkpoint", "save_file", 2),  # the checkpoint of step 4
    "summary": ("training.run_files", "RunFolder.write_summary", 1),  # after the last checkpoint
}


@pytest.mark.parametrize("point", list(FULL_DISK))
def test_a_full_disk_stops_with_one_message_and_loses_nothing(point, args, tmp_path, straight_run, capsys,
                                                              monkeypatch, fails):
    import importlib
    module, path, nth = FULL_DISK[point]
    *parents, attr = path.split(".")
    owner = importlib.import_module(module)
    for name in parents:
        owner = getattr(owner, name)
    real, calls = getattr(owner, attr), []

    def filling(*a, **k):
        calls.append(1)
        if len(calls) < nth:
            return real(*a, **k)
        if point == "checkpoint":  # safetensors wraps the OS error in its own type
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")
        _enospc()

    monkeypatch.setattr(owner, attr, filling)
    msg = fails(args(6))
    assert "the disk is full" in msg and "free space" in msg and "--resume" in msg
    monkeypatch.setattr(owner, attr, real)
    assert not [h for h in hidden_files(tmp_path / "run") if ".tmp" in h]
    train_llm.main(args(6, "--resume"))  # every file left is consistent: the run goes on to the same end
    assert_same_run(straight_run, tmp_path / "run", 6)


def test_a_full_disk_while_the_tokenizer_is_copied_is_told_as_one(args, tmp_path, monkeypatch, fails):
    """shutil.copytree gathers its files' errors as text, without an errno: with 20 kB free a run said "Error"
    (issue 65). The first file's error is told, naming the run folder, not the hidden folder of the copy."""
    import shutil
    real = shutil.copyfile

    def filling(src, dst, *a, **k):
        if ".tmp-tokenizer" in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return real(src, dst, *a, **k)
    monkeypatch.setattr(shutil, "copyfile", filling)
    msg = fails(args(2))
    assert msg.startswith(f"error: cannot write to {tmp_path / 'run'}: the disk is full ({tmp_path / 'run'}; "), msg
    assert "free on its disk). Fix: free space on that disk (or point the output elsewhere). " in msg, msg
    assert not [h for h in hidden_files(tmp_path / "run") if ".tmp" in h]


@pytest.mark.slow
def test_leftovers_of_killed_runs_are_removed_and_nothing_else(args, tmp_path, cache_dir, debug_cfg, capsys):
    out = tmp_path / "run"
    train_llm.main(args(4))
    ckpts = out / "checkpoints"
    ours = [ckpts / ".tmp-step-000006-ab12cd34", ckpts / ".pruning-step-000002-zz99yy88", ckpts / "step-000001",
            out / ".tmp-tokenizer-q1w2e3r4"]
    for d in ours:
        d.mkdir()
        (d / "state.json").write_text("{}")
    ours += [out / ".results.json.k3j4h5g6.tmp", out / ".metrics.jsonl.a1b2c3d4.tmp"]
    foreign = [out / "notes.txt", out / ".tmp-mine", out / ".results.json.bak", ckpts / "keep-me"]
    for f in ours[4:] + foreign:
        f.write_text("x")
    train_llm.main(args(6, "--resume"))
    assert not any(p.exists() for p in ours) and all(p.exists() for p in foreign)
    log = capsys.readouterr().out
    assert all(f"removed {p} (left by an interrupted run)" in log for p in ours)

    from data import prepare_data
    leftovers = [cache_dir / ".work-abcd1234", cache_dir / ".tmp-0123456789ab-0123456789ab-L32-zz12ab34",
                 cache_dir / "tokenizers" / ".tmp-bpe-v1-0123456789ab-V512-qq12ww34"]
    other = cache_dir / ".tmp-someone-elses"
    for d in [*leftovers, other]:
        d.mkdir(parents=True)
    prepare_data(debug_cfg(), log=lambda *a: None)
    assert not any(p.exists() for p in leftovers) and other.exists()
