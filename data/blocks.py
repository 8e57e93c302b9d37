"""Token blocks: tokenize documents, join them with EOS, cut into blocks, cache on disk.

A cache folder (BlockKey.folder) holds
  train.npy, val.npy   [n, seq_len + 1] uint16 (vocab <= 65535) or int32
  meta.json            the key, the source description, counts and the sha256 of both arrays
It is written under a hidden temporary name and renamed when complete, so an interrupted
preparation never leaves a folder that looks valid. On reuse the key in meta.json and the
arrays are checked; any mismatch raises DataError naming the folder and the fix instead of
being used.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.corpus import DataError
from utils.io import atomic_dir, atomic_write_text, sha256_file
from utils.progress import library_progress

FORMAT = 1
SPLIT_SEED = 0x5EED_DA7A  # fixed: the train/val split never depends on the training seed
TOKENIZE_NUM_PROC = None  # one process: two were slower on 2 cores (docs/data.md)
TOKENIZE_BATCH = 256


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.int32)


@dataclass(frozen=True)
class BlockKey:
    """Everything the token blocks depend on: the cache is built for one key and used only for it."""

    source_hash: str
    tokenizer_hash: str
    seq_len: int
    vocab_size: int
    eos_id: int
    val_frac: float

    def folder(self, cache_root: Path) -> Path:
        return Path(cache_root) / f"{self.source_hash[:12]}-{self.tokenizer_hash[:12]}-L{self.seq_len}"

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)

    def meta(self) -> dict:
        """The key as meta.json records it."""
        return {"format": FORMAT, **dataclasses.asdict(self), "dtype": self.dtype.name, "split_seed": SPLIT_SEED}

    def mismatches(self, meta: dict) -> list[str]:
        """The fields where a cache's meta.json differs from this key."""
        return [f"{k}={meta.get(k)!r} (requested {v!r})" for k, v in self.meta().items() if meta.get(k) != v]


def tokenize_documents(ds, backend, eos_id: int, fingerprint: str) -> np.ndarray:
    """All documents' token ids, each document followed by EOS, as one int32 array.

    `backend` is a `tokenizers.Tokenizer`; special-token text inside documents is encoded as
    plain text (a literal "<|endoftext|>" in a file does not become a separator).
    """
    import datasets
    import pyarrow.compute as pc
    from tokenizers import Tokenizer

    enc = Tokenizer.from_str(backend.to_str())
    enc.encode_special_tokens = True
    encode = getattr(enc, "encode_batch_fast", enc.encode_batch)

    def tokenize(batch):
        texts = batch["text"]
        keep = [i for i, t in enumerate(texts) if t]
        out: list[list[int]] = [[] for _ in texts]
        for i, e in zip(keep, encode([texts[i] for i in keep], add_special_tokens=False)):
            ids = e.ids
            ids.append(eos_id)
            out[i] = ids
        return {"ids": out}

    with library_progress(False):  # never a bar here: the log line after it says how long it took
        out = ds.map(tokenize, batched=True, batch_size=TOKENIZE_BATCH, num_proc=TOKENIZE_NUM_PROC,
                     remove_columns=ds.column_names, keep_in_memory=True, new_fingerprint=fingerprint,
                     features=datasets.Features({"ids": datasets.List(datasets.Value("int32"))}))
    flat = pc.list_flatten(out.data.column("ids"))
    return flat.to_numpy() if flat.num_chunks else np.zeros(0, np.int32)


def split_blocks(tokens: np.ndarray, seq_len: int, val_frac: float, dtype: np.dtype):
    """Cut into non-overlapping blocks of seq_len + 1 (the tail is dropped) and split them
    with a fixed permutation: val gets round(val_frac * n) blocks (at least 1), train the rest."""
    L = seq_len + 1
    n = len(tokens) // L
    if n < 2:
        raise DataError(f"the corpus has {len(tokens)} tokens = {n} block(s) of seq_len+1={L}; need at least 2 "
                        f"(one train, one val): add data or lower --seq_len")
    blocks = tokens[: n * L].reshape(n, L).astype(dtype)
    n_val = min(n - 1, max(1, int(round(val_frac * n))))
    perm = np.random.Generator(np.random.PCG64(SPLIT_SEED)).permutation(n)
    val_idx, train_idx = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    return blocks[train_idx], blocks[val_idx]


