"""Atomic writes (a crash mid-write never leaves a half-written file or folder that looks complete), the
one rule for links inside the folders this project writes (`check_links`) and what a path is that is not a file
(`not_a_file`)."""
from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from utils.errors import UserError
from utils.testhook import hook


def not_a_file(path: str | Path) -> str | None:
    """What `path` is when it exists and is not a regular file (links followed), in words ("a folder", "a named pipe
    (FIFO)", ...); None for a file, and for a path that does not exist (its reader says so)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    kinds = ((stat.S_ISREG, None), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def sha256_file(path: str | Path) -> str:
    """The sha256 hex digest of a file's bytes, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes files private; give the usual permissions
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        hook(f"replace:{path.name}")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _finish_tree(root: Path) -> None:
    """fsync every file and give the usual permissions (mkdtemp/mkstemp make them private)."""
    umask = os.umask(0)
    os.umask(umask)
    for dirpath, _, filenames in os.walk(root):
        os.chmod(dirpath, 0o777 & ~umask)
        for fn in filenames:
            path = os.path.join(dirpath, fn)
            os.chmod(path, 0o666 & ~umask)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


@contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside `final`; when the block exits normally the
    folder is fsynced and renamed to `final`. On an exception (or a kill) `final` never
    appears; the hidden `.tmp-*` folder is removed on exceptions and ignored otherwise.
    If `final` appeared meanwhile (another process finished first) the new copy is dropped.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".tmp-{final.name}-"))
    try:
        yield tmp
        _finish_tree(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class LinkError(UserError, RuntimeError):
    """A link inside a folder of this project that leads outside it; the message names the link and the fix."""


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def escaping_links(root: str | Path) -> list[tuple[Path, str]]:
    """[(link, where it leads)] of the symbolic links under `root` (walked without following links) whose
    target lies outside `root`, dangling ones included (they lead nowhere inside)."""
    root = Path(root)
    real_root = os.path.realpath(root)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):  # os.walk does not descend into linked folders
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                target = os.path.realpath(path)
                if not (_inside(target, real_root) and os.path.exists(target)):
                    found.append((path, os.readlink(path)))
    return found


def check_links(root: str | Path, fix: str = "choose another folder", error: type[Exception] = LinkError) -> None:
    """The one rule for links in a run, study or cache folder: no tool of this project reads or writes through a
    link that leads outside the folder (a planted `.lock -> ../victim.txt` would otherwise be overwritten, a
    `tokenizer/x -> ~/secret` exported). Raise `error` (the caller's own error class) naming the link; links within
    the folder are allowed."""
    root = Path(root)
    if not root.is_dir():
        return
    bad = escaping_links(root)
    if bad:
        listed = "; ".join(f"{link} -> {target}" for link, target in bad[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        what, it = ("a link", "it") if len(bad) == 1 else (f"{len(bad)} links", "them")
        raise error(f"{root} holds {what} leading outside it ({listed}{more}); this project never reads or "
                        f"writes through such links. Remove {it} (or put a copy of the file in its place), or {fix}")


def open_no_follow(path: str | Path, flags: int, mode: int = 0o666) -> int:
    """os.open that never opens through a link at `path` (its last part): a link raises OSError ELOOP. O_NOFOLLOW
    where the OS has it; elsewhere (Windows) a look before opening, which only a link made in between could pass
    (making one there takes the symbolic-link right: an administrator, or developer mode)."""
    nofollow = getattr(os, "O_NOFOLLOW", None)
    if nofollow is not None:
        return os.open(path, flags | nofollow, mode)
    if os.path.islink(path):
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
    return os.open(path, flags | getattr(os, "O_BINARY", 0), mode)  # Windows opens in text mode without O_BINARY


def append_line(path: str | Path, line: str) -> None:
    """Append one line and flush it; if the write fails (a full disk) the file is cut back to where it
    was, so it never ends in a torn line. A link in its place is refused (open_no_follow), never written through."""
    with open(path, "ab", opener=lambda p, flags: open_no_follow(p, flags)) as f:
        start = f.seek(0, os.SEEK_END)
        try:
            f.write((line.rstrip("\n") + "\n").encode("utf-8"))
            f.flush()
        except BaseException:
            f.truncate(start)
            raise


def temp_file_pattern(name: str) -> re.Pattern:
    """The names atomic_write_bytes gives its temporary files for `name`."""
    return re.compile(rf"^\.{re.escape(name)}\.[A-Za-z0-9_]+\.tmp$")


def temp_dir_pattern(name_pattern: str) -> re.Pattern:
    """The names atomic_dir gives its temporary folders for final names matching `name_pattern` (a regex)."""
    return re.compile(rf"^\.tmp-(?:{name_pattern})-[A-Za-z0-9_]+$")


def remove_matching(folder: str | Path, pattern: re.Pattern) -> list[Path]:
    """Remove the files and folders directly in `folder` whose name matches `pattern`; returns them."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for p in sorted(folder.iterdir()):
        if pattern.match(p.name):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed
