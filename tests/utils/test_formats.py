"""utils.formats: the one checker behind every declared file format (results.json, study.json, the studies' files,
a checkpoint's state.json). Each spec names the field path, what it should be and what it holds."""
from __future__ import annotations

import pytest

from utils.formats import (Bool, FormatError, Integer, ListOf, MapOf, Number, Obj, OneOf, Opt, Req, Rule, Text, check,
                           found, json_schema)


def _not_bad(v: dict, where: str, ctx) -> None:
    if v["name"] == "bad":
        raise FormatError("name", problem=" is bad")


FORMAT = Obj({
    "name": Text("a name (text)", nullable=False, nonempty=True),
    "seed": Integer(),  # absent and null alike
    "n": Opt(Integer("a positive integer", nullable=False, lo=1)),  # may be absent, never null
    "kind": OneOf(("a", "b")),
    "values": ListOf(Number(), "a list of numbers or null", n="probes", size="should have {n} values, found {len}"),
    "layers": MapOf(ListOf(Number(), "a list", uniform=True), key=str.isdigit, key_kind="layer index"),
    "entry": Obj({"x": Req(Number())}, nullable=True),
    "(rule)": Rule(_not_bad),
})
GOOD = {"name": "run", "kind": "a", "values": [1.0, None], "layers": {"0": [1, 2], "1": [3, 4]}}


def _message(damage: dict) -> str:
    with pytest.raises(FormatError) as err:
        check(FORMAT, {**GOOD, **damage}, ctx={"probes": 2})
    return str(err.value)


@pytest.mark.parametrize("damage,message", [
    ({"name": ""}, "name should be a name (text), found ''"),
    ({"seed": 1.5}, "seed should be an integer or null, found 1.5"),
    ({"seed": True}, "seed should be an integer or null, found True"),
    ({"n": None}, "n should be a positive integer, found None"),
    ({"kind": ["a"]}, "kind should be one of a, b, found a list"),
    ({"values": [1.0]}, "values should have 2 values, found 1"),
    ({"values": [1.0, "2"]}, "values[1] should be a number or null, found '2'"),
    ({"values": {}}, "values should be a list of numbers or null, found dict"),
    ({"layers": {"x": [1]}}, "layers should be keyed by layer index, found the key 'x'"),
    ({"layers": {"0": [1, 2], "1": [3]}}, "layers['1'] should have 2 values, found 1"),
    ({"entry": {}}, "entry should hold x (a number or null), found no x"),
    ({"name": "bad"}, "name is bad"),
])
def test_each_spec_names_the_field_what_it_should_be_and_what_it_holds(damage, message):
    assert _message(damage) == message


def test_a_file_that_fits_passes_and_the_two_wordings():
    check(FORMAT, GOOD, ctx={"probes": 2})
    check(FORMAT, {**GOOD, "seed": None, "n": 3, "entry": None}, ctx={"probes": 2})
    err = FormatError("seeds", "a list of integers", found("0 1"))
    assert err.text() == "seeds should be a list of integers, found '0 1'"
    assert err.text("expected") == "seeds: expected a list of integers, found '0 1'"
    assert FormatError("", "an object", "a list").text("expected") == "(top level): expected an object, found a list"


def test_bounds_patterns_and_booleans_hold_in_the_checker_and_in_json_schema():
    level = Number("a level in (0, 1]", nullable=False, gt=0, le=1)
    check(level, 1.0)
    for bad in (0, 1.5, True):
        with pytest.raises(FormatError, match="should be a level in"):
            check(level, bad)
    assert level.json_schema() == {"description": "a level in (0, 1]", "type": "number", "exclusiveMinimum": 0,
                                   "maximum": 1}
    path = Text("a path (text)", nullable=False, pattern=r"\S")
    check(path, " a ")
    with pytest.raises(FormatError):
        check(path, "  ")
    assert Bool().json_schema() == {"description": "true or false", "type": "boolean"}
    with pytest.raises(FormatError):
        check(Bool(), 1)
    layers = MapOf(Number(), key_pattern="0|[1-9][0-9]*", key_kind="layer index")
    check(layers, {"0": 1, "10": None})
    with pytest.raises(FormatError, match="found the key '01'"):
        check(layers, {"01": 1})
    assert layers.json_schema() == {"type": "object", "additionalProperties": {"type": ["number", "null"]},
                                    "propertyNames": {"pattern": "^(?:0|[1-9][0-9]*)$"}}


def test_json_schema_requires_what_the_checker_refuses_when_absent():
    """Absent is checked as null: a field is required when it is a Req, or neither an Opt nor nullable."""
    def rule(v, where, ctx):
        """One rule across fields. More words."""
    spec = Obj({"a": Number(nullable=False), "b": Number(), "c": Opt(Number(nullable=False)), "d": Req(Number()),
                "(rule)": Rule(rule)}, rest=Integer())
    schema = json_schema(spec, "x.json", "a file")
    assert schema["required"] == ["a", "d"] and list(schema["properties"]) == ["a", "b", "c", "d"]
    assert schema["additionalProperties"] == {"type": ["integer", "null"]}
    assert schema["$comment"].endswith("not by this schema: one rule across fields")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema" and schema["description"] == "a file"
    assert ListOf(Number(), n="probes").json_schema()["$comment"].endswith("its length: should have N values")
    assert ListOf(Number(), n=2).json_schema() == {"type": "array", "items": {"type": ["number", "null"]},
                                                   "minItems": 2, "maxItems": 2}
