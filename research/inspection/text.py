"""Real-text batches for the tour and the pretrained key study: windows of T tokens of real text.

    docs = text_documents("english")              # or a path to a UTF-8 text file
    ids = text_windows(tokenizer, docs, n=32, seq_len=256, seed=0)    # [n, T] int64

Windows are as independent as the text allows: ONE window per document, at a seeded random offset, documents in a
seeded random order; a text with too few long documents (a single file) is cut into non-overlapping windows. A
model whose tokenizer starts every text with BOS (Gemma) gets BOS first. The rule in full: docs/inspection.md
("The tour", Text).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from research.access.adapters import InspectError

ENGLISH = "english"


@dataclass
class Documents:
    texts: list[str]
    name: str          # english-v1 or the file's path
    sha256: str        # of the corpus (english-v1's pinned hash) or of the file's bytes
    description: str
    picked: list[int] = field(default_factory=list)  # documents the windows came from, in order (filled in)


def text_documents(spec: str) -> Documents:
    """english (the pinned natural-language corpus english-v1) or a UTF-8 text file (one document)."""
    if spec == ENGLISH:
        from data.corpus import english_source
        from data.source import DataError
        try:
            src = english_source()
        except DataError as e:
            raise InspectError(str(e)) from e
        texts = src.load(Path("."))["text"]  # english-v1 is built in memory: no scratch space used
        return Documents(list(texts), src.name, src.source_hash, src.description)
    from data.source import DataError
    from data.text_checks import decode_text
    path = Path(spec).expanduser()
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InspectError(f"--text {spec}: cannot read it ({type(e).__name__}: {e}); pass '{ENGLISH}' or a "
                           f"readable text file") from e
    try:
        text = decode_text(raw, f"--text {spec}", f"pass '{ENGLISH}' or another text file")
    except DataError as e:
        raise InspectError(str(e)) from e
    return Documents([text], str(path), hashlib.sha256(raw).hexdigest(), f"{path.name}, {len(raw):,} bytes")


def starts_with_bos(tokenizer) -> int | None:
    """The BOS id when the tokenizer puts it before every text, else None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    ids = tokenizer("a")["input_ids"]
    return bos if bos is not None and ids and ids[0] == bos else None


def text_windows(tokenizer, docs: Documents, n: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    """[n, seq_len] token ids: n windows of real text (see the module doc). docs.picked is set to the
    document index of each window."""
    if n < 1 or seq_len < 2:
        raise InspectError(f"need at least one window of at least 2 tokens (got {n} x {seq_len})")
    bos = starts_with_bos(tokenizer)
    body = seq_len - (bos is not None)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(docs.texts))
    tokens: dict[int, list[int]] = {}
    windows, picked = [], []
    for d in order:  # one window per long-enough document
        ids = tokenizer(docs.texts[d], add_special_tokens=False)["input_ids"]
        tokens[int(d)] = ids
        if len(ids) >= body:
            start = int(rng.integers(0, len(ids) - body + 1))
            windows.append(ids[start:start + body])
            picked.append(int(d))
            if len(windows) == n:
                break
    if len(windows) < n:  # too few documents: non-overlapping windows of all of them
        pool = [(d, ids[s:s + body]) for d, ids in tokens.items() for s in range(0, len(ids) - body + 1, body)]
        if len(pool) < n:
            total = sum(len(t) for t in tokens.values())
            raise InspectError(f"the text ({docs.description}) has {total:,} tokens: {len(pool)} windows of "
                               f"{seq_len} tokens, {n} needed. Give a longer text, or fewer/shorter windows")
        choice = rng.permutation(len(pool))[:n]
        picked = [pool[i][0] for i in choice]
        windows = [pool[i][1] for i in choice]
    docs.picked = picked
    out = torch.tensor(windows, dtype=torch.long)
    if bos is not None:
        out = torch.cat([torch.full((n, 1), bos, dtype=torch.long), out], dim=1)
    return out


def text_batch(tokenizer, spec: str, n: int, seq_len: int, seed: int = 0) -> tuple[torch.Tensor, dict]:
    """(ids [n, seq_len], the record of where they come from) for --text spec."""
    docs = text_documents(spec)
    ids = text_windows(tokenizer, docs, n, seq_len, seed)
    return ids, {"source": docs.name, "sha256": docs.sha256, "description": docs.description, "windows": n,
                 "seq_len": seq_len, "seed": seed, "bos": starts_with_bos(tokenizer) is not None,
                 "documents": docs.picked}

