"""How a config field is declared (`knob`), and the checks that read the declaration.

Each field of the config dataclasses (configs.config) is declared once, where it is defined: its type (a `Literal`
of the values where a text field has a fixed set), its default, its help sentence, whether it is a variant a study
compares, and whether it changes what a run computes. `--help` (configs.help.field_help), `check_choices`,
`check_kinds`, study files (configs.files.field_values), resume (training.resume.RESUMABLE_CHANGES), the condition
table and the variants benchmark all read that one declaration: docs/training.md, "Attention variants".
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any, Literal

from utils.errors import ConfigError, shown


def knob(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = dataclasses.MISSING,
         variant: bool = False, timed: tuple[str, ...] = (), results: bool = True) -> Any:
    """A config field's declaration: its `default` (or a `factory` for a list); `help`, what it means for --help
    (units, what 0 means; the choices and the default are added there, never written here); `variant`: a model, loss
    or optimizer variant that a study's conditions set (the condition table names its value); `timed`: the values the
    variants benchmark times against the default, as a command line writes them (a variant's); `results`: False for a
    field that changes what is measured, logged or kept, not what the run computes, so that a resume or a study's
    recorded run may differ in it."""
    meta = {"help": help, "variant": variant or bool(timed), "timed": tuple(timed), "results": results}
    return dataclasses.field(default=default, default_factory=factory, metadata=meta)


def literal_choices(hint) -> tuple[str, ...] | None:
    """The values of a `Literal[...]` type hint; None for any other type."""
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def split_list(text: str) -> list[str]:
    """'a,b,,c' -> ['a', 'b', 'c'] (a list field written as text, in a file or on the command line)."""
    return [p for p in text.split(",") if p]


def coerce_value(name: str, hint, value, where: str) -> object:
    """`value` as the field's type, or ConfigError "<where><name>: expected ..., found ..."; YAML reads 1e-3 as
    text, so numbers in text are accepted for float fields (never for whole numbers)."""
    def bad(kind: str):
        return ConfigError(f"{where}{name}: expected {kind}, found {shown(value)}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in BOOL_WORDS:
            return BOOL_WORDS[value.strip().lower()]
        raise bad("true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad("a whole number")
    if hint is float:
        try:
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                return float(value)
        except ValueError:
            pass
        raise bad("a number")
    if typing.get_origin(hint) is list:
        if isinstance(value, str):
            return split_list(value)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise bad("a list of strings")
    if isinstance(value, (str, bool)):  # a bool reaches the field's own check (YAML reads `compile: off` as false)
        return value
    raise bad("a string")


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """{field name: resolved type hint} of a config dataclass (resolved once per class: callers only read it)."""
    return typing.get_type_hints(cls)


def check_kinds(cfg) -> None:
    """Every float field of a config section is a finite number (NaN and infinity pass some range checks), every
    whole-number field a 64-bit one (torch, numpy and the files written hold no larger), every text field text (YAML
    reads `off` as false)."""
    types = hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value, hint = getattr(cfg, f.name), types[f.name]
        if hint is float and isinstance(value, (int, float)) and not math.isfinite(value):
            raise ConfigError(f"{f.name}={value} must be a finite number")
        if hint is int and isinstance(value, int) and not -2 ** 63 <= value < 2 ** 63:
            raise ConfigError(f"{f.name}={shown(value)} is beyond the 64-bit whole numbers a run computes with: give "
                              f"one below 2**63")
        if (hint is str or literal_choices(hint)) and not isinstance(value, str):
            raise ConfigError(f"{f.name}={shown(value)} must be text")


def check_choices(cfg) -> None:
    """Every field of `cfg` declared with a fixed set of values (a Literal) holds one of them."""
    types = hints(type(cfg))
    for f in dataclasses.fields(cfg):
        choices = literal_choices(types[f.name])
        value = getattr(cfg, f.name)
        if choices is not None and value not in choices:
            raise ConfigError(f"{f.name}={shown(value)}: choose one of {', '.join(choices)}")
