"""Command-line overrides for every config field.

`add_config_args(parser, defaults)` adds `--preset` and one option per field of ModelConfig,
TrainConfig, DataConfig and ProbeConfig (spelled with underscores or dashes); each option's
help shows its value in `defaults`, the config the user gets without it. Options left out
keep the preset's value; unknown options are rejected by argparse.
`config_from_args(args)` builds the preset, applies the overrides and validates.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing

from configs.config import ConfigError, DataConfig, ModelConfig, ProbeConfig, RunConfig, TrainConfig
from configs.presets import PRESETS, get_preset

SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "probe": ProbeConfig}


def _parse_bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def _parse_list(s: str) -> list[str]:
    return [p for p in s.split(",") if p]


def _field_type(cls, f: dataclasses.Field):
    hint = typing.get_type_hints(cls)[f.name]
    if hint is bool:
        return _parse_bool, "BOOL"
    if hint is int:
        return int, "N"
    if hint is float:
        return float, "X"
    if typing.get_origin(hint) is list:
        return _parse_list, "A,B,..."
    return str, "STR"


def _all_fields():
    seen: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f.name not in seen, f"config field {f.name} is in both {seen[f.name]} and {section}"
            seen[f.name] = section
            yield section, cls, f


def preset_in(argv: list[str] | None, default: str) -> str:
    """The --preset named in argv (or `default`), read before the full parser exists, so that
    --help can show the chosen preset's values. An unknown name is left for the parser to reject."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--preset", default=default)
    return pre.parse_known_args(argv)[0].preset


def add_config_args(parser: argparse.ArgumentParser, defaults: RunConfig, default_preset: str = "tiny",
                    extra_presets=(), preset_help: str | None = None, notes: dict[str, str] | None = None) -> None:
    """--preset and one option per config field; `defaults` is the config a user gets when the
    option is left out (its value is printed in the help), `notes` replace a field's default text."""
    parser.add_argument("--preset", default=default_preset, choices=[*extra_presets, *sorted(PRESETS)],
                        help=preset_help or f"named starting config (default {default_preset})")
    notes = notes or {}
    for section, cls, f in _all_fields():
        typ, metavar = _field_type(cls, f)
        names = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
        value = getattr(getattr(defaults, section), f.name)
        shown = notes.get(f.name, (",".join(map(str, value)) or "none") if isinstance(value, list) else value)
        parser.add_argument(*names, dest=f"cfg__{f.name}", type=typ, metavar=metavar,
                            default=argparse.SUPPRESS, help=f"[{section}] default: {shown}")


def overrides_from_args(args: argparse.Namespace) -> dict[str, object]:
    return {k[len("cfg__"):]: v for k, v in vars(args).items() if k.startswith("cfg__")}


def apply_overrides(cfg: RunConfig, overrides: dict[str, object]) -> RunConfig:
    """Return a new, validated RunConfig with `overrides` ({field: value}) applied."""
    where = {f.name: section for section, _, f in _all_fields()}
    parts = {s: dataclasses.asdict(getattr(cfg, s)) for s in SECTIONS}
    for name, value in overrides.items():
        if name not in where:
            raise ConfigError(f"unknown config field {name!r}")
        parts[where[name]][name] = value
    return RunConfig(**{s: cls(**parts[s]) for s, cls in SECTIONS.items()}, preset=cfg.preset)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    return apply_overrides(get_preset(args.preset), overrides_from_args(args))
