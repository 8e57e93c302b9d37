"""Formats declared: what a JSON file read back must hold, written once as a tree of small specs, and the one
checker that walks a loaded value along it. No torch, nothing of the project: every reader can use it.

    RESULTS = Obj({"tag": Text(kind="a condition name (text)", nullable=False, nonempty=True),
                   "tokens": ListOf(Number(nullable=False), n="probes"), ...})
    check(RESULTS, loaded_dict, ctx={"probes": 5})

The first field that does not fit raises FormatError(where, expected, found); facts across fields are `rules` of
an Obj. Each spec also says itself as JSON Schema (`json_schema()`). Why specs of our own and not pydantic, and
what JSON Schema cannot say: docs/layout.md, "Formats declared".
"""
from __future__ import annotations

import json
import math
import re
from typing import Callable

from utils.errors import PicklesWhole, shown


def unreadable(e: BaseException) -> str:
    """What a JSON or YAML reader refused, in words, for the errors Python raises beside the reader's own: a whole
    number past Python's 4,300 digits, nesting deeper than the recursion limit, a value out of its range (a YAML date
    2020-13-45)."""
    if isinstance(e, RecursionError):
        return "lists or objects nested deeper than a reader follows"
    if "integer string conversion" in str(e):
        return "a whole number of over 4,300 digits, more than Python reads"
    return str(e)


class UnreadableJSON(PicklesWhole, json.JSONDecodeError):
    """JSON that json.loads refuses without a JSONDecodeError of its own (loads_json): its message says what, at no
    position (the reader stops where it is, not where the problem starts)."""

    def __str__(self) -> str:
        return self.msg


def loads_json(text: str, **kwargs):
    """json.loads (kwargs: its hooks), where what else Python's reader refuses (see unreadable) is a JSONDecodeError
    too, so that a reader's one handler of bad JSON names the file for every input. The one JSON parse of the readers
    of files a user gives or edits (configs.config.parse_json, research.results.values.parse_json)."""
    try:
        return json.loads(text, **kwargs)
    except (ValueError, RecursionError) as e:
        if isinstance(e, ValueError) and type(e) is not ValueError:  # JSONDecodeError, or a hook's (a key twice)
            raise
        raise UnreadableJSON(unreadable(e), text, 0) from None


class FormatError(PicklesWhole, ValueError):
    """One field that does not fit its declaration. str(): "<where> should be <expected>, found <found>", or
    "<where><problem>" for a rule's own words (a problem starts with its separator: " names ...", ": ...")."""

    def __init__(self, where: str, expected: str = "", found: str = "", problem: str | None = None):
        self.where, self.expected, self.found, self.problem = where, expected, found, problem
        super().__init__(self.text())

    def text(self, style: str = "should") -> str:
        """The message in one of the two wordings the project's files use: "should" (results.json and the studies'
        files: "x should be y, found z") or "expected" (study.json: "x: expected y, found z")."""
        if self.problem is not None:
            return f"{self.where}{self.problem}"
        if style == "expected":
            return f"{self.where or '(top level)'}: expected {self.expected}, found {self.found}"
        should = self.expected if self.expected.startswith("should ") else f"should be {self.expected}"
        return f"{self.where} {should}, found {self.found}"


# ----------------------------------------------------------------------------- how a value is shown

def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def found(v) -> str:
    """A value as a message shows it: containers by their JSON type, scalars by their repr (cut at 40)."""
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list" if v else "an empty list"
    return shown(v, 40)


def type_name(v) -> str:
    """A value shown by its Python type ('list', 'int', 'NoneType'): how results.json's messages show a container
    field that holds something else."""
    return type(v).__name__


def _join(where: str, key, style: str) -> str:
    if style == "index":
        return f"{where}[{shown(key, 60)}]"
    return f"{where}.{key}" if where else str(key)


# ----------------------------------------------------------------------------- specs

JSON_SCHEMA = "https://json-schema.org/draft/2020-12/schema"
GENERIC = ("a number", "an integer", "text", "a list", "an object", "")  # kinds a schema need not repeat


def _typed(schema: dict, nullable: bool, kind: str) -> dict:
    """`schema` accepting null too where `nullable`, described by `kind` unless that is a generic word."""
    out = dict(schema)
    if nullable and "type" in out:
        out["type"] = [out["type"], "null"]
    elif nullable and "enum" in out:
        out["enum"] = [*out["enum"], None]
    elif nullable and out:
        out = {"anyOf": [out, {"type": "null"}]}
    return {"description": kind, **out} if kind not in GENERIC else out


