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
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from data.source import DataError
from utils.errors import is_disk_full, os_problem
from utils.file_specs import BLOCKS_META, BLOCKS_META_FORMAT
from utils.formats import FormatError, check
from utils.io import atomic_dir, atomic_write_text, sha256_file

FORMAT = 1
SPLIT_SEED = 0x5EED_DA7A  # fixed: the train/val split never depends on the training seed
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


# Documents are tokenized in pieces of about PIECE_CHARS characters (cut_points), in batches of about BATCH_CHARS, and
# their ids go to a file as they come: the tokenizer's working memory (its encodings took ~200 bytes per character of
# a whole document) is bounded by the batch, not by the corpus or its longest document (docs/data.md, "Memory").
PIECE_CHARS = 1 << 16
BATCH_CHARS = 1 << 20
WRITE_BLOCKS = 1 << 14  # blocks moved within train.npy / copied to val.npy at a time


def _not_space(c: str) -> bool:
    return not c.isspace()


# Where a piece may end: before a line break that follows a character of this kind. GPT-2 style pre-tokenizers never
# join a non-space character with the whitespace after it; Llama-3 style ones join punctuation with the line breaks
# after it, but never a letter or digit. splits_at_lines picks the first rule that a tokenizer keeps.
CUT_RULES = (_not_space, str.isalnum)


def cut_points(text: str, size: int = PIECE_CHARS, after=_not_space) -> list[int]:
    """Where a long text may be cut into pieces of about `size` characters without changing its tokens: before a
    line break whose preceding character passes `after` (one of CUT_RULES). No pre-token of a tokenizer that keeps
    the rule spans such a cut, so the pieces' tokens joined are the text's. A line longer than `size` stays whole."""
    cuts, start, n = [], 0, len(text)

    def ok(cut: int) -> bool:
        return after(text[cut - 1])

    while n - start > size:
        cut = text.rfind("\n", start + 1, start + size)
        while cut > start and not ok(cut):
            cut = text.rfind("\n", start + 1, cut)
        if cut <= start:  # no cut in the window: the first one after it
            cut = text.find("\n", start + size)
            while cut != -1 and not ok(cut):
                cut = text.find("\n", cut + 1)
            if cut == -1:
                break
        cuts.append(cut)
        start = cut
    return cuts


def pieces(text: str, size: int = PIECE_CHARS, after=_not_space) -> list[str]:
    """`text` cut at cut_points (one piece for a short text)."""
    bounds = [0, *cut_points(text, size, after), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def stream_pieces(segments: Iterable[str], size: int | None = None, after=_not_space) -> Iterator[str]:
    """The text that `segments` joined make, cut at cut_points into pieces of about `size` characters (PIECE_CHARS
    when None), reading one segment at a time: memory holds a segment and the piece not yet finished. The pieces may
    end elsewhere than pieces() of the whole would end them, always at a cut_point, so their tokens joined are the
    same. A line longer than `size` stays whole (however long: the one case where memory grows with the text)."""
    size = PIECE_CHARS if size is None else size
    held: list[str] = []  # text after the last cut; joined only when a line break may have brought a cut
    held_chars = 0
    for seg in segments:
        if not seg:
            continue
        held.append(seg)
        held_chars += len(seg)
        if "\n" not in seg or held_chars <= size:
            continue
        text = "".join(held)
        start = 0
        for cut in cut_points(text, size, after):
            yield text[start:cut]
            start = cut
        held, held_chars = [text[start:]], len(text) - start
    if held_chars:
        yield from pieces("".join(held), size, after)


_SPLIT_PROBE = ("First line, it's here\n\n  indented 12345 x\nend.\r\nwin\tok\n\n\nÜber façade 日本語\n"
                "gamma,\ndelta;\n\nx = f(1)\n    return {a}\na<|endoftext|>b\n'tis     spaced\nlast ✓\nend")


def splits_at_lines(enc):
    """The first of CUT_RULES under which `enc` (a tokenizers.Tokenizer) gives a text's ids for its pieces joined,
    else None: the first rule for byte-level BPEs without a normalizer (this project's, GPT-2's, SmolLM2's); None
    where a normalizer or a prefix added to every input would change a piece's first token. A tokenizer without a
    rule gets whole documents, as does one with an added token that holds a line break after other text (it could
    span a cut anywhere)."""
    added = enc.get_added_tokens_decoder().values()
    if any("\n" in t.content.lstrip("\n") for t in added if not (t.special and enc.encode_special_tokens)):
        return None
    whole = enc.encode(_SPLIT_PROBE, add_special_tokens=False).ids
    for rule in CUT_RULES:
        cuts = cut_points(_SPLIT_PROBE, 1, rule)
        pairs = enc.encode_batch([part for c in cuts for part in (_SPLIT_PROBE[:c], _SPLIT_PROBE[c:])],
                                 add_special_tokens=False)
        if cuts and all(a.ids + b.ids == whole for a, b in zip(pairs[::2], pairs[1::2])):
            return rule
    return None


def _with_last(items: Iterable) -> Iterator[tuple[object, bool]]:
    """(item, whether it is the last one) for each item."""
    it = iter(items)
    for prev in it:
        for item in it:
            yield prev, False
            prev = item
        yield prev, True


def token_chunks(docs: Iterable[Iterable[str]], backend, eos_id: int) -> Iterator[np.ndarray]:
    """Every document's token ids, each document followed by EOS (an empty one adds nothing), in order, as int32
    arrays of about BATCH_CHARS characters' worth. `docs`: each document as an iterable of text segments that joined
    are the document (data.source.Documents; a list of [text] will do), read one segment at a time.

    `backend` is a `tokenizers.Tokenizer`; special-token text inside documents is encoded as plain text (a literal
    "<|endoftext|>" in a file does not become a separator).
    """
    from tokenizers import Tokenizer

    enc = Tokenizer.from_str(backend.to_str())
    enc.encode_special_tokens = True
    encode = getattr(enc, "encode_batch_fast", enc.encode_batch)
    rule = splits_at_lines(enc)
    batch: list[str] = []
    ends: list[bool] = []  # whether batch[i] is a document's last piece (EOS follows it)
    chars = 0

    def flush() -> np.ndarray:
        ids: list[int] = []
        for e, last in zip(encode(batch, add_special_tokens=False), ends):
            ids += e.ids
            if last:
                ids.append(eos_id)
        batch.clear()
        ends.clear()
        return np.asarray(ids, dtype=np.int32)

    for doc in docs:
        # a tokenizer without a cut rule gets the whole document (memory grows with the longest document)
        parts = stream_pieces(doc, PIECE_CHARS, rule) if rule else [t for t in ["".join(doc)] if t]
        for part, last in _with_last(parts):
            batch.append(part)
            ends.append(last)
            chars += len(part)
            if chars >= BATCH_CHARS:
                yield flush()
                chars = 0
    if batch:
        yield flush()


def tokenize_documents(docs: Iterable[Iterable[str]], backend, eos_id: int) -> np.ndarray:
    """All of token_chunks as one int32 array (for a corpus that fits in memory; build_blocks streams instead)."""
    chunks = list(token_chunks(docs, backend, eos_id))
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int32)


