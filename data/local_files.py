"""--source files: local .txt/.md/.rst/.py (one document per file), .jsonl/.json and .parquet files; --paths takes
files, folders (every such file below, sorted) and glob patterns. Each file is hashed and checked a chunk at a time
(text_checks.py says why one is refused) before anything is loaded."""
from __future__ import annotations

import glob
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from data.source import DataError, Documents, Source, dataset_documents
from data.text_checks import LEAVE_OUT, TextCheck, decode_text, json_fix, json_problem, parquet_ends_problem
from utils.errors import os_fix, os_problem, shown
from utils.progress import quiet_imported

if TYPE_CHECKING:  # imported where used: `import data` stays light
    import datasets

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
        problem = parquet_ends_problem(size, head, tail)
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
            raise DataError(f"source=files: {p}: {problem}. Fix: {json_fix(problem)}")
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
            return DataError(f"source=files: {p}: {problem}. Fix: {json_fix(problem)}")
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
    return DataError(f"source=files: {p}: {problem}. Fix: {json_fix(problem)}")


def _root_cause(e: BaseException) -> str:
    """The innermost exception's type and message: datasets wraps the real error in a generic one."""
    for _ in range(20):  # a bounded walk: a chain set by hand may loop
        if (e.__cause__ or e.__context__) is None:
            break
        e = e.__cause__ or e.__context__
    return f"{type(e).__name__}: {str(e)[:300]}"


def _parquet_data_bytes(p: Path, size: int) -> int:
    """The uncompressed size of a parquet file's columns (what datasets' copy of it takes), else its size."""
    try:
        import pyarrow.parquet as pq
        meta = pq.read_metadata(p)
        return max(size, sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)))
    except Exception:  # noqa: BLE001 - unreadable metadata: loading it says why (_unreadable)
        return size
