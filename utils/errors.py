"""Errors of the ground floor: ConfigError, and operating-system errors told the way a user can act on them (disk
full, read-only, permissions)."""
from __future__ import annotations

import errno
import itertools
import math
import re
import reprlib
import shutil
from pathlib import Path


_PROBLEMS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a path component is a file, not a folder",
    errno.EEXIST: "it exists and is not a folder",
    errno.EISDIR: "it is a folder, not a file",
    errno.ENOENT: "no such file or folder",
    errno.ENAMETOOLONG: "a name in the path is longer than the file system allows",
}
_FIXES = {  # for a write
    errno.ENOSPC: "free space on that disk (or point the output elsewhere)",
    errno.EDQUOT: "free space within your quota (or point the output elsewhere)",
    errno.EROFS: "choose a writable folder",
    errno.EACCES: "choose a folder you may write to, or fix its permissions",
    errno.EPERM: "choose a folder you may write to, or fix its permissions",
    errno.ENAMETOOLONG: "give a shorter path",
}


SHOWN_LIMIT = 200  # characters of a rejected value a message shows at most


class _Bounded(reprlib.Repr):
    """reprlib's repr with the limits of a one-line message: it visits a bounded part of a value (a few levels, a few
    items each), so a value that is huge, or small on disk but huge in memory (a YAML alias bomb, whose lists share
    their items), costs nothing to show."""

    def __init__(self, limit: int):
        super().__init__()
        self.maxlevel = 3
        self.maxdict = 4
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = self.maxarray = 6
        self.maxstring = self.maxother = self.maxlong = limit

    def repr_str(self, x: str, level: int) -> str:  # its true start and end (reprlib's cuts its first part)
        n = self.maxstring
        return cut(repr(x if len(x) <= 2 * n else x[:n] + x[-n:]), n)

    def repr_int(self, x: int, level: int) -> str:
        digits = int(abs(x).bit_length() * math.log10(2)) + 1
        if digits > self.maxlong:  # Python refuses to write an int of over 4,300 digits; nobody reads one
            return f"<a whole number of about {digits:,} digits>"
        return repr(x)

    def repr_dict(self, x: dict, level: int) -> str:  # in the file's order (reprlib sorts every key first)
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
                 for k, v in itertools.islice(x.items(), self.maxdict)]
        return "{" + ", ".join(items) + (", ..." if len(x) > self.maxdict else "") + "}"


def cut(text: str, limit: int = SHOWN_LIMIT) -> str:
    """`text` in at most `limit` characters: its start and end around '...' when it is longer."""
    if len(text) <= limit:
        return text
    head = (limit - 3) * 2 // 3
    return f"{text[:head]}...{text[len(text) - (limit - 3 - head):]}"


def shown(value, limit: int = SHOWN_LIMIT) -> str:
    """A value as a message shows it: its repr in at most `limit` characters, built without visiting more of the
    value than that (the one bounded formatter of every message that echoes what a user gave)."""
    return cut(_Bounded(limit).repr(value), limit)


def free_space(path: str | Path) -> str:
    """'<n> free on its disk' for the disk holding `path` (or its nearest existing parent), in words; 'its free
    space is unknown' where the system does not say."""
    p = Path(path)
    while not p.exists() and p.parent != p:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return "its free space is unknown"
    for size, unit in ((1 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "KB")):
        if free >= size:
            return f"{free / size:.1f} {unit} free on its disk"
    return f"{free} bytes free on its disk"


def _first_cause(e: OSError) -> OSError:
    """The OSError of the first file shutil.copytree could not copy: its Error gathers them as text, [(source,
    destination, "[Errno 28] No space left on device: ...")], without an errno, so a full disk would be told as
    "Error". Named by the folder the copy was made into (not its hidden temporary folder, utils.io.atomic_dir's
    .tmp-*); any other OSError as it is."""
    entries = e.args[0] if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list) else []
    for entry in entries[:1]:
        m = re.match(r"\[Errno (\d+)\] ([^:]+)", str(entry[-1])) if isinstance(entry, tuple) and entry else None
        if m:
            path = Path(str(entry[1])) if len(entry) == 3 else None
            hidden = next((p for p in (path, *path.parents) if p.name.startswith(".tmp-")), None) if path else None
            return OSError(int(m[1]), m[2], str(hidden.parent if hidden else path) if path else None)
    return e


