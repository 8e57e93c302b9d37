"""Config files: `--config FILE`, JSON or YAML, holding the fields of a run's config.json.

Two layouts are read. Nested, as `RunConfig.to_dict()` writes config.json:

    {"preset": "tiny", "model": {"n_layers": 8}, "train": {"tokens": 200000}, "data": {...}, "probe": {...}}

or flat, one mapping of field names (they are unique across sections):

    preset: tiny
    n_layers: 8
    qk_norm: frozen

Every key is checked against the config's fields (an unknown key is named, with its section) and
every value against the field's type, so a typo never silently falls back to a default. The file
gives a preset (optional) and values; `configs.cli` applies them: the preset (--preset, else the
file's, else the script's default), then the file's values, then the command-line options.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from pathlib import Path

from configs.config import LEGACY_TRAIN_FIELDS, ConfigError, DataConfig, ModelConfig, ProbeConfig, TrainConfig
from configs.presets import PRESETS

SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "probe": ProbeConfig}
YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class ConfigFile:
    path: Path
    preset: str | None  # the file's preset, if it names one
    values: dict[str, object]  # {field name: value}, typed as the config's fields


def _hints() -> dict[str, tuple[str, object]]:
    """{field name: (section, type hint)} of every config field."""
    return {f.name: (section, typing.get_type_hints(cls)[f.name])
            for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


def _parse(path: Path, text: str) -> object:
    if path.suffix.lower() in YAML_SUFFIXES:
        try:
            import yaml
        except ImportError:
            raise ConfigError(f"{path}: reading YAML needs PyYAML (pip install -r requirements.txt, or "
                              f"pip install pyyaml); a JSON file works without it") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        hint = "" if path.suffix.lower() == ".json" else " (YAML files must end in .yaml or .yml)"
        raise ConfigError(f"{path}: not valid JSON ({e}){hint}") from None


BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def split_list(text: str) -> list[str]:
    """'a,b,,c' -> ['a', 'b', 'c'] (a list field written as text, in a file or on the command line)."""
    return [p for p in text.split(",") if p]


def _coerce(name: str, hint, value, where: str) -> object:
    """`value` as the field's type; YAML reads 1e-3 as text, so numbers in text are accepted."""
    def bad(kind: str):
        return ConfigError(f"{where}{name}: expected {kind}, found {value!r}")
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


def _section_values(section: str, body, hints: dict, path: Path) -> dict[str, object]:
    if not isinstance(body, dict):
        raise ConfigError(f"{path}: section {section!r} must be a mapping of its fields, found {body!r}")
    out: dict[str, object] = {}
    for key, value in body.items():
        if section == "train" and key in LEGACY_TRAIN_FIELDS:
            for new in LEGACY_TRAIN_FIELDS[key]:
                out.setdefault(new, _coerce(new, float, value, f"{path}: [{section}] "))
            continue
        if key not in hints or hints[key][0] != section:
            home = f" (it belongs to section {hints[key][0]!r})" if key in hints else ""
            raise ConfigError(f"{path}: unknown key {key!r} in section {section!r}{home}; the fields of "
                              f"{section} are: {', '.join(f.name for f in dataclasses.fields(SECTIONS[section]))}")
        out[key] = _coerce(key, hints[key][1], value, f"{path}: [{section}] ")
    return out


def _values(data: dict, path: Path) -> dict[str, object]:
    """Field values of a nested, flat or mixed mapping (the preset key left out)."""
    hints = _hints()
    values: dict[str, object] = {}
    for key, value in data.items():
        if key == "preset":
            continue
        if key in SECTIONS:
            section = _section_values(key, value, hints, path)
        elif key in hints:
            section = {key: _coerce(key, hints[key][1], value, f"{path}: ")}
        else:
            raise ConfigError(f"{path}: unknown key {key!r}: not a config field nor a section "
                              f"({', '.join(SECTIONS)}, preset); see python train_llm.py --help for the fields")
        twice = sorted(set(section) & set(values))
        if twice:
            raise ConfigError(f"{path}: {', '.join(twice)} given twice (at the top level and in a section)")
        values.update(section)
    return values


def read_config_file(path: str | Path) -> ConfigFile:
    """Read and check a config file; ConfigError names the file and the problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config {path}: cannot read it ({e})") from None
    data = _parse(path, text)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config fields (as in a run's config.json), found "
                          f"{type(data).__name__}")
    preset = data.get("preset")
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"{path}: preset {preset!r} is not a named preset: choose one of {', '.join(PRESETS)} "
                          f"(or leave it out and pass --preset)")
    return ConfigFile(path, preset, _values(data, path))