def val_blocks(n: int, L: int, n_tokens: int, val_frac: float) -> np.ndarray:
    """The validation blocks' indices, sorted: the first round(val_frac * n) (at least 1, at most n - 1) of a fixed
    permutation of the n blocks (numpy's PCG64 seeded with SPLIT_SEED, as every cache has been split). The
    permutation is held as int32 while it is drawn: 4 bytes a block, the one part of data preparation that grows with
    the corpus (docs/data.md, "Memory")."""
    if n < 2:
        raise DataError(f"the corpus has {n_tokens} tokens = {n} block(s) of seq_len+1={L}; need at least 2 "
                        f"(one train, one val): add data or lower --seq_len")
    n_val = min(n - 1, max(1, int(round(val_frac * n))))
    perm = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    np.random.Generator(np.random.PCG64(SPLIT_SEED)).shuffle(perm)  # permutation(n)'s draws, in half the memory
    return np.sort(perm[:n_val]).astype(np.int64)


def _split_index(n: int, L: int, n_tokens: int, val_frac: float) -> tuple[np.ndarray, np.ndarray]:
    """The blocks' split: (train, val) block indices, each sorted (val_blocks)."""
    val = val_blocks(n, L, n_tokens, val_frac)
    return np.setdiff1d(np.arange(n), val, assume_unique=True), val


def split_blocks(tokens: np.ndarray, seq_len: int, val_frac: float, dtype: np.dtype):
    """Cut into non-overlapping blocks of seq_len + 1 (the tail is dropped) and split them
    with a fixed permutation: val gets round(val_frac * n) blocks (at least 1), train the rest."""
    L = seq_len + 1
    n = len(tokens) // L
    train_idx, val_idx = _split_index(n, L, len(tokens), val_frac)
    blocks = tokens[: n * L].reshape(n, L).astype(dtype)
    return blocks[train_idx], blocks[val_idx]


def write_blocks(folder: Path, train: np.ndarray, val: np.ndarray, meta: dict) -> None:
    """Write train.npy, val.npy and meta.json atomically into `folder` (which must not exist)."""
    with atomic_dir(folder) as tmp:
        for name, arr in (("train", train), ("val", val)):
            with open(tmp / f"{name}.npy", "wb") as f:
                np.save(f, np.ascontiguousarray(arr))
        _write_meta(tmp, meta, len(train), len(val))


