"""Why a file is not what it should be: text that is not UTF-8 (checked a chunk at a time by TextCheck, or whole
by decode_text), JSON that is not records holding the text field, a parquet file without its markers; each cause
named with its place and the fix (the fix of a JSON problem: json_fix)."""
from __future__ import annotations

import json

from data.source import DataError
from utils.errors import shown

LEAVE_OUT = "remove it from --paths (or from the folder or pattern given there)"


class TextCheck:
    """decode_text's checks on a file fed a chunk at a time, so memory holds one chunk: feed() the bytes in order
    (it returns their text; a character cut at a chunk's end waits for the next chunk), then finish() raises the
    DataError decode_text would raise for the whole, the same words, offsets and line."""

    def __init__(self, where: str, leave_out: str = LEAVE_OUT):
        self.where, self.leave_out = where, leave_out
        self.head = b""  # the first two bytes: a UTF-16 byte-order mark?
        self.read = 0  # bytes fed so far
        self.done = 0  # bytes decoded so far (the rest is self.carry)
        self.lines = 0  # line breaks in them
        self.carry = b""
        self.nul: int | None = None  # offset of the first NUL byte
        self.bad: tuple[int, int, int] | None = None  # (offset, byte, line) of the first byte that is not UTF-8

    def feed(self, data: bytes) -> str:
        if len(self.head) < 2:
            self.head += data[:2 - len(self.head)]
        if self.nul is None and (i := data.find(b"\0")) >= 0:
            self.nul = self.read + i
        self.read += len(data)
        if self.bad is not None:
            return ""
        buf = self.carry + data if self.carry else data
        try:
            text, end = buf.decode("utf-8"), len(buf)
        except UnicodeDecodeError as e:
            if e.reason != "unexpected end of data" or e.end != len(buf):
                self.bad = (self.done + e.start, buf[e.start], self.lines + buf.count(b"\n", 0, e.start) + 1)
                return ""
            text, end = buf[:e.start].decode("utf-8"), e.start  # a character the next chunk finishes
        self.lines += buf.count(b"\n", 0, end)
        self.done += end
        self.carry = buf[end:]
        return text

    def finish(self) -> None:
        where, leave_out = self.where, self.leave_out
        if self.head in (b"\xff\xfe", b"\xfe\xff"):
            raise DataError(f"{where}: UTF-16 text, not UTF-8. Fix: convert it (iconv -f UTF-16 -t UTF-8), or "
                            f"{leave_out}")
        if self.nul is not None:
            raise DataError(f"{where}: a binary file, not text (a NUL byte at offset {self.nul:,}). Fix: {leave_out}")
        if self.bad is None and self.carry:  # the file ends inside a character
            self.bad = (self.done, self.carry[0], self.lines + 1)
        if self.bad is not None:
            offset, byte, line = self.bad
            raise DataError(f"{where}: not UTF-8: byte 0x{byte:02x} at offset {offset:,} (line {line}). Fix: "
                            f"convert it to UTF-8 (e.g. iconv -f WINDOWS-1252 -t UTF-8, naming its real encoding), "
                            f"or {leave_out}")


def decode_text(raw: bytes, where: str, leave_out: str = LEAVE_OUT) -> str:
    """raw as UTF-8 text, else a DataError naming `where`, the cause (a binary or UTF-16 file, or the
    first byte that is not UTF-8, with its offset and line) and the fix; every reader of text files uses it
    (files too long to hold whole feed a TextCheck)."""
    check = TextCheck(where, leave_out)
    text = check.feed(raw)
    check.finish()
    return text


def _json_kind(v) -> str:
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "true/false", type(None): "null"}
    return kinds.get(type(v), "a number")


def json_problem(text: str, field: str) -> str | None:
    """The first reason the text of a .json/.jsonl file is not records holding a text field `field`
    (no records, a line that is not JSON or not an object, the field missing, null or not a string),
    or None. A whole-file JSON array is read as records, else one JSON value per line."""
    try:
        whole = json.loads(text)
    except ValueError:
        records = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((f"line {i}", json.loads(line)))
            except ValueError as e:
                return f"line {i} is not JSON ({getattr(e, 'msg', e)} at column {getattr(e, 'colno', '?')})"
    else:
        if isinstance(whole, list):
            records = [(f"record {i}", v) for i, v in enumerate(whole, 1)]
        else:
            records = [("line 1" if "\n" not in text.strip() else "the file's JSON value", whole)]
    if not records:
        return "holds no records"
    for where, v in records:
        if not isinstance(v, dict):
            return f"{where} is not a JSON object (it is {_json_kind(v)})"
        if field not in v:
            return f"{where} has no field {shown(field)} (its fields: {', '.join(v) or 'none'})"
        if not isinstance(v[field], str):
            return f"{where}: field {shown(field)} is {_json_kind(v[field])}, not text"
    return None


def json_fix(problem: str) -> str:
    if "field" in problem:
        return f"pass --text_field NAME (the field that holds the text), or fix the file, or {LEAVE_OUT}"
    return f"write one JSON object per line (JSON lines) or one array of objects, or {LEAVE_OUT}"


def parquet_problem(raw: bytes) -> str | None:
    """Why raw cannot be a parquet file (no PAR1 marker at its start and end: not parquet, or cut off), or None."""
    return parquet_ends_problem(len(raw), raw[:4], raw[-4:])


def parquet_ends_problem(size: int, head: bytes, tail: bytes) -> str | None:
    """parquet_problem of a file of `size` bytes that starts with `head` and ends with `tail` (4 bytes each)."""
    if size < 12 or head != b"PAR1" or tail != b"PAR1":
        return "not a parquet file, or a damaged one (no PAR1 marker at its start and end: cut off or not parquet)"
    return None
