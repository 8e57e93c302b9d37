"""Data preparation, one way through: source -> tokenizer -> token blocks -> cache.

    data = prepare_data(cfg)           # on rank 0 first, then (after a barrier) on the others

Everything expensive is cached under cfg.data.cache_dir (by default the user cache's data/ folder, utils.cache)
and keyed by content hashes (blocks.BlockKey), so a second call with the same settings only hashes the source
and checks the cache; where the cache lives is no part of a run's identity. See corpus.py (sources),
tokenizer.py and blocks.py (cache format). One process at a time looks up or builds a cache folder (a lock on
the cache root; others wait), so what a killed build left (.work-* scratch folders, .tmp-* half-written cache
folders) can be removed safely before building.
"""
from __future__ import annotations

import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from data.blocks import BlockKey, build_blocks, load_blocks, token_dtype
from data.corpus import open_source
from data.source import DataError, Documents, Source
from data.tokenizer import TOKENIZER_FOLDER, TokenizerInfo, corpus_bytes, get_tokenizer
from utils.cache import cache_dir
from utils.io import remove_matching, temp_dir_pattern
from utils.lock import FolderLock
from utils.progress import library_progress

# What an interrupted preparation leaves: _LazyCorpus scratch folders and atomic_dir temporaries of
# block folders (<hash12>-<hash12>-L<seq_len>) and of tokenizer folders (bpe-v1-..., hub-...).
_WORK = re.compile(r"^\.work-[A-Za-z0-9_]+$")
_BLOCKS_TMP = temp_dir_pattern(r"[0-9a-f]{12}-[0-9a-f]{12}-L\d+")
_TOKENIZER_TMP = temp_dir_pattern(r"bpe-v\d+-[0-9a-f]{12}-V\d+|gguf-[0-9a-f]{12}|hub-[A-Za-z0-9._-]+")


@dataclass
class TokenData:
    train: torch.Tensor  # [N_train, seq_len + 1] uint16 (vocab <= 65535) or int32: train.npy memory-mapped, no copy
    val: torch.Tensor  # [N_val, seq_len + 1], the same
    tokenizer_dir: Path  # loadable by transformers.AutoTokenizer.from_pretrained
    vocab_size: int  # len(tokenizer)
    source_hash: str
    tokenizer_hash: str
    cache_dir: Path  # the blocks folder holding train.npy, val.npy, meta.json
    eos_id: int = 0
    n_tokens: int = 0  # tokens in the whole tokenized corpus (before cutting into blocks)
    corpus: str = ""  # the source's short name: english-v1, stdlib-3.11.7, files, hub ...
    tokenizer_name: str = ""  # what was asked for: bpe, a folder, a .gguf file, smollm2-gguf, a Hub id

    @property
    def seq_len(self) -> int:
        return int(self.train.shape[1]) - 1


def data_usage(cfg, data: TokenData) -> tuple[dict, list[str]]:
    """What a run of `cfg` takes from `data`, and a sentence for each way the corpus is too small.

    The dict goes into summary.json and results.json ("data"): the corpus, both hashes, the training
    tokens available and how many passes the run makes over them, and the validation and probe
    sequences actually used (the probe takes the first probe_batch validation blocks; a run asking for more
    than there are is refused by research.probing.callback). Nothing here changes the run: it says what the
    run does.
    """
    T = data.seq_len
    n_train, n_val = int(data.train.shape[0]), int(data.val.shape[0])
    train_tokens = n_train * T
    asked = int(cfg.train.tokens)
    passes = asked / train_tokens
    eval_rows = cfg.train.eval_batches * cfg.train.batch_size
    probe_rows = min(cfg.probe.probe_batch, n_val) if cfg.probe.probe_every else 0
    usage = {"corpus": data.corpus, "source_hash": data.source_hash, "tokenizer": data.tokenizer_name,
             "tokenizer_hash": data.tokenizer_hash, "train_blocks": n_train, "val_blocks": n_val,
             "train_tokens_available": train_tokens, "run_tokens": asked, "passes_over_train": round(passes, 4),
             "eval_sequences": min(eval_rows, n_val), "probe_sequences": probe_rows}
    notes = []
    if asked > train_tokens:
        notes.append(f"the run asks for {asked:,} training tokens but the corpus has {train_tokens:,} "
                     f"({n_train} blocks of {T}): it repeats its data, {passes:.2f} passes over every block")
    if n_val < eval_rows:
        notes.append(f"validation asks for eval_batches x batch_size = {eval_rows} sequences but there are {n_val}: "
                     f"the validation loss averages {n_val} distinct blocks, some counted more than once")
    return usage, notes


def _tensor(a: np.ndarray) -> torch.Tensor:
    # a copy-on-write memmap, not copied (a uint16 copy to int32 took 4 bytes a token of memory): readers widen
    # the rows they take (BlockLoader: .long())
    return torch.from_numpy(a)


# Bytes of text per token that the disk check assumes: fewer than a BPE gives at this project's vocabularies (at
# vocab 4096: 2.8 on the generated text of docs/data.md, 3.1 on Shakespeare, 3.3 on english-v1, 3.5 on the stdlib),
# so it rather overstates the blocks' size. A byte-level BPE never gives fewer than 1.
TEXT_BYTES_PER_TOKEN = 2


