"""utils.lock (one writer per folder, stale locks never block) and utils.io's appends on a full disk."""
from __future__ import annotations

import errno
import io
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import utils.io as io_mod
from tests.helpers import hold_lock
from utils.io import append_line
from utils.lock import FolderLock, LockError

def test_second_process_is_told_the_holder_and_a_killed_holder_does_not_block(tmp_path):
    proc = hold_lock(tmp_path)
    try:
        with pytest.raises(LockError) as err:
            FolderLock(tmp_path, hint="choose another --out").acquire()
        msg = str(err.value)
        assert f"pid {proc.pid} on " in msg and f"running: {os.path.basename(sys.executable)} -c {tmp_path}" in msg
        assert "choose another --out" in msg and "Nothing was written" in msg
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (tmp_path / ".lock").exists()  # the dead holder's file stays; the kernel released its lock
    with FolderLock(tmp_path) as lock:
        assert lock.key is not None
        with FolderLock(tmp_path):  # the same process may take it again (nested)
            pass
        assert str(os.getpid()) in (tmp_path / ".lock").read_text()


def test_waiting_for_a_lock_blocks_until_the_holder_ends(tmp_path):
    proc = hold_lock(tmp_path)
    said = []
    t0 = time.time()
    killer = subprocess.Popen([sys.executable, "-c", f"import os, time; time.sleep(1); os.kill({proc.pid}, 9)"])
    with FolderLock(tmp_path).acquire(wait=True, on_wait=said.append):
        assert time.time() - t0 >= 0.9 and f"pid {proc.pid}" in said[0]
    killer.wait()
    proc.wait()


def test_an_unwritable_folder_is_named_with_the_fix(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(LockError, match=r"cannot use .*file/run: a path component is a file, not a folder.*--out"):
        FolderLock(tmp_path / "file" / "run", hint="choose another --out").acquire()


class _FullDisk(io.BufferedWriter):
    """A file whose writes stop half way with ENOSPC, like a disk filling up."""

    def write(self, data):
        super().write(data[: len(data) // 2])
        super().flush()
        raise OSError(errno.ENOSPC, "No space left on device")


def test_append_line_on_a_full_disk_leaves_no_torn_line(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    append_line(path, '{"step": 1}')
    monkeypatch.setattr(io_mod, "open", lambda p, mode, **kw: _FullDisk(io.FileIO(p, "a")), raising=False)
    with pytest.raises(OSError) as err:
        append_line(path, '{"step": 2, "loss": 1.5}')
    assert err.value.errno == errno.ENOSPC
    assert path.read_text() == '{"step": 1}\n'  # cut back to the last whole line


def test_a_full_disk_is_told_with_its_free_space_never_a_question_mark(tmp_path):
    from utils.errors import explain, os_problem
    named = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "new" / "results.json"))
    msg = explain(named)
    assert msg.startswith(f"the disk is full ({tmp_path / 'new' / 'results.json'}; ") and " free on its disk)" in msg
    assert re.search(r"; \d+(\.\d)? (GB|MB|KB|bytes) free on its disk\)", msg) and "(?)" not in msg
    unnamed = OSError(errno.ENOSPC, "No space left on device")  # a write to an open file names none
    assert os_problem(unnamed) == "the disk is full (the system named no file, so the free space is unknown)"
    assert os_problem(unnamed, tmp_path).startswith(f"the disk is full ({tmp_path}; ")
    assert os_problem(OSError(errno.EROFS, "Read-only")) == "the file system is read-only (the system named no file)"


def test_a_refused_command_leaves_no_new_folder(tmp_path):
    """The lock creates the folder it guards; released with nothing else written, the folder (and the parents it
    created) goes again, so a refusal leaves nothing new; a folder that existed, or holds what was written, stays."""
    new = tmp_path / "a" / "b"
    with pytest.raises(RuntimeError):
        with FolderLock(new):
            assert (new / ".lock").is_file()
            raise RuntimeError("refused")
    assert sorted(tmp_path.iterdir()) == []
    with FolderLock(new):
        with FolderLock(new):  # nested: the outer holder decides
            pass
        assert (new / ".lock").is_file()
        (new / "results.json").write_text("{}")
    assert sorted(p.name for p in new.iterdir()) == [".lock", "results.json"]
    old = tmp_path / "old"
    old.mkdir()
    with FolderLock(old):
        pass
    assert (old / ".lock").is_file()  # a folder that existed keeps its lock file, as before
