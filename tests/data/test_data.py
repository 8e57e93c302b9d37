"""Tests for data/: sources, tokenizer, block cache, loader. Tiny corpora, tmp cache dirs."""
from __future__ import annotations

import dataclasses
import json
import platform
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from configs import apply_overrides, get_preset
from data import EOT, BlockLoader, DataError, prepare_data, val_batches
from data import blocks as blocks_mod
from data import corpus as corpus_mod
from data import local_files as files_mod
from data.blocks import split_blocks

WORDS = ("def return self import class value index token block cache batch rank seed epoch model "
         "train layer norm key query head attention loss step data file path the a of to in is").split()


def make_doc(rng: random.Random, n_lines: int) -> str:
    lines = []
    for _ in range(n_lines):
        indent = "    " * rng.randint(0, 2)
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))
        lines.append(f"{indent}{words} = {rng.randint(0, 999)}  # é ü 日本 ✓")
    return "\n".join(lines) + "\n"


def docs(seed: int, n: int, n_lines: int = 40) -> list[str]:
    rng = random.Random(seed)
    return [make_doc(rng, n_lines) for _ in range(n)]


def cfg_for(tmp_path: Path, paths, **over):
    o = {"source": "files", "paths": [str(p) for p in paths], "cache_dir": str(tmp_path / "cache"),
         "vocab_size": 400, "seq_len": 16}
    o.update(over)
    return apply_overrides(get_preset("debug"), o)


def quiet(*_a, **_k):
    pass


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    texts = docs(0, 6)
    paths = []
    for i, t in enumerate(texts):
        p = d / f"doc{i}.txt"
        p.write_text(t, encoding="utf-8")
        paths.append(p)
    return paths, texts


@pytest.fixture(scope="module")
def built(corpus_files, tmp_path_factory):
    paths, texts = corpus_files
    tmp = tmp_path_factory.mktemp("built")
    cfg = cfg_for(tmp, paths)
    return cfg, prepare_data(cfg, log=quiet)


