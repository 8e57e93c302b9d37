"""Training text that is not what its suffix says (--source files): a file that is not UTF-8, a binary
file, JSON lines without records, objects or the text field, a damaged or empty parquet file. Each is one
DataError naming the file, the cause and the fix, whether --paths names the file, its folder or a glob."""
from __future__ import annotations

import re

import pytest

from data import DataError
from data import local_files as files_mod
from data import tokenizer as tokenizer_mod


def _parquet(rows: list, path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": pa.array(rows, pa.string())}), path)
    return path.read_bytes()


def _load(paths: list[str], tmp_path):
    return files_mod.files_source(paths).load(tmp_path / "work")


CASES = [  # (file name, bytes, what the message says: the cause, then the fix)
    ("latin.txt", b"caf\xc3\xa9 ok\nna\xefve\n", r"not UTF-8: byte 0xef at offset 11 \(line 2\)\. Fix: convert it "
                                                 r"to UTF-8 .*or remove it from --paths"),
    ("image.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", r"a binary file, not text \(a NUL byte at offset 8\)\. "
                                                          r"Fix: remove it from --paths"),
    ("wide.txt", "hi".encode("utf-16"), r"UTF-16 text, not UTF-8\. Fix: convert it \(iconv -f UTF-16 -t UTF-8\)"),
    ("latin.jsonl", b'{"text": "caf\xe9"}\n', r"not UTF-8: byte 0xe9 at offset 13 \(line 1\)"),
    ("empty.jsonl", b"", r"holds no records \(it is empty\)\. Fix: remove it from --paths"),
    ("blank.json", b"\n  \n", r"holds no records \(it is empty\)"),
    ("none.json", b"[]", r"holds no records\. Fix: "),
    ("array.jsonl", b'{"text": "a"}\n{"text": "b"}\n[1, 2]\n', r"line 3 is not a JSON object \(it is an array\)\. "
                                                              r"Fix: write one JSON object per line"),
    ("cut.jsonl", b'{"text": "a"}\n{"text": \n', r"line 2 is not JSON \(Expecting value at column 10\)"),
    ("field.jsonl", b'{"text": "a"}\n{"body": "b"}\n', r"line 2 has no field 'text' \(its fields: body\)\. Fix: "
                                                       r"pass --text_field NAME"),
    ("null.jsonl", b'{"text": "a"}\n{"text": null}\n', r"line 2: field 'text' is null, not text\. Fix: pass "
                                                       r"--text_field NAME"),
    ("number.jsonl", b'{"text": "a"}\n{"text": 5}\n', r"line 2: field 'text' is a number, not text"),
    ("scalar.json", b"3\n", r"line 1 is not a JSON object \(it is a number\)"),
    ("records.json", b'[{"text": "a"}, "b"]', r"record 2 is not a JSON object \(it is a string\)"),
    ("junk.parquet", b"this is not parquet", r"not a parquet file, or a damaged one \(no PAR1 marker .*\)\. Fix: "
                                             r"write it again, or remove it from --paths"),
    ("cut.parquet", None, r"a damaged parquet file \(ArrowInvalid: .*\)\. Fix: write it again"),
    ("empty.parquet", None, r"holds no records \(a parquet file of 0 rows\)"),
    ("null.parquet", None, r"row 2: field 'text' is missing or null\. Fix: pass --text_field NAME"),
]


def _write(folder, name, raw):
    path = folder / name
    if name == "cut.parquet":
        whole = _parquet(["a", "b"], path)
        raw = whole[:len(whole) // 2] + whole[-8:]  # PAR1 at both ends, the body cut
    elif name == "empty.parquet":
        raw = _parquet([], path)
    elif name == "null.parquet":
        raw = _parquet(["a", None], path)
    path.write_bytes(raw)
    return path


@pytest.mark.parametrize("name, raw, cause", CASES, ids=[c[0] for c in CASES])
def test_a_file_that_is_not_text_is_named_with_its_cause_and_fix(tmp_path, name, raw, cause):
    path = _write(tmp_path, name, raw)
    with pytest.raises(DataError, match=rf"^source=files: {re.escape(str(path))}:? " + cause):
        _load([str(path)], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["latin.txt", "image.txt", "field.jsonl", "junk.parquet"])
def test_folders_and_globs_give_the_same_cause(tmp_path, name):
    """The bad file beside good ones of every kind (which load as before), named through its folder and through
    patterns."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("plain caf\u00e9 text")
    (folder / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "n": 1}\n')
    (folder / "c.json").write_text('[{"text": "three"}]')
    _parquet(["four"], folder / "d.parquet")
    (folder / "e.txt").write_text("")  # an empty text file is one empty document, as before
    assert _load([str(folder)], tmp_path)["text"] == ["plain caf\u00e9 text", "one", "two", "three", "four", ""]
    raw, cause = next((c[1], c[2]) for c in CASES if c[0] == name)
    path = _write(folder, name, raw)
    for given in (str(folder), str(folder / f"*{path.suffix}"), str(tmp_path / "**" / name)):
        with pytest.raises(DataError, match=rf"^source=files: {re.escape(str(path))}:? " + cause):
            _load([given], tmp_path)


def test_a_tokenizer_cache_whose_meta_is_not_utf8_is_named(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / tokenizer_mod.META_NAME).write_bytes(b"\xff\xfe{}")
    with pytest.raises(DataError, match=rf"tokenizer cache {re.escape(str(folder))} is unusable: cannot read "
                                        rf"{tokenizer_mod.META_NAME} \(UnicodeDecodeError: .*Fix: delete"):
        tokenizer_mod._load_cached(folder, {})
    (folder / tokenizer_mod.META_NAME).write_text("[1, 2]")
    with pytest.raises(DataError, match=r"holds list, not an object\. Fix: delete"):
        tokenizer_mod._load_cached(folder, {})
