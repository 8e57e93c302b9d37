"""--storage URI: a study's runs on Ray with no folder the nodes share (research.studies.executors, which hands its
Storage to the studies, and research.studies.ray_execution alone import this module; it imports no ray).

The storage is a folder pyarrow opens from a URI (file://, s3://, gs://). Each run keeps there what its run folder
holds, plus stored.json, written last, listing a complete copy (`RunStore`); a Ray task (`train_stored`) trains in its
node's user cache, resuming from the storage's newest checkpoint, uploads after each checkpoint (`RunSync`) and at
the end, and the driver downloads the run (`fetch`). `check_storage` opens the URI first (one line on failure) and
refuses a storage that serves another study (storage.json, `claim`) or a folder another tool owns; every path
stored.json names is checked (`check_manifest`) before any download. docs/studies.md, "On Ray".
"""
from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import re
import shutil
import tempfile
import urllib.parse
from pathlib import Path, PurePosixPath

from configs import ConfigError
from training.checkpoint import latest_checkpoint
from utils.cache import user_cache_root
from utils.deadline import first_line, within
from utils.errors import UserError, cut, shown
from utils.formats import FormatError, ListOf, Obj, Text, check
from utils.io import atomic_dir, atomic_write_bytes
from utils.owners import STORAGE_FORMAT, STORAGE_INDEX, STORAGE_KIND, refuse_foreign
from utils.run_names import CHECKPOINTS

STORED = "stored.json"  # a run's list of its stored files, written after them
CHECK_S = 60  # how long the check of a --storage may take before it is called unreachable
_MARKER = ".qk-keys-write-check"
_FORMS = "give file:///ABSOLUTE/PATH, s3://BUCKET/PATH or gs://BUCKET/PATH (nothing was started)"
_CHUNK = 1 << 20
_OTHER = "give this study another --storage location"
_DRIVE = re.compile(r"^[A-Za-z]:")  # a Windows drive letter (C:, c:foo)
STORED_FORMAT = Obj({"files": ListOf(Text("a path (text)", nullable=False)),
                     "checkpoints": ListOf(Text("a step folder (text)", nullable=False))},
                    "a JSON object (a run's stored files)")
# What to check where a storage cannot be written, by its kind: a local folder has no credentials
_WRITE_FIXES = {"file": "check that the path is a folder or can be made one, that you may write there and that its "
                        "disk has room",
                "s3": "check the credentials (AWS_ACCESS_KEY_ID or ~/.aws), that the bucket exists and that this "
                      "machine reaches it",
                "gs": "check the credentials (GOOGLE_APPLICATION_CREDENTIALS), that the bucket exists and that this "
                      "machine reaches it"}
_SILENT_FIXES = {"file": "check that its disk answers (a network mount that hangs)"}


class StorageError(UserError):
    """A run's copy could not be written to or read from the storage, or the storage cannot serve this study; the
    message names the URI (and the run, the entry) and the fix."""


@dataclasses.dataclass(frozen=True)
class Storage:
    """A study's --storage: its URI and the study it serves, as its storage.json records it (STORAGE_FORMAT)."""
    uri: str
    study: str  # the study's name
    kind: str  # its kind (utils.owners)
    out: str  # its --out, resolved

    @classmethod
    def of(cls, uri: str, study: str, kind: str, out: str | Path) -> Storage:
        return cls(uri, study, kind, str(Path(out).resolve()))

    def record(self) -> dict:
        return {"study": self.study, "kind": self.kind, "out": self.out}

    @functools.cached_property
    def root(self) -> RunStore:
        """The storage's own folder, through the runs' API (storage.json is read and written as a run's files are)."""
        return RunStore(self.uri, "")

    def served(self) -> dict | None:
        """The study its storage.json names; None where it has none (a new storage); StorageError where that file
        cannot be read."""
        try:
            record = json.loads(self.root.read(STORAGE_INDEX))
            check(STORAGE_FORMAT, record)
        except FileNotFoundError:
            return None
        except (ValueError, FormatError) as e:  # ValueError: not JSON, or not UTF-8
            raise StorageError(f"--storage {cut(self.uri, 100)}: its {STORAGE_INDEX}, the study it serves, cannot "
                               f"be read ({first_line(e)}): restore it, or {_OTHER} (nothing was written)") from None
        return record

    def refuse_other(self, record: dict | None) -> None:
        """StorageError where the storage serves a study other than this one (another name, kind or --out)."""
        if record is None or record == self.record():
            return
        raise StorageError(f"--storage {cut(self.uri, 100)} serves the study {record['study']!r} (kind "
                           f"{record['kind']}, --out {record['out']}: its {STORAGE_INDEX}), not {self.study!r} "
                           f"(kind {self.kind}, --out {self.out}); nothing was written. Fix: {_OTHER}")

    def claim(self) -> None:
        """The driver, before the first upload: storage.json written where there is none, then read back; the one
        there must name this study."""
        try:
            if self.served() is None:
                self.root.put_bytes((json.dumps(self.record(), indent=1) + "\n").encode(), STORAGE_INDEX)
            record = self.served()
        except OSError as e:
            raise StorageError(f"--storage {cut(self.uri, 100)}: cannot write its {STORAGE_INDEX} "
                               f"({first_line(e)}); nothing was trained") from None
        self.refuse_other(record)