# ---------------------------------------------------------------- tokenizer
def test_bpe_tokenizer_autotokenizer_roundtrip(built):
    from transformers import AutoTokenizer

    cfg, d = built
    tok = AutoTokenizer.from_pretrained(d.tokenizer_dir)
    assert len(tok) == d.vocab_size <= cfg.model.vocab_size
    assert tok.eos_token == EOT and tok.eos_token_id == d.eos_id
    for text in ["def f(x):\n    return x  # é ü 日本 ✓\n\n\ttail  ", "unseen wörds: Ω≈ç√ 🚀 and   spaces\r\n"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    assert tok.encode(EOT, add_special_tokens=False) == [d.eos_id]


def test_tokenize_documents_joins_with_eos(built, corpus_files):
    """Documents given as segments (the first cut in the middle of a line, as a text file is read) give the tokens
    of the whole documents."""
    from transformers import AutoTokenizer

    _, d = built
    _, texts = corpus_files
    tok = AutoTokenizer.from_pretrained(d.tokenizer_dir)
    first = texts[0]
    docs = [[first[:7], first[7:100], "", first[100:]], [texts[1]], [texts[2]], [], [""], [f"literal {EOT} inside"]]
    flat = blocks_mod.tokenize_documents(docs, tok.backend_tokenizer, d.eos_id)
    expect = []
    for t in texts[:3]:
        expect += tok.encode(t, add_special_tokens=False) + [d.eos_id]
    assert flat[:len(expect)].tolist() == expect
    tail = flat[len(expect):].tolist()  # the empty doc adds nothing; a literal EOT in text is not EOS
    assert tail[-1] == d.eos_id and d.eos_id not in tail[:-1]
    assert tok.decode(tail[:-1]) == f"literal {EOT} inside"


# ---------------------------------------------------------------- blocks and cache
def test_blocks_shapes_and_batches(built):
    cfg, d = built
    L = cfg.data.seq_len + 1
    assert d.train.ndim == 2 and d.train.shape[1] == L and d.val.shape[1] == L
    assert d.val.shape[0] >= 1 and d.train.shape[0] >= 1
    assert d.train.dtype == torch.uint16 and d.val.dtype == torch.uint16  # train.npy mapped, not widened to int32
    ids = d.train.long()
    assert int(ids.max()) < d.vocab_size and int(ids.min()) >= 0
    meta = json.loads((d.cache_dir / "meta.json").read_text())
    assert meta["source_hash"] == d.source_hash and meta["tokenizer_hash"] == d.tokenizer_hash
    assert meta["dtype"] == "uint16" and meta["n_train"] == d.train.shape[0] and meta["n_val"] == d.val.shape[0]
    assert d.cache_dir.name == f"{d.source_hash[:12]}-{d.tokenizer_hash[:12]}-L{cfg.data.seq_len}"
    assert (d.train == d.eos_id).any()  # documents are separated by EOS


def test_cache_hit_identical_and_fast(built):
    cfg, d = built
    logs = []
    t = time.time()
    d2 = prepare_data(cfg, log=logs.append)
    assert time.time() - t < 3.0
    assert any("cache hit" in m for m in logs) and not any("trained" in m or "tokenized" in m for m in logs)
    assert torch.equal(d.train, d2.train) and torch.equal(d.val, d2.val)
    assert (d2.cache_dir, d2.tokenizer_hash, d2.source_hash) == (d.cache_dir, d.tokenizer_hash, d.source_hash)


def test_other_seq_len_or_tokenizer_uses_other_folder(built, corpus_files):
    cfg, d = built
    paths, _ = corpus_files
    root = Path(cfg.data.cache_dir)
    d_seq = prepare_data(apply_overrides(cfg, {"seq_len": 8}), log=quiet)
    assert d_seq.cache_dir != d.cache_dir and d_seq.train.shape[1] == 9
    assert d_seq.tokenizer_hash == d.tokenizer_hash
    d_voc = prepare_data(apply_overrides(cfg, {"vocab_size": 300}), log=quiet)
    assert d_voc.tokenizer_hash != d.tokenizer_hash and d_voc.cache_dir != d.cache_dir
    assert d_voc.vocab_size <= 300
    # the same tokenizer given as a local folder has the same hash, so the cache is shared
    logs = []
    d_dir = prepare_data(apply_overrides(cfg, {"tokenizer": str(d.tokenizer_dir)}), log=logs.append)
    assert d_dir.cache_dir == d.cache_dir and any("cache hit" in m for m in logs)
    # a changed source gets its own folder
    extra = paths[0].parent / "extra.txt"
    extra.write_text(docs(9, 1)[0])
    d_src = prepare_data(cfg_for(root.parent, paths + [extra]), log=quiet)
    assert d_src.source_hash != d.source_hash and d_src.cache_dir != d.cache_dir
    assert {p.name for p in root.iterdir() if not p.name.startswith(".")} >= {d.cache_dir.name, d_seq.cache_dir.name}


def test_tampered_or_truncated_cache_raises(tmp_path, corpus_files):
    paths, _ = corpus_files
    cfg = cfg_for(tmp_path, paths[:3])
    d = prepare_data(cfg, log=quiet)
    meta_path = d.cache_dir / "meta.json"
    good = meta_path.read_text()

    meta = json.loads(good)
    meta["seq_len"] = 32
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"seq_len=32.*delete .*--cache_dir"):
        prepare_data(cfg, log=quiet)

    meta_path.write_text("{ not json")
    with pytest.raises(DataError, match="meta.json is missing or unreadable"):
        prepare_data(cfg, log=quiet)

    meta = json.loads(good)
    meta["n_train"] += 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(DataError, match=str(d.cache_dir)):
        prepare_data(cfg, log=quiet)

    meta_path.write_text(good)
    train = d.cache_dir / "train.npy"
    raw = train.read_bytes()
    train.write_bytes(raw[: len(raw) - 40])
    with pytest.raises(DataError, match=r"train.npy .*Fix: delete"):
        prepare_data(cfg, log=quiet)
    train.write_bytes(raw)
    assert torch.equal(prepare_data(cfg, log=quiet).train, d.train)