def os_problem(e: OSError, where: str | Path | None = None) -> str:
    """'<what happened> (<path>)' for an OSError, in words; for a full disk also the free space there. `where`: the
    file or folder being written, for an error of the system that names none (a write to an open file)."""
    e = _first_cause(e)
    what = _PROBLEMS.get(e.errno, e.strerror or type(e).__name__)
    path = e.filename if e.filename is not None else where
    if path is None:
        known = " (the system named no file, so the free space is unknown)" if e.errno in (errno.ENOSPC, errno.EDQUOT) \
            else " (the system named no file)"
        return what + known
    named = cut(str(path), 300)  # a path too long to be one is shown cut
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{what} ({named}; {free_space(path)})"
    return f"{what} ({named})"


_READ_FIXES = {  # for a read: the file is the user's, no other folder would do
    errno.EACCES: "make it readable to you (its permissions, and those of the folders above it)",
    errno.EPERM: "make it readable to you (its permissions, and those of the folders above it)",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "check the path: a part of it is a file, not a folder",
    errno.EISDIR: "name a file, not a folder",
    errno.ENAMETOOLONG: "give a shorter path",
}


def os_fix(e: OSError, reading: bool = False) -> str:
    """What the user can do about an OSError of a write, or (`reading`) of a read."""
    e = _first_cause(e)
    return (_READ_FIXES if reading else _FIXES).get(e.errno, "check the path and its disk")


def is_disk_full(e: BaseException) -> bool:
    """An OSError for a full disk, or a library error whose text says so (safetensors wraps the OS error)."""
    if isinstance(e, OSError):
        return _first_cause(e).errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(e)
    return "No space left" in text or "StorageFull" in text or "os error 28" in text


EXIT_USER_ERROR = 2  # a user error, as argparse's own usage errors: one code for every command (docs/layout.md)
EXIT_INTERRUPTED = 130  # Ctrl-C: the shell's code for a process ended by SIGINT


class PicklesWhole:
    """An exception class of the project that survives pickling whole (out of a Ray task to the driver): its message
    and every field it sets. Exception's own pickling calls the class again with `args` alone, which drops the
    fields and, where __init__ builds the message from its arguments, rebuilds the message from the message."""

    def __reduce__(self):
        return _rebuilt, (type(self), self.args, dict(self.__dict__))


def _rebuilt(cls: type, args: tuple, fields: dict) -> BaseException:
    e = cls.__new__(cls, *args)  # BaseException.__new__ sets args; __init__ is not called again
    e.args = args
    e.__dict__.update(fields)
    return e


class UserError(PicklesWhole, Exception):
    """A problem the user can fix, whose message says what and how in one line. The error classes of the layers
    above (ConfigError, ResultsError, LockError, ...) subclass it, so that every command (utils.cli.command) tells
    them the same way without importing them: "error: <message>", exit status EXIT_USER_ERROR."""


class ConfigError(UserError, ValueError):
    """A configuration that cannot work; the message names the field and the fix. Defined here, on the ground
    floor, so that utils (the device choice) raises it without importing configs; configs.config re-exports it."""


class Interrupted(PicklesWhole, Exception):
    """Ctrl-C, told with what was kept ("interrupted; kept ..."): a command prints the message and exits with
    EXIT_INTERRUPTED. A command turns KeyboardInterrupt into this where it can say more than "interrupted"."""


def explain(e: UserError | OSError, fix_also: str = "") -> str:
    """The one line a command prints for a user error or an OSError: the message, or for an error of the operating
    system the problem and the fix (`fix_also`: another way out, e.g. "pass --out DIR"). An OSError the project
    raised with a message of its own (no errno, e.g. "--out holds a run: pass --resume") is its message."""
    if isinstance(e, OSError) and not isinstance(e, UserError) and _first_cause(e).errno is not None:
        return f"{os_problem(e)}. Fix: {os_fix(e)}" + (f", or {fix_also}" if fix_also else "")
    return str(e)