def _write_meta(tmp: Path, meta: dict, n_train: int, n_val: int) -> None:
    full = {**meta, "n_train": int(n_train), "n_val": int(n_val),
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
        meta = json.loads((folder / BLOCKS_META).read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise _cache_error(folder, f"meta.json is missing or unreadable ({e})") from e
    bad = key.mismatches(meta)
    if bad:
        raise _cache_error(folder, "meta.json does not match the requested settings: " + "; ".join(bad))
    try:
        check(BLOCKS_META_FORMAT, meta)  # published as docs/schema/meta.schema.json
    except FormatError as e:
        raise _cache_error(folder, f"meta.json: {e}") from e
    arrays = []
    L = key.seq_len + 1
    for name in ("train", "val"):
        path = folder / f"{name}.npy"
        n = meta[f"n_{name}"]
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


def npy_header(dtype: np.dtype, n: int, L: int) -> bytes:
    """The .npy header np.save writes for an [n, L] C-order array of `dtype` (format 1.0). numpy pads it so that its
    length does not change with n (room for 21 digits), and no longer header is made for a smaller n."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                "fortran_order": False, "shape": (int(n), int(L))})
    return out.getvalue()


_ANY_N = 10**20  # a header for this many rows is as long as any (21 digits)


def _split_in_place(path: Path, val_path: Path, start: int, n: int, L: int, dtype: np.dtype,
                    val: np.ndarray) -> int:
    """`path` holds the token stream after `start` bytes; make it train.npy (the n blocks not in `val`, in order,
    under their header; the tokens after the last whole block dropped) and write val.npy (the blocks in `val`), both
    as np.save would. WRITE_BLOCKS blocks at a time, each written at or before where it was read: the disk holds
    the stream and the validation blocks, never a second copy of the training blocks. The training blocks' count."""
    row = L * dtype.itemsize
    n_train = n - len(val)
    head = npy_header(dtype, n_train, L)
    assert len(head) <= start, (len(head), start)
    with open(path, "r+b") as f, open(val_path, "wb") as fv:
        fv.write(npy_header(dtype, len(val), L))
        w = len(head)
        for i in range(0, n, WRITE_BLOCKS):
            k = min(WRITE_BLOCKS, n - i)
            f.seek(start + i * row)
            rows = np.frombuffer(f.read(k * row), dtype=dtype).reshape(k, L)
            is_val = np.zeros(k, dtype=bool)
            lo, hi = np.searchsorted(val, [i, i + k])
            is_val[val[lo:hi] - i] = True
            fv.write(rows[is_val].tobytes())
            keep = rows[~is_val].tobytes()
            f.seek(w)
            f.write(keep)
            w += len(keep)
        f.seek(0)
        f.write(head)
        f.truncate(w)
    return n_train


def build_blocks(folder: Path, docs: Iterable[Iterable[str]], backend, key: BlockKey, about: dict,
                 log=print) -> None:
    """Tokenize `docs` (data.source.Documents), cut, split and write the cache folder for `key`; `about` adds
    descriptive fields to meta.json (source, tokenizer name) that are not part of the key. The token ids go, at the
    key's width, into train.npy as they come, and the split is made in that file (_split_in_place), so memory holds
    one batch of the tokenizer's work and one slice of blocks, whatever the corpus's size, and the disk at most the
    tokens and the validation blocks (docs/data.md, "Memory"). A full disk stops it with a DataError."""
    t0 = time.time()
    L = key.seq_len + 1
    dtype = key.dtype
    n_docs = 0

    def counted():
        nonlocal n_docs
        for doc in docs:
            n_docs += 1
            yield doc

    try:
        with atomic_dir(folder) as tmp:
            start = len(npy_header(dtype, _ANY_N, L))
            n_tokens = 0
            with open(tmp / "train.npy", "wb") as f:
                f.write(b"\0" * start)  # the header's place, written when the count is known
                for ids in token_chunks(counted(), backend, key.eos_id):
                    if len(ids) and (ids.min() < 0 or ids.max() >= key.vocab_size):
                        raise DataError(f"token ids span [{ids.min()}, {ids.max()}], outside the tokenizer's "
                                        f"{key.vocab_size} ids")
                    f.write(ids.astype(dtype).tobytes())
                    n_tokens += len(ids)
            t_tok = time.time() - t0
            n = n_tokens // L
            val = val_blocks(n, L, n_tokens, key.val_frac)
            n_train = _split_in_place(tmp / "train.npy", tmp / "val.npy", start, n, L, dtype, val)
            meta = {**key.meta(), **about, "created": time.time(), "n_docs": n_docs, "n_tokens": n_tokens,
                    "tokenize_seconds": round(t_tok, 2)}
            _write_meta(tmp, meta, n_train, len(val))
    except OSError as e:
        if not is_disk_full(e):
            raise
        raise DataError(f"the disk filled up while the token blocks were written: {os_problem(e, folder.parent)}; "
                        f"nothing was kept. Fix: free space there, or pass --cache_dir on a disk with room") from e
    log(f"data: tokenized {n_docs} documents -> {n_tokens:,} tokens in {t_tok:.1f}s; "
        f"{n_train} train + {len(val)} val blocks of {L} -> {folder}")