def test_interrupted_build_leaves_no_cache(tmp_path, corpus_files, monkeypatch):
    paths, _ = corpus_files
    cfg = cfg_for(tmp_path, paths[:2])
    real_split = blocks_mod._split_in_place

    def killed_split(path, val_path, *a):  # killed while splitting: train.npy holds the token stream, val.npy begun
        assert path.stat().st_size > 0
        val_path.write_bytes(b"partial")
        raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(blocks_mod, "_split_in_place", killed_split)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, log=quiet)
    monkeypatch.setattr(blocks_mod, "_split_in_place", real_split)
    root = Path(cfg.data.cache_dir)
    assert [p.name for p in root.iterdir() if p.name not in ("tokenizers", ".lock")] == []
    d = prepare_data(cfg, log=quiet)
    assert d.train.shape[0] >= 1


def test_split_deterministic_and_disjoint():
    tokens = np.arange(17 * 200, dtype=np.int32)  # every block is distinct
    tr1, va1 = split_blocks(tokens, 16, 0.1, np.dtype(np.int32))
    tr2, va2 = split_blocks(tokens, 16, 0.1, np.dtype(np.int32))
    assert np.array_equal(tr1, tr2) and np.array_equal(va1, va2)
    assert len(va1) == 20 and len(tr1) == 180
    starts_t, starts_v = set(tr1[:, 0].tolist()), set(va1[:, 0].tolist())
    assert not starts_t & starts_v and len(starts_t | starts_v) == 200
    tr, va = split_blocks(np.arange(17 * 3, dtype=np.int32), 16, 0.02, np.dtype(np.uint16))
    assert (len(tr), len(va)) == (2, 1) and va.dtype == np.uint16  # at least one val block
    with pytest.raises(DataError, match="lower --seq_len"):
        split_blocks(np.arange(20, dtype=np.int32), 16, 0.1, np.dtype(np.int32))


def test_int32_blocks_roundtrip_and_the_cache_key(tmp_path):
    from data.prepare import _tensor

    key = blocks_mod.BlockKey(source_hash="a" * 64, tokenizer_hash="b" * 64, seq_len=8, vocab_size=70091, eos_id=0,
                              val_frac=0.2)
    assert key.folder(tmp_path) == tmp_path / f"{'a' * 12}-{'b' * 12}-L8"
    tokens = np.arange(70000, 70000 + 9 * 10, dtype=np.int32)
    train, val = split_blocks(tokens, 8, 0.2, key.dtype)
    assert train.dtype == np.int32 and blocks_mod.token_dtype(65535) == np.uint16
    folder = tmp_path / "blk"
    blocks_mod.write_blocks(folder, train, val, key.meta())
    tr, va, meta = blocks_mod.load_blocks(folder, key)
    t = _tensor(tr)
    assert t.dtype == torch.int32 and t.shape == (8, 9) and torch.equal(t, torch.from_numpy(train))
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    other = dataclasses.replace(key, vocab_size=60000, val_frac=0.1)
    assert other.mismatches(meta) == ["vocab_size=70091 (requested 60000)", "val_frac=0.2 (requested 0.1)",
                                      "dtype='int32' (requested 'uint16')"]
    with pytest.raises(DataError, match=r"dtype='int32' \(requested 'uint16'\)"):
        blocks_mod.load_blocks(folder, other)


def test_split_same_across_builds(tmp_path, corpus_files):
    paths, _ = corpus_files
    a = prepare_data(cfg_for(tmp_path / "a", paths[:3]), log=quiet)
    b = prepare_data(apply_overrides(cfg_for(tmp_path / "b", paths[:3]), {"seed": 123}), log=quiet)
    assert torch.equal(a.train, b.train) and torch.equal(a.val, b.val)