def _also(schema: dict, checks: list[str]) -> dict:
    """`schema` naming what only the project's checker checks."""
    if checks:
        schema["$comment"] = "also checked by the project's reader, not by this schema: " + "; ".join(checks)
    return schema


class Spec:
    """One value's declaration; check(value, where, ctx) raises FormatError or returns None; json_schema() says it
    as JSON Schema (a spec of its own with no JSON form: anything, left to its check)."""
    nullable = False

    def check(self, v, where: str, ctx: dict) -> None:
        raise NotImplementedError

    @property
    def expected(self) -> str:
        raise NotImplementedError

    def json_schema(self) -> dict:
        return _also({"description": self.expected}, [f"{self.expected} ({type(self).__name__})"])


class Scalar(Spec):
    """A number, an integer, text, one of some values... `ok(v)` says whether v fits; `kind` says it in words."""

    def __init__(self, ok: Callable[[object], bool], kind: str, nullable: bool = True, show=found,
                 schema: dict | None = None):
        self.ok, self.kind, self.nullable, self.show, self.schema = ok, kind, nullable, show, schema

    @property
    def expected(self) -> str:
        return f"{self.kind} or null" if self.nullable else self.kind

    def check(self, v, where, ctx):
        if not ((self.nullable and v is None) or self.ok(v)):
            raise FormatError(where, self.expected, self.show(v))

    def json_schema(self) -> dict:
        if self.schema is None:
            return super().json_schema()
        return _typed(self.schema, self.nullable, self.kind)


_BOUNDS = {"gt": ("exclusiveMinimum", lambda v, b: v > b), "ge": ("minimum", lambda v, b: v >= b),
           "lt": ("exclusiveMaximum", lambda v, b: v < b), "le": ("maximum", lambda v, b: v <= b)}


def Number(kind: str = "a number", nullable: bool = True, ok: Callable | None = None, **bounds: float) -> Scalar:
    """A number (never a boolean); bounds gt, ge, lt, le, said in JSON Schema too; `ok`: a further check JSON
    Schema cannot say."""
    schema = {"type": "number", **{_BOUNDS[b][0]: x for b, x in bounds.items()}}
    if ok is not None:
        schema["$comment"] = f"also checked by the project's reader, not by this schema: {kind}"
    return Scalar(lambda v: is_number(v) and all(_BOUNDS[b][1](v, x) for b, x in bounds.items())
                  and (ok is None or ok(v)), kind, nullable, schema=schema)


def Integer(kind: str = "an integer", nullable: bool = True, lo: int | None = None) -> Scalar:
    schema = {"type": "integer"} if lo is None else {"type": "integer", "minimum": lo}
    return Scalar(lambda v: is_integer(v) and (lo is None or v >= lo), kind, nullable, schema=schema)


def Text(kind: str = "text", nullable: bool = True, nonempty: bool = False, pattern: str | None = None,
         ok: Callable | None = None) -> Scalar:
    """Text; nonempty; pattern: a regular expression found in it (re.search, as JSON Schema's pattern); `ok`: a
    further check JSON Schema cannot say."""
    schema = {"type": "string", **({"minLength": 1} if nonempty else {}), **({"pattern": pattern} if pattern else {})}
    if ok is not None:
        schema["$comment"] = f"also checked by the project's reader, not by this schema: {kind}"
    return Scalar(lambda v: isinstance(v, str) and (bool(v) or not nonempty) and (
        pattern is None or re.search(pattern, v) is not None) and (ok is None or ok(v)), kind, nullable, schema=schema)


def OneOf(values, nullable: bool = False, kind: str | None = None) -> Scalar:
    """One of some texts; kind: what it is in words (default 'one of A, B')."""
    return Scalar(lambda v: isinstance(v, str) and v in values, kind or f"one of {', '.join(values)}", nullable,
                  schema={"enum": list(values)})


def Bool(kind: str = "true or false", nullable: bool = False) -> Scalar:
    return Scalar(lambda v: isinstance(v, bool), kind, nullable, schema={"type": "boolean"})