def write_blocks(folder: Path, train: np.ndarray, val: np.ndarray, meta: dict) -> None:
    """Write train.npy, val.npy and meta.json atomically into `folder` (which must not exist)."""
    with atomic_dir(folder) as tmp:
        for name, arr in (("train", train), ("val", val)):
            with open(tmp / f"{name}.npy", "wb") as f:
                np.save(f, np.ascontiguousarray(arr))
        full = {**meta, "n_train": int(len(train)), "n_val": int(len(val)),
                "train_sha256": sha256_file(tmp / "train.npy"), "val_sha256": sha256_file(tmp / "val.npy")}
        atomic_write_text(tmp / "meta.json", json.dumps(full, indent=2) + "\n")


def _cache_error(folder: Path, problem: str) -> DataError:
    return DataError(f"data cache {folder} cannot be used: {problem}. Fix: delete {folder} (it is rebuilt "
                     f"from the source) or pass another --cache_dir")


def load_blocks(folder: Path, key: BlockKey) -> tuple[np.ndarray, np.ndarray, dict]:
    """Memory-map train/val from `folder` after checking meta.json against `key` and the arrays
    against meta.json."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / "meta.json").read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise _cache_error(folder, f"meta.json is missing or unreadable ({e})") from e
    bad = key.mismatches(meta)
    if bad:
        raise _cache_error(folder, "meta.json does not match the requested settings: " + "; ".join(bad))
    arrays = []
    L = key.seq_len + 1
    for name in ("train", "val"):
        path = folder / f"{name}.npy"
        n = meta.get(f"n_{name}")
        if not isinstance(n, int) or n < 1:
            raise _cache_error(folder, f"meta.json has n_{name}={n!r}")
        if _sha256_file_safe(path) != meta.get(f"{name}_sha256"):
            raise _cache_error(folder, f"{name}.npy is missing or its contents changed (sha256 differs from meta.json)")
        try:
            arr = np.load(path, mmap_mode="c", allow_pickle=False)
        except Exception as e:
            raise _cache_error(folder, f"{name}.npy cannot be read ({type(e).__name__}: {e})") from e
        if arr.shape != (n, L) or arr.dtype != key.dtype:
            raise _cache_error(folder, f"{name}.npy has shape {arr.shape} dtype {arr.dtype}, meta.json says "
                                       f"({n}, {L}) {key.dtype.name}")
        arrays.append(arr)
    return arrays[0], arrays[1], meta


def _sha256_file_safe(path: Path) -> str | None:
    try:
        return sha256_file(path)
    except OSError:
        return None


def build_blocks(folder: Path, ds, backend, key: BlockKey, about: dict, log=print) -> None:
    """Tokenize `ds`, cut, split and write the cache folder for `key`; `about` adds descriptive
    fields to meta.json (source, tokenizer name) that are not part of the key."""
    t0 = time.time()
    tokens = tokenize_documents(ds, backend, key.eos_id, fingerprint=f"tok-{folder.name}")
    if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= key.vocab_size):
        raise DataError(f"token ids span [{tokens.min()}, {tokens.max()}], outside the tokenizer's "
                        f"{key.vocab_size} ids")
    t_tok = time.time() - t0
    train, val = split_blocks(tokens, key.seq_len, key.val_frac, key.dtype)
    write_blocks(folder, train, val, {**key.meta(), **about, "created": time.time(), "n_docs": len(ds),
                                      "n_tokens": int(len(tokens)), "tokenize_seconds": round(t_tok, 2)})
    log(f"data: tokenized {len(ds)} documents -> {len(tokens):,} tokens in {t_tok:.1f}s; "
        f"{len(train)} train + {len(val)} val blocks of {key.seq_len + 1} -> {folder}")