# ---------------------------------------------------------------- file sources
def test_txt_jsonl_parquet_sources(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = docs(1, 6, n_lines=30)
    txt = tmp_path / "a.txt"
    txt.write_text(texts[0] + "\n\n" + "second paragraph\n")
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts[1:3])))
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": texts[3:6], "n": [1, 2, 3]}), parquet)

    src = files_mod.files_source([str(txt), str(jsonl)], "text")
    loaded = src.load(tmp_path / "work")["text"]
    assert loaded == [texts[0] + "\n\n" + "second paragraph\n"] + texts[1:3]  # .txt: one document per file
    assert files_mod.files_source([str(parquet)], "body").load(tmp_path / "work")["text"] == texts[3:6]

    with pytest.raises(DataError, match=r"c\.parquet.*no column 'text'.*body, n"):
        files_mod.files_source([str(parquet)], "text").load(tmp_path / "work")
    with pytest.raises(DataError, match=r"b\.jsonl.*no column 'body'.*text, id"):
        files_mod.files_source([str(jsonl)], "body").load(tmp_path / "work")

    d = prepare_data(cfg_for(tmp_path, [jsonl, txt]), log=quiet)
    assert d.train.shape[0] + d.val.shape[0] > 10
    dp = prepare_data(cfg_for(tmp_path, [parquet], text_field="body"), log=quiet)
    assert dp.source_hash != d.source_hash
    assert not any(p.name.startswith(".work-") for p in (tmp_path / "cache").iterdir())