class Custom(Spec):
    """A value checked by a function of the project that raises ValueError in its own words (a margin's rule):
    the message is "<where>: <its words>". like: a spec the function's rule holds in (its JSON Schema)."""

    def __init__(self, fn: Callable, kind: str, like: Spec | None = None):
        self.fn, self.kind, self.like = fn, kind, like

    expected = property(lambda self: self.kind)

    def check(self, v, where, ctx):
        try:
            self.fn(v)
        except ValueError as e:
            raise FormatError(where, problem=f": {e}") from e

    def json_schema(self) -> dict:
        return super().json_schema() if self.like is None else {**self.like.json_schema(), "description": self.kind}


class Opt(Spec):
    """A field that may be absent; when present, `spec` holds (absent differs from null here)."""

    def __init__(self, spec: Spec):
        self.spec = spec

    expected = property(lambda self: self.spec.expected)

    def check(self, v, where, ctx):
        self.spec.check(v, where, ctx)

    def json_schema(self) -> dict:
        return self.spec.json_schema()


class Req(Opt):
    """A field that must be present (even where `spec` allows null): "<where> should hold <name> (...)"."""


class Rule(Spec):
    """A check across the fields of the Obj it is declared in, run where it is declared (before the fields after
    it, which may rely on it): fn(obj, where, ctx) raises FormatError."""

    def __init__(self, fn: Callable):
        self.fn = fn

    expected = ""

    def check(self, v, where, ctx):
        self.fn(v, where, ctx)


def _rule_words(fn: Callable) -> str:
    """A rule as a schema's comment names it: its docstring's first sentence, else its name in words."""
    words = " ".join((fn.__doc__ or "").split("\n\n")[0].split()).split(". ")[0].rstrip(".")
    words = words or fn.__name__.strip("_").replace("_", " ")
    return words[0].lower() + words[1:]


def _length_words(size: str) -> str:
    return "its length: " + size.split(", found")[0].format(n="N", len="")


class ListOf(Spec):
    """A list of `item`s. n: its length, an int or a function of ctx (None: any); `size` words a wrong length
    ({n}, {len}); nonempty; uniform: one length wherever the list sits (its path with indices dropped, e.g. every
    probe's per-head list of one metric); whole: a wrong item is told as the whole list not fitting."""

    def __init__(self, item: Spec, kind: str | None = None, n=None, size: str = "should have {n} values, found {len}",
                 nonempty: bool = False, nullable: bool = False, uniform: bool = False, whole: bool = False,
                 empty_ok: bool = False, show=type_name):
        self.item, self.n, self.size, self.nonempty, self.nullable = item, n, size, nonempty, nullable
        self.uniform, self.whole, self.empty_ok, self.show = uniform, whole, empty_ok, show
        self.kind = kind or "a list"

    @property
    def expected(self) -> str:
        return f"{self.kind} or null" if self.nullable else self.kind

    def check(self, v, where, ctx):
        if v is None and self.nullable:
            return
        if not isinstance(v, list) or (self.nonempty and not v):
            raise FormatError(where, self.expected, self.show(v))
        n = self.n(ctx) if callable(self.n) else ctx.get(self.n) if isinstance(self.n, str) else self.n
        if self.uniform:
            n = ctx.setdefault(("length", re.sub(r"\[[^\]]*\]", "[]", where)), len(v))
        if n is not None and len(v) != n and not (self.empty_ok and not v):
            raise FormatError(where, problem=" " + self.size.format(n=n, len=len(v)))
        for i, x in enumerate(v):
            try:
                self.item.check(x, f"{where}[{i}]", ctx)
            except FormatError:
                if not self.whole:
                    raise
                raise FormatError(where, self.expected, self.show(v)) from None

    def json_schema(self) -> dict:
        out: dict = {"type": "array", "items": self.item.json_schema()}
        also = []
        if isinstance(self.n, int) and not self.empty_ok:
            out["minItems"] = out["maxItems"] = self.n
        elif self.n is not None or self.uniform:  # a length given by other fields, or one length everywhere
            also.append(_length_words(self.size))
        if self.nonempty:
            out["minItems"] = max(1, out.get("minItems", 1))
        return _also(_typed(out, self.nullable, self.kind), also)