def blocks_disk_need(text_bytes: int, scratch_bytes: int, vocab_size: int, val_frac: float) -> int:
    """Bytes of disk a preparation takes at most while building: the token stream and the validation blocks (at
    TEXT_BYTES_PER_TOKEN, at the width of vocab_size's ids), the source's scratch copy, 1 MB for the rest."""
    tokens = -(-text_bytes // TEXT_BYTES_PER_TOKEN)
    return int(tokens * token_dtype(vocab_size).itemsize * (1 + val_frac)) + scratch_bytes + 10**6


def _size(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 10**9 else f"{n / 1e6:,.1f} MB"


def check_disk(root: Path, source: Source, text_bytes: int, vocab_size: int, val_frac: float) -> None:
    """Refuse, before the work, a corpus whose token blocks would not fit on the disk of `root`."""
    need = blocks_disk_need(text_bytes, source.scratch_bytes, vocab_size, val_frac)
    free = shutil.disk_usage(root).free
    if need > free:
        scratch = f" and a {_size(source.scratch_bytes)} working copy" if source.scratch_bytes else ""
        raise DataError(f"not enough disk for the token blocks: {source.description} needs about {_size(need)} in "
                        f"{root} ({_size(text_bytes)} of text, {token_dtype(vocab_size).itemsize} bytes a "
                        f"token{scratch}), {_size(free)} free. Fix: free space there, or pass --cache_dir on a disk "
                        f"with room")


class _LazyCorpus:
    """The source's documents (Source.documents) on first use, after the disk check (check_disk, with the
    model's vocab_size: the tokenizer's is at most that), in a scratch folder removed by close()."""

    def __init__(self, source: Source, root: Path, vocab_size: int, val_frac: float):
        self.source, self.root = source, root
        self.vocab_size, self.val_frac = vocab_size, val_frac
        self._docs, self._work = None, None

    def __call__(self) -> Documents:
        if self._docs is None:
            self.root.mkdir(parents=True, exist_ok=True)
            if self.source.n_bytes is not None:
                check_disk(self.root, self.source, self.source.n_bytes, self.vocab_size, self.val_frac)
            self._work = Path(tempfile.mkdtemp(dir=self.root, prefix=".work-"))
            docs = self.source.documents(self._work)
            if self.source.n_bytes is None:  # the hub: its size is known once streamed
                check_disk(self.root, self.source, corpus_bytes(docs), self.vocab_size, self.val_frac)
            self._docs = docs
        return self._docs

    def close(self) -> None:
        self._docs = None
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)


def prepare_data(cfg, log: Callable[[str], None] = print, progress: bool = True) -> TokenData:
    """Source -> tokenizer -> blocks, each step cached under cfg.data.cache_dir.

    Only one process should build (call it on rank 0, barrier, then on the other ranks:
    they hit the cache). Raises DataError with the cause and the fix on any failure. progress=False
    (--no_progress): no progress bar of the libraries (datasets, Hub downloads: utils.progress).
    """
    t0 = time.time()
    dc = cfg.data
    root = cache_dir(dc.cache_dir, "data")
    source = open_source(dc, log)
    lock = FolderLock(root, hint="choose another --cache_dir")
    with library_progress(progress), lock.acquire(wait=True, on_wait=log, read_only_ok=True):
        if lock.key is not None:
            remove_orphans(root, log)
        return _prepare(cfg, root, source, t0, log)


def remove_orphans(root: Path, log: Callable[[str], None] = print) -> list[Path]:
    """Remove scratch and temporary folders a killed preparation left (call with the cache root locked)."""
    removed = remove_matching(root, _WORK) + remove_matching(root, _BLOCKS_TMP)
    removed += remove_matching(root / TOKENIZER_FOLDER, _TOKENIZER_TMP)
    for p in removed:
        log(f"data: removed {p} (left by an interrupted preparation)")
    return removed


def _prepare(cfg, root: Path, source: Source, t0: float, log) -> TokenData:
    dc = cfg.data
    corpus = _LazyCorpus(source, root, cfg.model.vocab_size, dc.val_frac)
    try:
        tk: TokenizerInfo = get_tokenizer(dc, cfg.model.vocab_size, source, corpus, root, log)
        key = BlockKey(source_hash=source.source_hash, tokenizer_hash=tk.tokenizer_hash, seq_len=dc.seq_len,
                       vocab_size=tk.vocab_size, eos_id=tk.eos_id, val_frac=dc.val_frac)
        folder = key.folder(root)
        hit = folder.exists()
        if not hit:
            about = {"source": dc.source, "source_description": source.description, "tokenizer": tk.name,
                     "tokenizer_dir": str(tk.directory)}
            build_blocks(folder, corpus(), tk.tokenizer.backend_tokenizer, key, about, log)
    finally:
        corpus.close()
    train, val, meta = load_blocks(folder, key)
    data = TokenData(train=_tensor(train), val=_tensor(val), tokenizer_dir=tk.directory, vocab_size=tk.vocab_size,
                     source_hash=source.source_hash, tokenizer_hash=tk.tokenizer_hash, cache_dir=folder,
                     eos_id=tk.eos_id, n_tokens=int(meta.get("n_tokens", 0)), corpus=source.name,
                     tokenizer_name=tk.name)
    log(f"data: {'cache hit' if hit else 'built'} {folder} | {source.description} | tokenizer {tk.name} "
        f"(vocab {tk.vocab_size}) | {len(train)} train + {len(val)} val blocks of {dc.seq_len + 1} "
        f"({data.n_tokens:,} tokens) | {time.time() - t0:.1f}s")
    return data