def open_storage(uri: str):
    """(pyarrow filesystem, base path) of a --storage URI; ConfigError in one line where pyarrow cannot open it."""
    scheme = uri.partition("://")[0]
    if "://" not in uri or not scheme:
        raise ConfigError(f"--storage {cut(uri, 100)}: not a URI: {_FORMS}")
    encoded = urllib.parse.quote(uri, safe=":/?#[]@!$&'()*+,;=%~")
    if encoded != uri:  # a space, a letter outside ASCII: a URI writes them percent-encoded, which pyarrow decodes
        raise ConfigError(f"--storage {cut(uri, 100)}: a URI writes a space or a letter outside ASCII "
                          f"percent-encoded: give {cut(encoded, 200)} (nothing was started)")
    import pyarrow.fs
    try:
        return pyarrow.fs.FileSystem.from_uri(uri)
    except NotImplementedError as e:
        raise ConfigError(f"--storage {cut(uri, 100)}: this pyarrow has no {scheme}:// filesystem "
                          f"({first_line(e)}): {_FORMS}") from None
    except ValueError as e:  # ArrowInvalid: an unknown scheme, a relative file:// path
        raise ConfigError(f"--storage {cut(uri, 100)}: pyarrow cannot read this URI ({first_line(e)}): "
                          f"{_FORMS}") from None
    except OSError as e:  # a library it cannot load (hdfs), a region it cannot resolve (s3)
        raise ConfigError(f"--storage {cut(uri, 100)}: cannot be opened ({first_line(e)}): check the URI, the "
                          f"network and the credentials (nothing was started)") from None


def check_storage(storage: Storage, timeout_s: float = CHECK_S) -> None:
    """The storage can serve this study: a file:// folder owned by no other tool and apart from --out
    (`_check_local`), one that serves no other study (its storage.json), and one that takes a file: a marker written
    under it and deleted, all within `timeout_s` (the URI's opening included: pyarrow asks s3 for a bucket's region).
    One line otherwise (ConfigError: missing credentials, a bucket that does not exist, a network that does not reach
    it, each with the fix of its kind of storage; StorageError, OwnerError), before anything is written."""
    uri = storage.uri
    scheme = uri.partition("://")[0].lower()

    def write_and_delete() -> None:
        fs, base = open_storage(uri)
        import pyarrow.fs
        if isinstance(fs, pyarrow.fs.LocalFileSystem):
            _check_local(storage, Path(base))
        storage.refuse_other(storage.served())
        fs.create_dir(base, recursive=True)
        marker = f"{base.rstrip('/')}/{_MARKER}"
        with fs.open_output_stream(marker) as f:
            f.write(b"qk-keys: --storage write check\n")
        fs.delete_file(marker)
    try:
        within(timeout_s, write_and_delete)
    except UserError:  # told as raised: the URI, another study's storage, another tool's folder
        raise
    except TimeoutError:
        fix = _SILENT_FIXES.get(scheme, "check the network and the address")
        raise ConfigError(f"--storage {cut(uri, 100)}: no answer within {timeout_s:g} s while writing a test file "
                          f"there: {fix} (nothing was started)") from None
    except OSError as e:
        fix = _WRITE_FIXES.get(scheme, "check the URI, the credentials and that this machine reaches it")
        raise ConfigError(f"--storage {cut(uri, 100)}: cannot write there ({first_line(e)}): {fix} (nothing was "
                          f"started)") from None


