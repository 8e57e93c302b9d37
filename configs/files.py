"""Config files: `--config FILE`, JSON or YAML, holding the fields of a run's config.json.

`read_config_file` reads one, nested as `RunConfig.to_dict()` writes config.json or flat (one mapping of field
names), and checks every key against the config's fields and every value against its field's type, so a typo never
falls back to a default; `field_values` does the same for a study file's values. configs.cli applies a file's
preset and values under the command-line options. A run's own config.json is written and read back here too
(`save_run_config`, `load_run_config`, `run_config_from_dict`). Layouts, precedence and messages: docs/training.md,
"Config files".
"""
from __future__ import annotations

import difflib
import json
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs.config import SECTIONS, ConfigError, RunConfig, field_hints
from configs.fields import BOOL_WORDS, coerce_value, split_list
from configs.presets import PRESETS
from utils.errors import PicklesWhole, cut, os_fix, os_problem, shown
from utils.formats import loads_json, unreadable

__all__ = ["BOOL_WORDS", "SECTIONS", "ConfigFile", "read_config_file", "split_list"]
YAML_SUFFIXES = (".yaml", ".yml")
# Fields of older saved configs -> the fields that replaced them (configs written before Muon's weight decay had
# its own field decayed both optimizers by `weight_decay`); read by section_values, for config.json and --config.
LEGACY_TRAIN_FIELDS = {"weight_decay": ("muon_weight_decay", "adamw_weight_decay")}


class DuplicateKey(PicklesWhole, ValueError):
    """A mapping of a config file that names one key twice (JSON and YAML readers would keep the last)."""

    def __init__(self, key, where: str = ""):
        super().__init__(f"key {shown(key)} appears twice in one mapping{where}: a reader would keep only the last, "
                         f"silently. Fix: keep one of them")


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def parse_json(text: str) -> object:
    """JSON text as Python values, refusing an object that names a key twice (DuplicateKey; json.loads keeps the
    last); the one JSON reader of config files (--config, config.json)."""
    return loads_json(text, object_pairs_hook=_unique_pairs)


def section_values(section: str, body, where: str) -> dict[str, object]:
    """The typed values of one section's mapping; ConfigError names the section, the key and the problem, after
    `where` (the file, as "path: ")."""
    if not isinstance(body, dict):
        raise ConfigError(f"{where}section {section!r} must be a mapping of its fields, found {shown(body)}")
    hints = field_hints()
    out: dict[str, object] = {}
    for key, value in body.items():
        if section == "train" and key in LEGACY_TRAIN_FIELDS:  # an old field sets its successors unless given
            for new in LEGACY_TRAIN_FIELDS[key]:
                if new not in body:
                    out[new] = coerce_value(key, float, value, f"{where}[{section}] ")
            continue
        if key not in hints or hints[key][0] != section:
            home = f" (it belongs to section {hints[key][0]!r})" if key in hints else ""
            raise ConfigError(f"{where}unknown key {shown(key)} in section {section!r}{home}; the fields of "
                              f"{section} are: {', '.join(f.name for f in dataclasses.fields(SECTIONS[section]))}")
        out[key] = coerce_value(key, hints[key][1], value, f"{where}[{section}] ")
    return out


@dataclass(frozen=True)
class ConfigFile:
    path: Path
    preset: str | None  # the file's preset, if it names one
    values: dict[str, object]  # {field name: value}, typed as the config's fields


MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *base`: the anchored mapping's keys, under the ones written here


def _yaml_loader(yaml):
    """PyYAML's safe loader (no !!python tags), refusing a mapping that names a key twice (safe_load keeps the last,
    silently). Merge keys (`<<: *base` or `<<: [*a, *b]`) work as in safe_load: the keys a mapping writes itself are
    checked for repeats, and override the merged ones, as YAML means them to. PyYAML's own parser, not LibYAML's
    (CSafeLoader, three times faster): nesting 100,000 lists deep crashes that one (a segmentation fault), where
    this one raises RecursionError, which parse_file words."""
    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:  # not a key of its own: SafeLoader merges it (flatten_mapping)
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise DuplicateKey(key, f" (line {key_node.start_mark.line + 1})")
                    seen.add(key)
                except TypeError:  # an unhashable key: PyYAML's own error names it
                    pass
            return super().construct_mapping(node, deep)
    return UniqueKeyLoader


def parse_file(path: Path, text: str) -> object:
    """The JSON or YAML (by its suffix) in `text` read from `path`; ConfigError names the file and the problem,
    a key given twice included."""
    if path.suffix.lower() in YAML_SUFFIXES:
        try:
            import yaml
        except ImportError:
            raise ConfigError(f"{path}: reading YAML needs PyYAML (pip install -r requirements.txt, or "
                              f"pip install pyyaml); a JSON file works without it") from None
        try:
            return yaml.load(text, Loader=_yaml_loader(yaml))  # noqa: S506 - a SafeLoader subclass
        except DuplicateKey as e:
            raise ConfigError(f"{path}: {e}") from None
        except (yaml.YAMLError, ValueError, RecursionError) as e:  # ValueError: a date 2020-13-45, a number of
            # over 4,300 digits; RecursionError: lists nested deeper than the recursion limit
            raise ConfigError(f"{path}: not valid YAML ({cut(' '.join(unreadable(e).split()), 300)})") from None
    try:
        return parse_json(text)
    except DuplicateKey as e:
        raise ConfigError(f"{path}: {e}") from None
    except json.JSONDecodeError as e:
        hint = "" if path.suffix.lower() == ".json" else " (YAML files must end in .yaml or .yml)"
        raise ConfigError(f"{path}: not valid JSON ({cut(str(e), 300)}){hint}") from None


def field_values(data: dict, where: str | Path, skip: tuple[str, ...] = ("preset",),
                 others: tuple[str, ...] | None = None) -> dict[str, object]:
    """Field values of a nested, flat or mixed mapping (the `skip` keys left out); the type checks are
    section_values's, which run_config_from_dict applies to a saved config.json as well. `where` starts every message
    (the file, and where in it); `others`: the other keys the mapping may hold, as an unknown key's message lists
    them (default: `skip`)."""
    path = where
    hints = field_hints()
    values: dict[str, object] = {}
    for key, value in data.items():
        if key in skip:
            continue
        if key in SECTIONS:
            section = section_values(key, value, f"{path}: ")
        elif key in hints:
            section = {key: coerce_value(key, hints[key][1], value, f"{path}: ")}
        else:
            close = difflib.get_close_matches(str(key), list(hints), n=1)
            raise ConfigError(f"{path}: unknown key {shown(key)}: not a config field nor a section "
                              f"({', '.join((*SECTIONS, *(skip if others is None else others)))})"
                              + (f"; did you mean {close[0]!r}?" if close else "")
                              + "; see python train_llm.py --help for the fields")
        twice = sorted(set(section) & set(values))
        if twice:
            raise ConfigError(f"{path}: {', '.join(twice)} given twice (at the top level and in a section)")
        values.update(section)
    return values


def read_text(path: Path, missing: str, name: str | None = None) -> str:
    """The text of a file a user named; ConfigError `missing` when there is none, and '<name>: cannot read it: why.
    Fix: ...' when it cannot be read (name: the path)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(missing) from None
    except OSError as e:
        raise ConfigError(f"{name or path}: cannot read it: {os_problem(e)}. Fix: {os_fix(e, reading=True)}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name or path}: cannot read it: not UTF-8 text ({e.reason} at byte {e.start}). Fix: save "
                          f"it as UTF-8") from None


def read_config_file(path: str | Path) -> ConfigFile:
    """Read and check a config file; ConfigError names the file and the problem."""
    path = Path(path)
    data = parse_file(path, read_text(path, f"--config {path}: no such file", f"--config {path}"))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config fields (as in a run's config.json), found "
                          f"{type(data).__name__}")
    preset = data.get("preset")
    if preset is not None and not isinstance(preset, str):
        raise ConfigError(f"{path}: preset: expected the name of a preset ({', '.join(PRESETS)}), found "
                          f"{shown(preset)}. Fix: write it as a name (preset: debug), or leave it out and pass "
                          f"--preset")
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"{path}: preset {shown(preset)} is not a named preset: choose one of {', '.join(PRESETS)} "
                          f"(or leave it out and pass --preset)")
    return ConfigFile(path, preset, field_values(data, path))


def run_config_from_dict(d: dict[str, Any], where: str = "") -> RunConfig:
    """The config a RunConfig.to_dict() wrote (config.json, a checkpoint's state.json), every value type-checked as a
    --config file's; ConfigError names the section and field after `where` (e.g. "path: ")."""
    if not isinstance(d, dict) or not {"model", "train", "data"} <= set(d):
        found = f"keys {', '.join(map(str, d))}" if isinstance(d, dict) else type(d).__name__
        raise ConfigError(f"{where}not a run config (found {found or 'nothing'}); expected keys model, train, data")
    unknown = sorted(str(k) for k in set(d) - {*SECTIONS, "preset"})
    if unknown:
        raise ConfigError(f"{where}unknown key(s) {cut(', '.join(map(shown, unknown)))}: a run config holds "
                          f"{', '.join(SECTIONS)} and preset")
    preset = d.get("preset", "custom")
    if not isinstance(preset, str):
        raise ConfigError(f"{where}preset: expected a string, found {shown(preset)}")
    values = {s: section_values(s, d.get(s, {}), where) for s in SECTIONS}
    try:
        return RunConfig(**{s: c(**values[s]) for s, c in SECTIONS.items()}, preset=preset)
    except ConfigError as e:  # a value out of its range: the file is named too
        raise ConfigError(f"{where}{e}") from None


def save_run_config(cfg: RunConfig, path: str | Path) -> None:
    from utils.io import atomic_write_text
    atomic_write_text(path, json.dumps(cfg.to_dict(), indent=2) + "\n")


def load_run_config(path: str | Path) -> RunConfig:
    """A saved config.json; ConfigError names the file, the field and the fix."""
    path = Path(path)
    try:
        return run_config_from_dict(parse_json(path.read_text()), where=f"{path}: ")
    except ConfigError as e:
        raise ConfigError(f"cannot read config {e}; fix or restore {path.name}") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, DuplicateKey) as e:
        raise ConfigError(f"cannot read config {path}: {cut(str(e))}; fix or restore {path.name}") from e
