"""One writer per folder: an OS-level lock on FOLDER/.lock (fcntl.flock; on Windows msvcrt.locking).

    with FolderLock(out, hint="choose another --out"):
        ...  # write into out

The lock file holds who took it (utils.file_specs.LOCK_HOLDER), so a second process is told whom it is waiting for.
The kernel releases the lock when its holder exits, however it exits, so a stale .lock never blocks anyone. Taking
the lock also applies the rule for links (utils.io.check_links). A process that holds a folder's lock may take it
again (nested, counted); another process may not. Why the file stays, and Windows: docs/training.md, "Interrupted
runs and resumes".
"""
from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable

from utils.errors import UserError, os_problem
from utils.file_specs import LOCK_HOLDER
from utils.formats import check
from utils.io import check_links, open_no_follow

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
try:
    import msvcrt
except ImportError:  # POSIX
    msvcrt = None

LOCK_NAME = ".lock"
_WINDOWS_LOCK_BYTE = 1 << 30  # the byte msvcrt.locking locks (locking past the end of a file is allowed there)
_HELD_ELSEWHERE = {errno.EACCES, getattr(errno, "EDEADLOCK", errno.EDEADLK)}  # msvcrt.locking's "in use"

_held: dict[str, list] = {}  # realpath of the folder -> [fd, depth], this process's locks


class LockError(UserError, RuntimeError):
    """The folder is in use by another process, or cannot be locked; the message names the holder and the fix."""


def _try_lock(fd: int) -> bool:
    """Take the OS lock on fd without waiting; False where another process holds it."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    if msvcrt is None:
        raise LockError("this platform has no file locks (neither fcntl nor msvcrt): no folder can be guarded")
    os.lseek(fd, _WINDOWS_LOCK_BYTE, os.SEEK_SET)  # msvcrt.locking locks from the file's position
    try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError as e:
        if e.errno in _HELD_ELSEWHERE:
            return False
        raise
    return True


def _lock_waiting(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    while not _try_lock(fd):  # msvcrt's own blocking mode gives up after 10 s
        time.sleep(0.2)


def _unlock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        os.lseek(fd, _WINDOWS_LOCK_BYTE, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def _read_start(fd: int, n: int) -> bytes:
    if hasattr(os, "pread"):
        return os.pread(fd, n, 0)
    os.lseek(fd, 0, os.SEEK_SET)  # Windows has no pread
    return os.read(fd, n)


def _write_start(fd: int, data: bytes) -> None:
    if hasattr(os, "pwrite"):
        os.pwrite(fd, data, 0)
        return
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)


def _holder_text(fd: int) -> str:
    try:
        info = json.loads(_read_start(fd, 4096).decode() or "{}")
        check(LOCK_HOLDER, info)  # published as docs/schema/lock.schema.json
        return (f"pid {info['pid']} on {info['host']}, started {info['started']}, running: "
                f"{info['command']}")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its details are not readable)"


_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def _missing(folder: Path) -> list[Path]:
    """The folders `folder.mkdir(parents=True)` would create, deepest first."""
    missing = []
    while not folder.exists() and not folder.is_symlink() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_if_bare(created: list[Path]) -> None:
    """Remove the .lock of a folder the lock created, and the folders it created, where nothing else was written
    into them: a refused or failed command leaves no new folder behind."""
    folder = created[0]
    try:
        if {p.name for p in folder.iterdir()} != {LOCK_NAME}:
            return
        (folder / LOCK_NAME).unlink()
        for path in created:  # deepest first; stops at the first that holds something
            path.rmdir()
    except OSError:
        pass  # written into meanwhile, or not ours to remove: kept


def _open_lock_file(folder: Path, hint: str, read_only_ok: bool, created: list[Path]) -> int | None:
    check_links(folder, hint, LockError)
    try:
        created[:] = _missing(folder)
        folder.mkdir(parents=True, exist_ok=True)
        return open_no_follow(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LockError(f"cannot use {folder}: its {LOCK_NAME} is a link, which this project never writes "
                            f"through; remove it, or {hint}") from None
        if read_only_ok and e.errno in _UNWRITABLE and folder.is_dir():
            return None  # nobody may write there: nothing to guard
        raise LockError(f"cannot use {folder}: {os_problem(e)}; {hint}") from e


class FolderLock:
    def __init__(self, folder: str | Path, hint: str = "choose another folder"):
        self.folder, self.hint = Path(folder), hint
        self.key: str | None = None  # set while this object holds the lock
        self.active = False  # acquired (locked, or used unlocked where read_only_ok allowed it)
        self.created: list[Path] = []  # the folders taking the lock created, deepest first

    def acquire(self, wait: bool = False, on_wait: Callable[[str], None] | None = None,
                read_only_ok: bool = False) -> "FolderLock":
        """Take the lock; if another process holds it, raise LockError (or, with wait, block until it is free).
        read_only_ok: an existing folder this process may not write to is used unlocked (it cannot change it)."""
        created: list[Path] = []
        try:
            fd = _open_lock_file(self.folder, self.hint, read_only_ok, created)
        except BaseException:
            if created:
                _remove_if_bare(created)
            raise
        if fd is None:
            self.active = True
            return self
        key = os.path.realpath(self.folder)
        if key in _held:  # this process holds it already (created nothing: the first holder's folder)
            os.close(fd)
            _held[key][1] += 1
            self.key, self.active = key, True
            return self
        try:
            locked = _try_lock(fd)
        except BaseException:
            os.close(fd)
            raise
        if not locked:
            holder = _holder_text(fd)
            if not wait:
                os.close(fd)  # another process holds the folder: it existed, nothing to remove
                raise LockError(f"{self.folder} is in use by {holder}. Nothing was written. Wait for that process "
                                f"to finish (or stop it), or {self.hint}")
            if on_wait:
                on_wait(f"waiting for {self.folder}, in use by {holder}")
            _lock_waiting(fd)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                "command": " ".join([Path(sys.executable).name, *sys.argv])}
        try:
            os.ftruncate(fd, 0)
            _write_start(fd, (json.dumps(info) + "\n").encode())
        except OSError:
            pass  # a full disk: the lock holds all the same, only the holder's description is missing
        _held[key] = [fd, 1]
        self.key, self.active, self.created = key, True, created
        return self

    def release(self) -> None:
        self.active = False
        if self.key is None or self.key not in _held:
            return
        entry = _held[self.key]
        entry[1] -= 1
        if entry[1] == 0:
            del _held[self.key]
            if self.created:  # still locked: no other process can have written meanwhile
                _remove_if_bare(self.created)
            _unlock(entry[0])
            os.close(entry[0])
        self.key, self.created = None, []

    def __enter__(self) -> "FolderLock":
        return self if self.active else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