def test_missing_path_and_bad_type(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl does not exist"):
        prepare_data(cfg_for(tmp_path, [tmp_path / "nope.jsonl"]), log=quiet)
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type"):
        prepare_data(cfg_for(tmp_path, [bad]), log=quiet)
    good = tmp_path / "ok.txt"
    good.write_text(docs(2, 1)[0])
    with pytest.raises(DataError, match="no such folder"):
        prepare_data(cfg_for(tmp_path, [good], tokenizer="./no/such/tokdir"), log=quiet)


def test_tokenizer_larger_than_vocab_size(built, tmp_path, corpus_files):
    _, d = built
    paths, _ = corpus_files
    with pytest.raises(DataError, match=rf"pass --vocab_size {d.vocab_size}"):
        prepare_data(cfg_for(tmp_path, paths, tokenizer=str(d.tokenizer_dir), vocab_size=300), log=quiet)


# ---------------------------------------------------------------- hub, offline
def test_hub_source_fails_fast_offline(tmp_path, monkeypatch, corpus_files):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = apply_overrides(get_preset("debug"), {"source": "hub", "cache_dir": str(tmp_path / "cache"),
                                                "vocab_size": 400, "seq_len": 16})
    t = time.time()
    with pytest.raises(DataError) as ei:
        prepare_data(cfg, log=quiet)
    assert time.time() - t < 10
    msg = str(ei.value)
    for needle in ("HF_HUB_OFFLINE", "--source stdlib", "--source files --paths", "--tokenizer bpe"):
        assert needle in msg

    paths, _ = corpus_files
    t = time.time()
    with pytest.raises(DataError, match=r"some-org/some-tokenizer.*--source stdlib"):
        prepare_data(cfg_for(tmp_path, paths, tokenizer="some-org/some-tokenizer"), log=quiet)
    assert time.time() - t < 10


# ---------------------------------------------------------------- loader
def blocks_tensor(n=37, L=9):
    return torch.arange(n * L, dtype=torch.int32).view(n, L)


def test_loader_batches_shapes_and_epochs():
    b = blocks_tensor()
    ld = BlockLoader(b, batch_size=8, seed=3)
    x, y = ld.next_batch()
    assert x.shape == (8, 8) and y.shape == (8, 8) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    seen = [int(r) for r in (x[:, 0] // 9)]
    ld2 = BlockLoader(b, batch_size=1, seed=3)
    order = [int(ld2.next_batch()[0][0, 0]) // 9 for _ in range(2 * 37)]
    assert sorted(order[:37]) == list(range(37)) and sorted(order[37:]) == list(range(37))
    assert order[:37] != order[37:]  # a new permutation each epoch
    assert order[:8] == seen
    assert BlockLoader(b, 8, seed=4).next_batch()[0].tolist() != x.tolist()
    with pytest.raises(ValueError, match="multiple of world_size"):
        BlockLoader(b, batch_size=6, seed=0, rank=0, world_size=4)


def test_loader_resume():
    b = blocks_tensor()
    ld = BlockLoader(b, batch_size=8, seed=11)
    for _ in range(6):  # crosses an epoch boundary (37 blocks)
        ld.next_batch()
    state = ld.state_dict()
    assert all(type(v) is int for v in state.values())
    state = json.loads(json.dumps(state))
    cont = [ld.next_batch() for _ in range(7)]
    ld2 = BlockLoader(b, batch_size=8, seed=999)
    ld2.load_state_dict(state)
    for (x1, y1), (x2, y2) in zip(cont, (ld2.next_batch() for _ in range(7))):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    with pytest.raises(ValueError, match="same data settings"):
        BlockLoader(blocks_tensor(n=20), 8, 0).load_state_dict(state)


def test_loader_rank_slices_make_the_global_batch():
    b = blocks_tensor()
    one = BlockLoader(b, batch_size=8, seed=5)
    ranks = [BlockLoader(b, batch_size=8, seed=5, rank=r, world_size=2) for r in range(2)]
    for _ in range(10):
        x, y = one.next_batch()
        (x0, y0), (x1, y1) = (r.next_batch() for r in ranks)
        assert x0.shape == (4, 8)
        assert torch.equal(x[0::2], x0) and torch.equal(x[1::2], x1)
        assert torch.equal(y[0::2], y0) and torch.equal(y[1::2], y1)


def test_val_batches_fixed_wrapping_and_ranked():
    v = blocks_tensor(n=5)
    vb = val_batches(v, batch_size=4, n_batches=3)
    assert len(vb) == 3 and vb[0][0].shape == (4, 8)
    firsts = [int(r) // 9 for x, _ in vb for r in x[:, 0]]
    assert firsts == [i % 5 for i in range(12)]
    r0, r1 = val_batches(v, 4, 3, rank=0, world_size=2), val_batches(v, 4, 3, rank=1, world_size=2)
    for (x, y), (a, _), (b2, _) in zip(vb, r0, r1):
        assert torch.equal(x[0::2], a) and torch.equal(x[1::2], b2)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(vb, val_batches(v, 4, 3)))


# ---------------------------------------------------------------- the real stdlib source
def test_stdlib_source(tmp_path, monkeypatch):
    files = corpus_mod.stdlib_files()
    rels = [r for r, _, _ in files]
    assert rels and not any("site-packages" in r or r.startswith("encodings/") for r in rels)
    assert all(r.endswith(".py") for r in rels)
    n_lib = sum(1 for r in rels if not any(p in corpus_mod.STDLIB_TEST_DIRS for p in r.split("/")[:-1]))
    assert rels[:n_lib] == sorted(rels[:n_lib])  # library code first, sorted; then test suites
    src_full = corpus_mod.open_source(apply_overrides(get_preset("tiny"), {"source": "stdlib"}).data)
    assert src_full.n_docs <= len(files) and src_full.name == f"stdlib-{platform.python_version()}"
    assert f"Python {platform.python_version()}" in src_full.description  # the interpreter is named

    cfg = apply_overrides(get_preset("debug"), {"cache_dir": str(tmp_path / "cache"), "vocab_size": 512,
                                                "source": "stdlib", "stdlib_max_bytes": 300_000})
    src = corpus_mod.open_source(cfg.data)
    assert src.kind == "stdlib" and src.source_hash == corpus_mod.open_source(cfg.data).source_hash
    assert src.source_hash != src_full.source_hash  # the cap is part of what the hash names
    d = prepare_data(cfg, log=quiet)
    assert d.source_hash == src.source_hash and d.vocab_size == 512
    assert d.train.shape[1] == cfg.data.seq_len + 1 and d.train.shape[0] > 100
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d.tokenizer_dir)
    sample = Path(corpus_mod.stdlib_root(), "this.py").read_text()
    assert tok.decode(tok.encode(sample, add_special_tokens=False)) == sample


# ---------------------------------------------------------------- memory: streaming in pieces
def test_cut_points_fall_before_a_line_break_after_a_letter_or_digit():
    text = "alpha beta\n\n  gamma,\ndelta 42\n" + "x" * 50 + "\nend ✓\n  \n"
    cuts = blocks_mod.cut_points(text, 8)
    assert cuts and all(text[c] == "\n" and not text[c - 1].isspace() for c in cuts) and len(cuts) == 5
    assert "".join(blocks_mod.pieces(text, 8)) == text
    strict = blocks_mod.cut_points(text, 8, str.isalnum)
    assert all(text[c - 1].isalnum() for c in strict) and len(strict) == 3
    assert blocks_mod.pieces("one very long line without a break", 4) == ["one very long line without a break"]
    assert blocks_mod.pieces("short\ntext", 1000) == ["short\ntext"]


def test_each_tokenizer_gets_the_cuts_it_keeps():
    """A prefix added to every input (Metaspace) changes a piece's first token: whole documents. A Llama-3 style
    split that joins punctuation with the line breaks after it: cuts after letters and digits only. An added token
    holding a line break after text: whole documents."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    meta = Tokenizer(models.WordLevel({"▁a": 0, "a": 1, "[UNK]": 2}, unk_token="[UNK]"))
    meta.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    assert blocks_mod.splits_at_lines(meta) is None
    words = {"[UNK]": 0, ".Ċ": 1, ".": 2, "Ċ": 3, ",Ċ": 4, ",": 5}  # ids that tell "." + "\n" from ".\n"
    llama = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    llama.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+"),
                             behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    assert blocks_mod.splits_at_lines(llama) is str.isalnum
    llama.add_tokens(["x\n"])  # an added token may span any cut before a line break
    assert blocks_mod.splits_at_lines(llama) is None


def _whole_document_blocks(folder: Path, texts: list[str], tokenizer_dir: Path, key) -> None:
    """The blocks as data preparation wrote them before it streamed: every document encoded whole, EOS after each,
    one array cut and split, np.save'd."""
    from tokenizers import Tokenizer

    enc = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    enc.encode_special_tokens = True
    ids: list[int] = []
    for t in texts:
        if t:
            ids += enc.encode(t, add_special_tokens=False).ids + [key.eos_id]
    train, val = split_blocks(np.asarray(ids, dtype=np.int32), key.seq_len, key.val_frac, key.dtype)
    blocks_mod.write_blocks(folder, train, val, key.meta())


def test_streamed_preparation_writes_the_bytes_of_whole_documents(tmp_path, monkeypatch):
    """Long documents read in segments and cut into pieces (segments of 50 characters, pieces of ~300, batches of
    ~700 here, against 4 Mi, 64 Ki and 1 Mi in use) give the same BPE and the same train.npy and val.npy, byte for
    byte, as whole documents encoded at once and saved by np.save."""
    from data.tokenizer import train_bpe

    rng = random.Random(7)
    texts = [make_doc(rng, 120), "", make_doc(rng, 3), f"literal {EOT} inside\n\n  and more", make_doc(rng, 200)]
    paths = []
    for i, t in enumerate(texts):
        paths.append(tmp_path / f"d{i}.txt")
        paths[-1].write_text(t, encoding="utf-8")
    monkeypatch.setattr(blocks_mod, "PIECE_CHARS", 300)
    monkeypatch.setattr(blocks_mod, "BATCH_CHARS", 700)
    monkeypatch.setattr(files_mod, "READ_BYTES", 50)  # text files read 50 characters at a time
    assert len(blocks_mod.pieces(texts[-1], 300)) > 10
    d = prepare_data(cfg_for(tmp_path, [p for p, t in zip(paths, texts) if t]), log=quiet)

    whole = train_bpe(iter([[t for t in texts if t]]), 400)
    built = json.loads((d.tokenizer_dir / "tokenizer.json").read_text())
    assert built["model"]["merges"] == json.loads(whole.to_str())["model"]["merges"]
    key = blocks_mod.BlockKey(source_hash=d.source_hash, tokenizer_hash=d.tokenizer_hash, seq_len=16,
                              vocab_size=d.vocab_size, eos_id=d.eos_id, val_frac=get_preset("debug").data.val_frac)
    _whole_document_blocks(tmp_path / "reference", [t for t in texts if t], d.tokenizer_dir, key)
    for name in ("train.npy", "val.npy"):
        assert (d.cache_dir / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), name
    assert d.n_tokens == len(np.concatenate([d.train.numpy().ravel(), d.val.numpy().ravel()])) + d.n_tokens % 17
    assert not (d.cache_dir / "tokens.int32").exists()
