"""Data preparation streams (docs/data.md, "Memory"): files are hashed, checked and read a chunk at a time, the
BPE trains on a bounded sample, the token ids go to disk as they come and the split is made in that file; a corpus
whose blocks would not fit the disk is refused before the work. Small corpora, small chunk sizes."""
from __future__ import annotations

import errno
import hashlib
import io
import re
import tracemalloc

import numpy as np
import pytest

from configs import apply_overrides, get_preset
from data import DataError, prepare_data
from data import blocks as blocks_mod
from data import local_files as files_mod
from data import text_checks
from data import prepare as prepare_mod
from data import tokenizer as tokenizer_mod
from tests.data import growing_corpus
from tests.data.test_hostile_text import CASES, _write


def quiet(*_a, **_k):
    pass


def cfg_for(tmp_path, paths, **over):
    o = {"source": "files", "paths": [str(p) for p in paths], "cache_dir": str(tmp_path / "cache"),
         "vocab_size": 300, "seq_len": 16}
    return apply_overrides(get_preset("debug"), {**o, **over})


# ---------------------------------------------------------------- files read a chunk at a time
@pytest.mark.parametrize("name, raw, cause", CASES, ids=[c[0] for c in CASES])
def test_files_checked_three_bytes_at_a_time_give_the_same_cause(tmp_path, monkeypatch, name, raw, cause):
    """Every hostile file of test_hostile_text, hashed and checked 3 bytes at a time (characters cut across
    chunks), gets the message it gets read whole: the same offsets and lines."""
    monkeypatch.setattr(files_mod, "READ_BYTES", 3)
    path = _write(tmp_path, name, raw)
    with pytest.raises(DataError, match=rf"^source=files: {re.escape(str(path))}:? " + cause):
        files_mod.files_source([str(path)]).load(tmp_path / "work")


def test_text_check_in_chunks_is_decode_text():
    """TextCheck fed 1 to 6 bytes at a time says what decode_text says of the whole."""
    cases = [b"ab\n\xc3\xa9x\n\xff",  # 0xff at offset 7 on line 3: a=0 b=1 \n=2 (c3 a9)=3,4 x=5 \n=6
             "caf\u00e9 \u65e5\u672c \u2713\n".encode(), b"ok\n\xe2\x82", b"x\xff\x00", b"\xff\xfeh\x00"]
    expected = [r"byte 0xff at offset 7 \(line 3\)", None, r"byte 0xe2 at offset 3 \(line 2\)",
                r"a NUL byte at offset 2", "UTF-16"]
    for raw, want in zip(cases, expected):
        if want is None:
            assert text_checks.decode_text(raw, "w") == "caf\u00e9 \u65e5\u672c \u2713\n"
        else:
            with pytest.raises(DataError, match=want):
                text_checks.decode_text(raw, "w")
        for step in range(1, 7):
            check = text_checks.TextCheck("w")
            text = "".join(check.feed(raw[i:i + step]) for i in range(0, len(raw), step))
            if want is None:
                check.finish()
                assert text == raw.decode()
            else:
                with pytest.raises(DataError, match=want):
                    check.finish()