class MapOf(Spec):
    """A JSON object of any keys, each value a `value`; `key(k)` says whether a key fits (told as `key_kind`).
    path: "index" names a value x['k'], "dot" x.k."""

    def __init__(self, value: Spec, kind: str = "an object", key: Callable | None = None, key_kind: str = "",
                 path: str = "index", nullable: bool = False, nonempty: bool = False, show=type_name,
                 key_pattern: str | None = None):
        if key_pattern is not None:  # keys the whole of which match (said in JSON Schema too)
            key = lambda k: isinstance(k, str) and re.fullmatch(key_pattern, k) is not None
        self.value, self.kind, self.key, self.key_kind, self.path = value, kind, key, key_kind, path
        self.nullable, self.nonempty, self.show, self.key_pattern = nullable, nonempty, show, key_pattern

    expected = property(lambda self: self.kind)

    def check(self, v, where, ctx):
        if v is None and self.nullable:
            return
        if not isinstance(v, dict) or (self.nonempty and not v):
            raise FormatError(where, self.expected, self.show(v))
        for k, x in v.items():
            if self.key is not None and not self.key(k):
                raise FormatError(where, problem=f" should be keyed by {self.key_kind}, found the key {shown(k, 40)}")
            self.value.check(x, _join(where, k, self.path), ctx)

    def json_schema(self) -> dict:
        out: dict = {"type": "object", "additionalProperties": self.value.json_schema()}
        if self.key_pattern is not None:
            out["propertyNames"] = {"pattern": f"^(?:{self.key_pattern})$"}
        if self.nonempty:
            out["minProperties"] = 1
        also = [f"its keys: {self.key_kind}"] if self.key is not None and self.key_pattern is None else []
        return _also(_typed(out, self.nullable, self.kind), also)


class Obj(Spec):
    """A JSON object of declared fields, checked in the order declared: an absent field is checked as null, except
    an Opt (skipped) and a Req (refused); a Rule among them (under any label) checks the object there. rest: the
    spec of every undeclared key (None: not checked). name: the object is ctx[name] while its fields are checked (a
    length given by another field). rules: checks across fields, f(value, where, ctx), run after the fields. A kind
    may be a whole predicate ("should map sites to metrics") where "should be ..." would not say it."""

    def __init__(self, fields: dict[str, Spec], kind: str = "an object", nullable: bool = False,
                 rest: Spec | None = None, name: str | None = None, rules: tuple = (), show=type_name):
        self.fields, self.kind, self.nullable, self.rest, self.name = fields, kind, nullable, rest, name
        self.rules, self.show = rules, show

    expected = property(lambda self: self.kind)

    def check(self, v, where, ctx):
        if v is None and self.nullable:
            return
        if not isinstance(v, dict):
            raise FormatError(where, self.expected, self.show(v))
        if self.name:
            ctx[self.name] = v
        for name, spec in self.fields.items():
            if isinstance(spec, Rule):
                spec.check(v, where, ctx)
                continue
            at = _join(where, name, "dot")
            if name not in v and isinstance(spec, Opt):
                if isinstance(spec, Req):
                    raise FormatError(where, problem=f" should hold {name} ({spec.expected}), found no {name}")
                continue
            spec.check(v.get(name), at, ctx)
        if self.rest is not None:
            for k, x in v.items():
                if k not in self.fields:
                    self.rest.check(x, _join(where, k, "dot"), ctx)
        for rule in self.rules:
            rule(v, where, ctx)

    def json_schema(self) -> dict:
        """Its fields as properties; required: a Req, and a field that is not an Opt and may not be null (the
        checker checks an absent field as null); rest: additionalProperties; the Rules named in a comment."""
        properties, required = {}, []
        for name, spec in self.fields.items():
            if not isinstance(spec, Rule):
                properties[name] = spec.json_schema()
                if isinstance(spec, Req) or not (isinstance(spec, Opt) or spec.nullable):
                    required.append(name)
        out: dict = {"type": "object", "properties": properties}
        if required:
            out["required"] = required
        if self.rest is not None:
            out["additionalProperties"] = self.rest.json_schema()
        rules = [spec.fn for spec in self.fields.values() if isinstance(spec, Rule)] + list(self.rules)
        return _also(_typed(out, self.nullable, self.kind), [_rule_words(fn) for fn in rules])


def check(spec: Spec, value, where: str = "", ctx: dict | None = None) -> None:
    """Walk `value` along its declaration; FormatError names the first field that does not fit."""
    spec.check(value, where, {} if ctx is None else ctx)


def json_schema(spec: Spec, title: str, description: str) -> dict:
    """A whole file's JSON Schema document from its declaration."""
    return {"$schema": JSON_SCHEMA, "title": title, **spec.json_schema(), "description": description}


def finite(v) -> bool:
    return is_number(v) and math.isfinite(v)
