"""Text sources: where the documents come from, and a content hash that names them.

`open_source(data_cfg)` returns a `Source` whose `source_hash` is known up front (cheap
for stdlib and files, an identity hash for the hub) and whose `load(workdir)` gives a
`datasets.Dataset` with one string column "text", one row per document. Loading is
deferred so a fully cached run never reads more than it needs for the hash.

Sources:
- stdlib: the .py files of the running interpreter's standard library (no site-packages).
- files: local .txt/.md/.rst/.py (one document per file), .jsonl/.json and .parquet files.
- hub: the first `hub_docs` documents of a Hub dataset, streamed. Needs a network; without
  one it fails within seconds, naming the offline options.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from utils.hub import hub_problem

if TYPE_CHECKING:  # imported where used: `import data` stays light
    import datasets


class DataError(RuntimeError):
    """Data preparation cannot go on; the message names the cause and the fix."""


OFFLINE_OPTIONS = (
    "Offline options: --source stdlib (the default: the Python standard library), "
    "--source files --paths a.txt,b.jsonl (local .txt/.jsonl/.json/.parquet files), "
    "and --tokenizer bpe (train a byte-level BPE on the corpus) or --tokenizer /path/to/local/tokenizer_dir."
)

# ---------------------------------------------------------------- stdlib
# Library code first, then test suites, up to 20 MB: ~5.8M tokens at vocab 4096 (README, "Data").
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
        raise DataError(f"{what} {repo_id!r}: {reason}. Check the name. {OFFLINE_OPTIONS}")
    raise DataError(f"cannot load {what} {repo_id!r} from the Hugging Face Hub: {reason}. {OFFLINE_OPTIONS}")


@dataclass
class Source:
    kind: str  # stdlib | files | hub
    source_hash: str  # sha256 hex naming the corpus content (identity for the hub)
    description: str
    n_docs: int | None  # known up front for stdlib; None until loaded otherwise
    _load: Callable[[Path], datasets.Dataset]

    def load(self, workdir: Path) -> datasets.Dataset:
        """The documents as a Dataset with one column "text". `workdir` is scratch space."""
        return self._load(Path(workdir))


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
    desc = f"stdlib {root} ({len(texts)} files, {total / 1e6:.1f} MB)"

    def load(_workdir: Path) -> datasets.Dataset:
        import datasets

        return datasets.Dataset.from_dict({"text": texts})

    return Source("stdlib", h.hexdigest(), desc, len(texts), load)


# ---------------------------------------------------------------- local files
TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".py")
JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)


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


def files_source(paths: list[str], text_field: str = "text") -> Source:
    """Local files; text files are one document each, json/parquet rows are documents
    (column `text_field`). Hash: sha256 over file names, bytes and the text field."""
    if not paths:
        raise DataError("source=files needs --paths a.txt,b.jsonl,... (text, jsonl or parquet files)")
    resolved = []
    for s in paths:
        p = Path(s).expanduser()
        if not p.exists():
            raise DataError(f"source=files: {s} does not exist (check --paths; cwd is {Path.cwd()})")
        if not p.is_file():
            raise DataError(f"source=files: {s} is not a file; list the files themselves in --paths")
        resolved.append((p, _builder_for(p)))
    h = hashlib.sha256(b"files-v1\0")
    h.update(text_field.encode("utf-8") + b"\0")
    total = 0
    for p, _ in resolved:
        raw = p.read_bytes()
        total += len(raw)
        _hash_update_doc(h, p.name, raw)
    desc = f"files {', '.join(str(p) for p, _ in resolved)} ({total / 1e6:.2f} MB)"

    def load(workdir: Path) -> datasets.Dataset:
        import datasets

        parts = []
        for p, builder in resolved:
            kwargs = {"sample_by": "document"} if builder == "text" else {}
            try:
                ds = datasets.load_dataset(builder, data_files=[str(p.resolve())], split="train",
                                           cache_dir=str(workdir / "hf_datasets"), **kwargs)
            except Exception as e:
                raise DataError(f"{p}: could not be read as {builder} ({type(e).__name__}: {e})") from e
            if text_field not in ds.column_names:
                raise DataError(f"{p}: no column {text_field!r}; available columns: {', '.join(ds.column_names)}. "
                                f"Pass --text_field NAME")
            feat = ds.features[text_field]
            if not (isinstance(feat, datasets.Value) and feat.dtype in ("string", "large_string")):
                raise DataError(f"{p}: column {text_field!r} has type {feat}, not text; pick a text column "
                                f"with --text_field (available: {', '.join(ds.column_names)})")
            ds = ds.select_columns([text_field])
            if text_field != "text":
                ds = ds.rename_column(text_field, "text")
            parts.append(ds.cast_column("text", datasets.Value("string")))
        return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)

    return Source("files", h.hexdigest(), desc, None, load)


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

        check_hub_reachable(dataset, "dataset", "hub_dataset")
        try:
            stream = datasets.load_dataset(dataset, subset or None, split="train", streaming=True)
        except Exception as e:
            raise DataError(f"cannot stream hub_dataset {dataset!r} subset {subset!r}: {type(e).__name__}: {e}. "
                            f"{OFFLINE_OPTIONS}") from e
        texts, t0 = [], time.time()
        for i, ex in enumerate(stream):
            if i >= n_docs:
                break
            if text_field not in ex:
                raise DataError(f"hub_dataset {dataset!r}: no field {text_field!r}; available: {', '.join(ex)}. "
                                f"Pass --text_field NAME")
            texts.append(ex[text_field] or "")
            if (i + 1) % 20000 == 0:
                log(f"data: streamed {i + 1}/{n_docs} documents ({time.time() - t0:.0f}s)")
        return datasets.Dataset.from_dict({"text": texts})

    return Source("hub", h.hexdigest(), desc, None, load)


def open_source(data_cfg, log=print) -> Source:
    """The Source for a DataConfig."""
    kind = data_cfg.source
    if kind == "stdlib":
        return stdlib_source(data_cfg.stdlib_max_bytes)
    if kind == "files":
        return files_source(list(data_cfg.paths), data_cfg.text_field)
    if kind == "hub":
        return hub_source(data_cfg.hub_dataset, data_cfg.hub_subset, int(data_cfg.hub_docs), data_cfg.text_field, log)
    raise DataError(f"source={kind!r}: choose stdlib, files or hub")