def test_files_hash_read_in_chunks_is_the_hash_of_the_whole(tmp_path, monkeypatch):
    """The source hash, written out by hand as files_source has always made it (so every cache keeps its name):
    sha256 of b"files-v1\\0", the text field and \\0, then per file its name's length (8 bytes, little endian), the
    name, its size (the same) and its bytes."""
    monkeypatch.setattr(files_mod, "READ_BYTES", 4)
    (tmp_path / "a.txt").write_bytes(b"one\r\ntwo \xe2\x9c\x93\n")
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "three"}\n')
    h = hashlib.sha256(b"files-v1\0text\0")
    for name in ("a.txt", "b.jsonl"):
        raw = (tmp_path / name).read_bytes()
        h.update(len(name).to_bytes(8, "little") + name.encode() + len(raw).to_bytes(8, "little") + raw)
    src = files_mod.files_source([str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")])
    assert src.source_hash == h.hexdigest()
    # one(3) \r\n(2) "two "(4) check mark(3) \n(1) = 13; {"text": "three"}\n = 18, which datasets copies to scratch
    assert src.n_bytes == 13 + 18 and src.scratch_bytes == 18


def test_a_text_file_is_read_in_segments_as_datasets_reads_it_whole(tmp_path, monkeypatch):
    """Segments of at most 2 characters; line breaks as datasets' text builder gives them (\\r\\n and \\r become
    \\n, even a \\r\\n cut between two segments); an empty file is one empty document."""
    monkeypatch.setattr(files_mod, "READ_BYTES", 2)
    (tmp_path / "a.txt").write_bytes(b"a\r\nb\rc\n\xc3\xa9\r\n")
    (tmp_path / "b.txt").write_bytes(b"")
    src = files_mod.files_source([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")])
    docs = [list(doc) for doc in src.documents(tmp_path / "work")]
    assert len(docs) == 2 and docs[1] == [] and all(len(s) <= 2 for s in docs[0])
    assert "".join(docs[0]) == "a\nb\nc\n\u00e9\n" == src.load(tmp_path / "work2")["text"][0]
    assert [list(d) for d in src.documents(tmp_path / "work")] == docs  # a second pass reads it again


def test_stream_pieces_cut_as_they_come():
    """Segments of 7 characters, pieces of about 20: the pieces join to the text, each ends before a line break
    after a non-space character, none is longer than 20 + the longest line; a 50-character line stays whole."""
    text = "".join(f"line {i} of the text\n" if i % 9 else "  \n" for i in range(60)) + "x" * 50 + "\nend"
    segs = [text[i:i + 7] for i in range(0, len(text), 7)]
    out = list(blocks_mod.stream_pieces(segs, 20))
    assert "".join(out) == text and len(out) > 20
    assert all(p.startswith("\n") and not q[-1].isspace() for q, p in zip(out, out[1:]))
    assert max(len(p) for p in out[:-2]) <= 20 + len("line 59 of the text\n")
    assert "x" * 50 in max(out, key=len)


# ---------------------------------------------------------------- the BPE's sample
def test_bpe_sample_takes_at_most_the_limit_spread_over_the_corpus():
    """1,000 documents of 1,000 bytes, limit 100,000 (pieces cut at 100,000 / 64 = 1,562 characters: none here): a
    document is taken when (taken + 1,000) * 1,000,000 <= 100,000 * seen, i.e. seen >= 10,000 (k + 1) for the k-th
    taken: documents 9, 19, ..., 999, 100,000 bytes. Within the limit everything is taken, in order. A 5,000-byte
    line with limit 1,000: cut every 1,000 // 64 = 15 characters, the unit k taken when 15 (k + 1) >= 5 (taken + 15):
    units 4, 9, 14, ... (66 of them, 990 bytes) and the 5-byte tail (995 * 5,000 <= 1,000 * 5,000): 995 bytes."""
    docs = [[f"d{i:03d}" + "a" * 995 + "\n"] for i in range(1000)]
    stats = {}
    taken = list(tokenizer_mod.bpe_sample(docs, 10**6, 100_000, stats))
    assert [int(t[1:4]) for t in taken] == list(range(9, 1000, 10)) and stats["taken"] == 100_000
    assert list(tokenizer_mod.bpe_sample(docs, 10**6, 10**6)) == [d[0] for d in docs]
    line = "".join(f"{i:04d}," for i in range(1000))
    parts = list(tokenizer_mod.bpe_sample([[line]], 5000, 1000, stats))
    assert parts[:2] == [line[60:75], line[135:150]] and parts[-1] == line[-5:] and stats["taken"] == 995


def test_a_corpus_over_the_sample_gets_its_own_tokenizer_and_blocks(tmp_path, monkeypatch):
    """A 120 KB corpus with the sample limited to 40 KB: the BPE trains on 40 KB or less (meta says so), its
    tokenizer differs from the whole corpus's, so do the blocks' folder, and neither cache is taken for the other.
    A tokenizer cached with another limit is refused, not reused."""
    path = tmp_path / "g.txt"
    growing_corpus.write(path, 120_000)
    monkeypatch.setattr(tokenizer_mod, "BPE_SAMPLE_BYTES", 40_000)
    small = prepare_data(cfg_for(tmp_path / "a", [path]), log=quiet)
    meta = (small.tokenizer_dir / tokenizer_mod.META_NAME).read_text()
    assert '"sample_limit_bytes": 40000' in meta and '"corpus_bytes": 120000' in meta
    took = int(re.search(r'"trained_on_bytes": (\d+)', meta).group(1))
    assert 40_000 - 40_000 // 64 < took <= 40_000  # within one unit of 625 characters (bpe_sample)
    assert small.tokenizer_dir.name.startswith("bpe-v2-")
    monkeypatch.setattr(tokenizer_mod, "BPE_SAMPLE_BYTES", 10**9)
    whole = prepare_data(cfg_for(tmp_path / "b", [path]), log=quiet)
    assert whole.tokenizer_hash != small.tokenizer_hash and whole.cache_dir.name != small.cache_dir.name
    with pytest.raises(DataError, match=r"sample_limit_bytes=40000 \(expected 1000000000\)"):
        prepare_data(cfg_for(tmp_path / "a", [path]), log=quiet)


# ---------------------------------------------------------------- the blocks, written as they come
def test_split_in_place_writes_what_np_save_writes(tmp_path, monkeypatch):
    """10 blocks of 4 tokens (block i holds 4i .. 4i+3) and 3 tokens more, 3 blocks moved at a time, blocks 2 and 7
    to validation: train.npy holds blocks 0 1 3 4 5 6 8 9, val.npy 2 and 7, as np.save writes them."""
    monkeypatch.setattr(blocks_mod, "WRITE_BLOCKS", 3)
    dtype = np.dtype(np.uint16)
    start = len(blocks_mod.npy_header(dtype, blocks_mod._ANY_N, 4))
    path = tmp_path / "train.npy"
    path.write_bytes(b"\0" * start + np.arange(43, dtype=dtype).tobytes())
    n_train = blocks_mod._split_in_place(path, tmp_path / "val.npy", start, 10, 4, dtype, np.array([2, 7]))
    blocks = np.arange(40, dtype=dtype).reshape(10, 4)
    for name, rows in (("train.npy", [0, 1, 3, 4, 5, 6, 8, 9]), ("val.npy", [2, 7])):
        buf = io.BytesIO()
        np.save(buf, blocks[rows])
        assert (tmp_path / name).read_bytes() == buf.getvalue(), name
    assert n_train == 8
    for n in (0, 7, 10**6):  # as long for any count, so the header fits the place kept for it
        assert len(blocks_mod.npy_header(dtype, n, 129)) == len(blocks_mod.npy_header(dtype, blocks_mod._ANY_N, 129))


def test_val_blocks_are_the_split_every_cache_has():
    """The first round(val_frac * n) of numpy's PCG64(SPLIT_SEED) permutation of n, sorted, as the blocks were
    always split (drawn here by the old call, Generator.permutation)."""
    for n, frac in ((2, 0.02), (3, 0.4), (17, 0.1), (1000, 0.02), (12345, 0.05)):
        n_val = min(n - 1, max(1, int(round(frac * n))))
        old = np.sort(np.random.Generator(np.random.PCG64(blocks_mod.SPLIT_SEED)).permutation(n)[:n_val])
        assert np.array_equal(blocks_mod.val_blocks(n, 17, n * 17, frac), old), n


def _sha256_in_4k(path) -> str:
    """utils.io.sha256_file reading 4 KiB at a time: its 4 MiB reads are bounded, but would hold these whole files."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 12):
            h.update(chunk)
    return h.hexdigest()


def test_block_writer_memory_does_not_grow_with_the_corpus(tmp_path, monkeypatch):
    """build_blocks on 150 KB and on 450 KB of text, read 8 Ki characters at a time and tokenized 8 Ki
    characters at a time: the peak of Python's allocations (tracemalloc: strings, lists, numpy arrays; not the Rust
    tokenizer's) is about the same for both, and far below what holding the corpus would take (450 KB of text, or
    its ~160,000 token ids at 4 bytes: 640 KB)."""
    monkeypatch.setattr(files_mod, "READ_BYTES", 1 << 13)
    monkeypatch.setattr(blocks_mod, "BATCH_CHARS", 1 << 13)
    monkeypatch.setattr(blocks_mod, "PIECE_CHARS", 1 << 11)
    monkeypatch.setattr(blocks_mod, "WRITE_BLOCKS", 256)
    monkeypatch.setattr(blocks_mod, "sha256_file", _sha256_in_4k)
    text = growing_corpus.text(450_000)
    backend = tokenizer_mod.train_bpe(iter([text[:100_000]]), 300)
    peaks = []
    for size in (150_000, 450_000):
        path = tmp_path / f"c{size}.txt"
        path.write_text(text[:size])
        docs = files_mod.files_source([str(path)]).documents(tmp_path / "work")
        key = blocks_mod.BlockKey(source_hash=f"{size:012d}", tokenizer_hash="t" * 12, seq_len=16, vocab_size=300,
                                  eos_id=0, val_frac=0.02)
        tracemalloc.start()
        blocks_mod.build_blocks(key.folder(tmp_path), docs, backend, key, {}, log=quiet)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert np.load(key.folder(tmp_path) / "train.npy").size > size / 4 * 0.9  # it did tokenize it all
    assert peaks[1] < 1.25 * peaks[0] and peaks[1] < 300_000, peaks


# ---------------------------------------------------------------- the disk
def test_disk_need_worked_by_hand():
    """10,000 bytes of text at 2 bytes a token: 5,000 tokens; at 2 bytes each (vocab <= 65,535) and 2% more for
    the validation blocks written beside the stream: 10,200 bytes, + 1 MB: 1,010,200. At 4 bytes (a vocab of
    70,000): 20,400 + 1 MB. A scratch copy adds its size."""
    assert prepare_mod.blocks_disk_need(10_000, 0, 400, 0.02) == 1_010_200
    assert prepare_mod.blocks_disk_need(10_000, 0, 70_000, 0.02) == 1_020_400
    assert prepare_mod.blocks_disk_need(10_000, 5_000, 400, 0.02) == 1_015_200


def test_a_corpus_too_big_for_the_disk_is_refused_before_the_work(tmp_path, monkeypatch):
    """The disk's answer (shutil.disk_usage) one byte short of the need: one line naming the sizes and the fix,
    and nothing trained or written; exactly the need: prepared."""
    path = tmp_path / "c.txt"
    path.write_text("word " * 2000)  # 10,000 bytes: a need of 1,010,200 (test_disk_need_worked_by_hand)
    cfg = cfg_for(tmp_path, [path])
    real = prepare_mod.shutil.disk_usage

    def free(n):
        return lambda p: real(p)._replace(free=n)

    monkeypatch.setattr(prepare_mod.shutil, "disk_usage", free(1_010_199))
    with pytest.raises(DataError) as ei:
        prepare_data(cfg, log=quiet)
    msg = str(ei.value)
    assert "\n" not in msg and "needs about 1.0 MB" in msg and "1.0 MB free. Fix: free space there" in msg
    assert f"in {tmp_path / 'cache'}" in msg and "--cache_dir on a disk with room" in msg
    assert not (tmp_path / "cache").exists()  # nothing trained or written (the lock removes the bare folder)
    monkeypatch.setattr(prepare_mod.shutil, "disk_usage", free(1_010_200))
    assert prepare_data(cfg, log=quiet).train.shape[0] > 1


def test_a_disk_that_fills_while_writing_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "c.txt"
    path.write_text("word " * 2000)
    cfg = cfg_for(tmp_path, [path])

    def full(*_a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(blocks_mod, "_split_in_place", full)
    with pytest.raises(DataError, match=r"filled up while the token blocks were written: the disk is full .*nothing "
                                        r"was kept\. Fix: free space there, or pass --cache_dir"):
        prepare_data(cfg, log=quiet)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".lock", "tokenizers"]


# ---------------------------------------------------------------- the measuring corpus
def test_growing_corpus_vocabulary_keeps_growing():
    """Heaps' law with exponent 1 / 1.5: 4 times the text, about 4 ** 0.67 = 2.5 times the distinct words (more
    than 2), never one text repeated; the same bytes for the same seed."""
    a, b = growing_corpus.text(100_000), growing_corpus.text(400_000)
    assert b.startswith(a) and b[100_000:200_000] != a
    assert growing_corpus.distinct_words(b) > 2 * growing_corpus.distinct_words(a)
    assert growing_corpus.text(1000, seed=1) != a[:1000] and growing_corpus.word(1) == "ba"
    assert [growing_corpus.word(r) for r in (90, 91, 92)] == ["zu", "baba", "babe"]
