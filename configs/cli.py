"""Command-line overrides for every config field.

`add_config_args(parser, defaults)` adds `--preset`, `--config FILE` and one option per field of
ModelConfig, TrainConfig, DataConfig and ProbeConfig, spelled as the field is (`--n_layers`); each
option's help is the field's sentence (configs.help), its choices where it has them, and its value in
`defaults`, the config the user gets without it. Unknown options are rejected by argparse.
`config_from_args(args)` builds the config in this order, later wins: the preset (--preset, else
the file's `preset`, else the script's default), the --config file's values (configs.files), the
command-line options; then validates.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Callable

from configs.config import GIVEN_ONCE, ConfigError, RunConfig
from configs.files import BOOL_WORDS, SECTIONS, ConfigFile, read_config_file, split_list
from configs.help import field_help
from configs.presets import PRESETS, get_preset
from utils.cli import ArgumentParser, once
from utils.errors import shown


def _parse_bool(s: str) -> bool:
    v = s.strip().lower()
    words = {**BOOL_WORDS, "1": True, "0": False}  # the command line also takes 1 and 0
    if v in words:
        return words[v]
    raise argparse.ArgumentTypeError(f"expected true or false, got {shown(s)}")


def _field_type(cls, f: dataclasses.Field):
    hint = typing.get_type_hints(cls)[f.name]
    if hint is bool:
        return _parse_bool, "BOOL"
    if hint is int:
        return int, "N"
    if hint is float:
        return float, "X"
    if typing.get_origin(hint) is list:
        return split_list, "A,B,..."
    return str, "STR"


def _all_fields():
    seen: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f.name not in seen, f"config field {f.name} is in both {seen[f.name]} and {section}"
            seen[f.name] = section
            yield section, cls, f


def start_in(argv: list[str] | None, default: str) -> tuple[str, ConfigFile | None]:
    """The preset and the --config file named in argv, read before the full parser exists so that --help
    can show the values a user gets. The preset: --preset, else the file's, else `default`; an unknown
    name is left for the parser to reject. A bad file raises ConfigError."""
    pre = ArgumentParser(add_help=False)
    pre.add_argument("--preset")
    pre.add_argument("--config")
    known = pre.parse_known_args(argv)[0]
    file = read_config_file(known.config) if known.config else None
    return _chosen_preset(known.preset, file, default), file


def parse_once(build: Callable[[tuple[str, ConfigFile | None, argparse.Namespace] | None], argparse.ArgumentParser],
               argv: list[str] | None, default_preset: str) -> argparse.Namespace:
    """argv parsed once, for the help and the run. `build(None)` makes the parser that parses (its option
    texts are never shown, so no preset is built for them; `-h/--help` is a flag there, see help_flag); asked
    for --help, `build((preset, file, args))` with the preset and the --config file the parse named (and the
    parsed arguments) makes the parser whose help shows their values, which is printed. The --config file is
    read once, here or by start_from_args."""
    args = build(None).parse_args(argv)
    if not args.help:
        return args
    file = read_config_file(args.config) if args.config else None
    parser = build((_chosen_preset(args.preset, file, default_preset), file, args))
    parser.print_help()
    parser.exit()


def help_flag(parser: argparse.ArgumentParser) -> None:
    """-h/--help as a flag of a parser made with add_help=False (parse_once prints the help after the parse)."""
    parser.add_argument("-h", "--help", action="store_true", help="show this help message and exit")


def _chosen_preset(given: str | None, file: ConfigFile | None, default: str) -> str:
    """--preset, else the --config file's preset, else the script's default."""
    return given or (file.preset if file else None) or default


def shown_value(value) -> object:
    """A value as the command line spells it: a list comma-separated, a bool true or false, empty text as empty."""
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    if isinstance(value, bool):
        return str(value).lower()
    return "empty" if value == "" else value


def add_config_args(parser: argparse.ArgumentParser, defaults: RunConfig | None, default_preset: str = "tiny",
                    extra_presets=(), preset_help: str | None = None, notes: dict[str, str] | None = None,
                    file: ConfigFile | None = None) -> None:
    """--preset, --config and one option per config field; `defaults` is the config a user gets when the
    option is left out (its value is printed in the help; None for a parser that only parses, parse_once),
    `notes` replace a field's default text, and a
    field the --config `file` sets shows the file's value."""
    parser.add_argument("--preset", choices=[*extra_presets, *sorted(PRESETS)],
                        help=preset_help or f"Named starting config that the other options change (configs/"
                                            f"presets.py). Default: the --config file's preset, else "
                                            f"{default_preset}")
    parser.add_argument("--config", metavar="FILE",
                        help="JSON or YAML file of config fields, nested as a run's config.json or flat {field: "
                             "value}; applied over the preset, under the options given here (a saved config.json "
                             "reproduces its run). Default: none")
    parser.set_defaults(cfg_file=file)  # read once, by start_in: start_from_args takes it from here
    notes = notes or {}
    given = file.values if file else {}
    for section, cls, f in _all_fields():
        typ, metavar = _field_type(cls, f)
        if f.name in given:
            default = f"{shown_value(given[f.name])} (from {file.path.name})"
        else:
            default = notes.get(f.name, shown_value(getattr(getattr(defaults, section), f.name)) if defaults else "")
        given_once = {"action": once(GIVEN_ONCE[f.name])} if f.name in GIVEN_ONCE else {}
        parser.add_argument(f"--{f.name}", dest=f"cfg__{f.name}", type=typ, metavar=metavar,
                            default=argparse.SUPPRESS, help=field_help(section, f.name, default), **given_once)


def help_defaults(preset: RunConfig, file: ConfigFile | None) -> RunConfig:
    """The preset with the file's values, for --help; the preset alone when they only validate together
    with options still to come (e.g. source: files in the file, --paths on the command line)."""
    try:
        return apply_overrides(preset, file.values) if file else preset
    except ConfigError:
        return preset


def overrides_from_args(args: argparse.Namespace) -> dict[str, object]:
    """The config fields given on the command line."""
    return {k[len("cfg__"):]: v for k, v in vars(args).items() if k.startswith("cfg__")}


def start_from_args(args: argparse.Namespace, default_preset: str) -> tuple[str, dict[str, object]]:
    """(preset, {field: value}): the preset start_in chooses, and the --config file's values with the
    command line's options over them."""
    file = getattr(args, "cfg_file", None)  # already read where the parser was built with it
    if file is None and getattr(args, "config", None):
        file = read_config_file(args.config)
    return _chosen_preset(args.preset, file, default_preset), {**(file.values if file else {}),
                                                                **overrides_from_args(args)}


def apply_overrides(cfg: RunConfig, overrides: dict[str, object]) -> RunConfig:
    """Return a new, validated RunConfig with `overrides` ({field: value}) applied."""
    where = {f.name: section for section, _, f in _all_fields()}
    parts = {s: dataclasses.asdict(getattr(cfg, s)) for s in SECTIONS}
    for name, value in overrides.items():
        if name not in where:
            raise ConfigError(f"unknown config field {name!r}")
        parts[where[name]][name] = value
    return RunConfig(**{s: cls(**parts[s]) for s, cls in SECTIONS.items()}, preset=cfg.preset)


def config_from_args(args: argparse.Namespace, default_preset: str = "tiny") -> RunConfig:
    preset, values = start_from_args(args, default_preset)
    return apply_overrides(get_preset(preset), values)