def _check_local(storage: Storage, folder: Path) -> None:
    """A file:// storage's folder: not --out, not inside it nor around it (the runs' copies and the study's own
    folders would be one), and no other tool's (utils.owners: another study's folder, a run's, a report's)."""
    here, out = folder.resolve(), Path(storage.out)
    if here == out or out in here.parents or here in out.parents:
        where = "is --out itself" if here == out else "is inside --out" if out in here.parents else "holds --out"
        raise StorageError(f"--storage {cut(storage.uri, 100)} {where} ({out}): the runs' stored copies and the "
                           f"study's folder must be apart; {_OTHER}, outside --out (nothing was written)")
    refuse_foreign(folder, STORAGE_KIND, f"--storage {cut(storage.uri, 100)}", fix=_OTHER)


def _copy(src, dst) -> None:
    shutil.copyfileobj(src, dst, _CHUNK)


def _local_files(folder: Path) -> list[str]:
    """The run folder's files, as POSIX paths relative to it, without hidden names (.lock, .tmp-*, .pruning-*)."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = Path(root).relative_to(folder)
        found += [(rel / f).as_posix() for f in sorted(files) if not f.startswith(".")]
    return found


def _bad_path(rel: str) -> str | None:
    """Why a path read from a storage cannot be a file inside its run folder (None where it can): only plain
    relative POSIX paths of visible names, as RunSync stores them."""
    if not rel:
        return "an empty path"
    if rel.startswith("/"):
        return "an absolute path"
    if "\\" in rel or _DRIVE.match(rel):
        return "a Windows path (a backslash or a drive letter)"
    if "\0" in rel:
        return "a NUL character"
    parts = rel.split("/")
    if ".." in parts:
        return "a '..' part"
    if any(part in ("", ".") for part in parts):
        return "an empty or '.' part"
    if any(part.startswith(".") for part in parts):
        return "a hidden name, which no run stores"
    return None


def check_manifest(manifest, store: RunStore, folder: Path | None = None) -> dict:
    """A stored.json read from the storage (or returned by a run's task) as a file list RunSync writes: its form,
    every file a plain relative path that stays inside the run folder (resolved in `folder`, where given: a link
    there counts), and every checkpoint one step folder's name. StorageError in one line naming the storage, the
    run, the entry and the fix otherwise, before anything of the run is downloaded."""
    where = f"--storage {cut(store.uri, 100)}: the run {store.rel}'s {STORED}"
    fix = f"correct or delete that {STORED} in the storage, or {_OTHER} (nothing was downloaded)"
    try:
        check(STORED_FORMAT, manifest)
    except FormatError as e:
        raise StorageError(f"{where} is not a list of stored files ({e}): {fix}") from None
    inside = folder.resolve() if folder is not None else None
    entries = [(rel, "") for rel in manifest["files"]] + [(step, " (a checkpoint)") for step in
                                                           manifest["checkpoints"]]
    for rel, what in entries:
        why = _bad_path(rel) or ("not one folder name" if what and "/" in rel else None)
        if why is None and inside is not None:
            target = (inside / CHECKPOINTS / rel) if what else (inside / rel)
            if not target.resolve().is_relative_to(inside):
                why = "a path that leads out through a link in the run folder"
        if why:
            raise StorageError(f"{where} lists {shown(rel, 120)}{what}, {why}: it would be written outside the run "
                               f"folder; {fix}")
    return manifest


def _checkpoint_of(rel: str) -> str | None:
    """The step folder a run file belongs to (checkpoints/step-N/...), None for the other files."""
    parts = PurePosixPath(rel).parts
    return parts[1] if len(parts) > 2 and parts[0] == CHECKPOINTS else None


@dataclasses.dataclass(frozen=True)
class RunStore:
    """One run's copy in the storage: `uri` the study's --storage, `rel` the run folder's path in the study folder."""
    uri: str
    rel: str

    @functools.cached_property
    def _fs(self):
        fs, base = open_storage(self.uri)
        return fs, base.rstrip("/") + (f"/{self.rel}" if self.rel else "")

    def __reduce__(self):  # without the opened filesystem: each node opens the URI with its own credentials
        return RunStore, (self.uri, self.rel)

    def _path(self, rel: str) -> str:
        return f"{self._fs[1]}/{rel}"

    def manifest(self) -> dict | None:
        """stored.json: {"files": [...], "checkpoints": [step folders, oldest first]}, None where nothing is stored;
        StorageError where it is not one (check_manifest)."""
        try:
            data = self.read(STORED)
        except FileNotFoundError:
            return None
        try:
            manifest = json.loads(data)
        except ValueError as e:  # not JSON, or not UTF-8
            raise StorageError(f"--storage {cut(self.uri, 100)}: the run {self.rel}'s {STORED} cannot be read "
                               f"({first_line(e)}): correct or delete it in the storage, or {_OTHER}") from None
        return check_manifest(manifest, self)

    def put(self, local: Path, rel: str) -> None:
        """Upload one file; a local storage's file is written beside and renamed (an object store's put is whole)."""
        with open(local, "rb") as src:
            self._put(src, rel)

    def put_bytes(self, data: bytes, rel: str) -> None:
        """Upload a small file from memory, as `put` does a file."""
        self._put(io.BytesIO(data), rel)

    def _put(self, src, rel: str) -> None:
        import pyarrow.fs
        fs, _ = self._fs
        target = self._path(rel)
        fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        atomic = isinstance(fs, pyarrow.fs.LocalFileSystem)
        with fs.open_output_stream(target + ".part" if atomic else target) as dst:
            _copy(src, dst)
        if atomic:
            fs.move(target + ".part", target)

    def put_manifest(self, manifest: dict) -> None:
        self.put_bytes((json.dumps(manifest, indent=1) + "\n").encode(), STORED)

    def delete_checkpoint(self, step: str) -> None:
        fs, _ = self._fs
        fs.delete_dir(self._path(f"{CHECKPOINTS}/{step}"))

    def get(self, rel: str, local: Path) -> None:
        fs, _ = self._fs
        local.parent.mkdir(parents=True, exist_ok=True)
        with fs.open_input_stream(self._path(rel)) as src, open(local, "wb") as dst:
            _copy(src, dst)

    def read(self, rel: str) -> bytes:
        fs, _ = self._fs
        with fs.open_input_stream(self._path(rel)) as f:
            return f.read()

    def download(self, folder: Path) -> int | None:
        """A new run folder filled with what a resume needs: every stored file but the checkpoints, and the newest
        checkpoint. Returns the number of files, None where the storage holds nothing of this run. Every path of
        stored.json is checked before the first file is written (check_manifest)."""
        manifest = self.manifest()
        if manifest is None:
            return None
        check_manifest(manifest, self, folder)
        newest = manifest["checkpoints"][-1:]
        wanted = [f for f in manifest["files"] if _checkpoint_of(f) in (None, *newest)]
        for rel in wanted:
            self.get(rel, folder / rel)
        return len(wanted)


class RunSync:
    """Keeps a run's copy in the storage up to date with its local folder: called after each checkpoint the trainer
    writes (StudyRun.after_checkpoint) and at the end. Uploads the new checkpoints and the files changed since the
    last call, then stored.json, then deletes the checkpoints the run pruned; returns stored.json."""

    def __init__(self, store: RunStore, folder: Path):
        self.store, self.folder = store, Path(folder)
        manifest = store.manifest() or {"files": [], "checkpoints": []}
        self.stored = set(manifest["checkpoints"])
        self.sent: dict[str, tuple[int, int]] = {}  # file -> (size, mtime_ns) as uploaded by this process

    def __call__(self, checkpoint: Path | None = None) -> dict:
        try:
            return self._sync()
        except OSError as e:  # a UserError: the trainer would blame its own disk for an OSError
            raise StorageError(f"--storage {cut(self.store.uri, 100)}: cannot upload the run {self.store.rel} "
                               f"({first_line(e)}); its copy there is the one before (its {STORED})") from None

    def _sync(self) -> dict:
        files = _local_files(self.folder)
        steps = sorted({s for f in files if (s := _checkpoint_of(f))})
        for rel in files:  # the checkpoints first: stored.json names only what is complete
            step = _checkpoint_of(rel)
            if step is not None and step not in self.stored:
                self.store.put(self.folder / rel, rel)
        for rel in files:
            if _checkpoint_of(rel) is None:
                stat = (self.folder / rel).stat()
                if self.sent.get(rel) != (stat.st_size, stat.st_mtime_ns):
                    self.store.put(self.folder / rel, rel)
                    self.sent[rel] = (stat.st_size, stat.st_mtime_ns)
        manifest = {"files": files, "checkpoints": steps}
        self.store.put_manifest(manifest)
        for step in sorted(self.stored - set(steps)):
            self.store.delete_checkpoint(step)
        self.stored = set(steps)
        return manifest


def run_stores(storage: Storage | None, runs: list, out: Path) -> list[RunStore | None]:
    """The driver, before the tasks start: the storage claimed for this study (Storage.claim), each run's copy in it
    (None each without --storage), seeded from --out where the study folder holds the run further on (`seed`)."""
    if storage is None:
        return [None] * len(runs)
    storage.claim()
    uri = storage.uri
    stores = [RunStore(uri, run.run_dir.relative_to(out).as_posix()) for run in runs]
    for run, store in zip(runs, stores):
        try:
            seed(store, run.run_dir)
        except OSError as e:
            raise StorageError(f"--storage {cut(uri, 100)}: cannot upload {run.run_dir}, further on than its copy "
                               f"there ({first_line(e)}); nothing was trained") from None
    return stores


def seed(store: RunStore, run_dir: Path) -> None:
    """Before a run's task starts: where the study folder holds a run further on than the storage's copy (a study
    started without --storage), upload it, so that the task continues it."""
    if not run_dir.is_dir() or not _local_files(run_dir):
        return
    here = latest_checkpoint(run_dir / CHECKPOINTS)
    manifest = store.manifest()
    stored = manifest["checkpoints"][-1] if manifest and manifest["checkpoints"] else None
    if manifest is None or (here is not None and (stored is None or here.path.name > stored)):
        RunSync(store, run_dir)()


def train_stored(run, train, store: RunStore):
    """One run in a Ray task with --storage: in a new folder of this node's user cache, resumed from the stored
    copy where there is one, uploaded after each checkpoint and at the end. Returns (summary, stored.json)."""
    work = user_cache_root() / "runs"
    work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=work, prefix="run-"))
    try:
        local = work / store.rel
        try:
            store.download(local)
        except OSError as e:
            raise StorageError(f"--storage {cut(store.uri, 100)}: cannot download the run {store.rel} "
                               f"({first_line(e)})") from None
        sync = RunSync(store, local)
        summary = train(dataclasses.replace(run, run_dir=local, after_checkpoint=sync), None)
        return summary, sync()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fetch(store: RunStore | None, manifest: dict | None, run_dir: Path) -> None:
    """The driver: the run's stored files written into its folder in the study folder, each checkpoint as a whole
    (utils.io.atomic_dir), each other file atomically; nothing without --storage (`store` None)."""
    if store is None:
        return
    try:
        _fetch(store, manifest, run_dir)
    except OSError as e:
        raise StorageError(f"--storage {cut(store.uri, 100)}: cannot copy the run {store.rel} into {run_dir} "
                           f"({first_line(e)}); it is kept there: the same command copies it") from None


def _fetch(store: RunStore, manifest: dict, run_dir: Path) -> None:
    check_manifest(manifest, store, run_dir)  # the task's list: every path, before the first file is written
    for step in manifest["checkpoints"]:
        final = run_dir / CHECKPOINTS / step
        if final.is_dir():
            continue  # the same step, already here (the run was seeded from this folder)
        with atomic_dir(final) as tmp:
            for rel in (f for f in manifest["files"] if _checkpoint_of(f) == step):
                store.get(rel, tmp / PurePosixPath(rel).name)
    for rel in (f for f in manifest["files"] if _checkpoint_of(f) is None):
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(run_dir / rel, store.read(rel))
