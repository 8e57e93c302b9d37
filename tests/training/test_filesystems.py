"""A real read-only and a real full file system (small tmpfs mounts; skipped where mounting is not allowed)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

import train_llm
from research.results import load_results, save_results
from tests.helpers import assert_same_run, cli_args, hidden_files, stops, train_rows
from tests.research.synthetic import make_results


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size, read_only=False) -> a fresh tmpfs folder; unmounted after the test."""
    mounted = []

    def mount(size: str, name: str = "fs"):
        where = tmp_path / name
        where.mkdir()
        try:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                               capture_output=True, text=True)
        except FileNotFoundError:
            pytest.skip("no mount command here")
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()})")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        if subprocess.run(["umount", str(where)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)  # detach even if a file is open


def remount_read_only(where) -> None:
    r = subprocess.run(["mount", "-o", "remount,ro", str(where)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot remount read-only ({r.stderr.strip()})")


@pytest.mark.slow
def test_a_read_only_folder_is_named_and_nothing_is_attempted(tmpfs, corpus_file, cache_dir, capsys):
    fs = tmpfs("1m")
    study = fs / "study"
    for cond, mode in (("QK", "learned"), ("QK_frozen", "frozen"), ("NoQK", "none")):
        save_results(study / cond / "results.json", make_results(cond, qk_norm=mode))
    remount_read_only(fs)
    msg = stops(capsys, train_llm.main, cli_args(corpus_file, cache_dir, fs / "run", 2))
    assert msg == f"error: cannot use {fs / 'run'}: the file system is read-only ({fs / 'run'}); choose another --out"
    from research.split_panels import main as split_panels
    msg = stops(capsys, split_panels, [str(study)])
    assert "the file system is read-only" in msg and "pass --out" in msg
    elsewhere = fs.parent / "figures"
    split_panels([str(study), "--out", str(elsewhere)])  # reading a read-only study is fine
    assert (elsewhere / "report.md").is_file()


@pytest.mark.slow
def test_a_disk_too_small_for_a_checkpoint_keeps_everything_written(tmpfs, corpus_file, cache_dir, tmp_path,
                                                                    straight_run, capsys):
    fs = tmpfs("4m")  # room for one 2.6 MB checkpoint of the debug model, not two
    out = fs / "run"
    msg = stops(capsys, train_llm.main, cli_args(corpus_file, cache_dir, out, 6))
    assert msg.startswith(f"error: could not write checkpoint {out / 'checkpoints' / 'step-000004'}")
    assert "free space on that disk" in msg and f"newest checkpoint is {out / 'checkpoints' / 'step-000002'}" in msg
    assert hidden_files(out) == []  # the half-written checkpoint was removed
    assert [r[0] for r in train_rows(out)] == [1, 2, 3, 4]  # whole lines only
    assert load_results(out / "results.json")["steps"] == [0, 2, 4]
    moved = tmp_path / "moved"  # nothing was lost: on a disk with room the run goes on to the same end
    shutil.copytree(out, moved)
    train_llm.main(cli_args(corpus_file, cache_dir, moved, 6, "--resume"))
    assert_same_run(straight_run, moved, 6)
