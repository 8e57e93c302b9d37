"""A file or folder of --paths that this user may not read: one line whose fix is a read's (issue 50: the fix of a
write, 'choose a folder you may write to', was given). Tests run as root here, whom permissions do not stop, so the
operating system's refusal is raised where it would be."""
import errno
from pathlib import Path

import pytest

import train_llm
from tests.helpers import stops
from utils.errors import os_fix

READ_FIX = "make it readable to you (its permissions, and those of the folders above it)"
LEAVE_OUT = "remove it from --paths (or from the folder or pattern given there)"


def _refuse(monkeypatch, method: str, secret: Path):
    """Path.<method> raises PermissionError for paths under `secret`, as for a user who may not enter it."""
    real = getattr(Path, method)

    def refused(self, *args, **kwargs):
        if self == secret or secret in self.parents:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Path, method, refused)


@pytest.mark.parametrize("method", ["is_dir", "open"])
def test_a_path_one_may_not_read_gets_the_fix_of_a_read(corpus_file, cache_dir, tmp_path, capsys, monkeypatch, method):
    """is_dir: a folder on the way this user may not enter (it raises, where a missing path gives False); open: a file
    this user may not read (files are read a chunk at a time through Path.open)."""
    secret = tmp_path / "secret"
    secret.mkdir()
    text = secret / "a.txt"
    text.write_text(corpus_file.read_text())
    _refuse(monkeypatch, method, secret)
    line = stops(capsys, train_llm.main, ["--preset", "debug", "--source", "files", "--paths", str(text),
                                          "--cache_dir", str(cache_dir), "--out", str(tmp_path / "run")])
    assert line == (f"error: source=files: cannot read what --paths names: permission denied ({text}). Fix: "
                    f"{READ_FIX}, or {LEAVE_OUT}"), line
    assert not (tmp_path / "run").exists()


def test_a_read_and_a_write_get_their_own_fixes():
    e = PermissionError(errno.EACCES, "Permission denied", "/x")
    assert os_fix(e) == "choose a folder you may write to, or fix its permissions"
    assert os_fix(e, reading=True) == READ_FIX
    assert os_fix(IsADirectoryError(errno.EISDIR, "Is a directory", "/x"), reading=True) == "name a file, not a folder"


def test_a_name_too_long_for_a_path_is_one_short_line(corpus_file, cache_dir, tmp_path, capsys):
    """--tokenizer of 100,000 letters, tried as a folder: the system's 'File name too long' was echoed with the whole
    name (issue 50); now in words, the path cut to 300 characters (198 of its start, '...', 99 of its end)."""
    line = stops(capsys, train_llm.main, ["--preset", "debug", "--source", "files", "--paths", str(corpus_file),
                                          "--cache_dir", str(cache_dir), "--tokenizer", "x" * 100_000,
                                          "--out", str(tmp_path / "run")])
    assert line == (f"error: a name in the path is longer than the file system allows ({'x' * 198}...{'x' * 99}). "
                    f"Fix: give a shorter path"), line[:400]
