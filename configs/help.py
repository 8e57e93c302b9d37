"""The help of each config field's option, for `--help` (configs.cli).

An option's help reads "[section] SENTENCE Choices: a, b. Default: X": the sentence and the choices from the field's
declaration (configs/config.py: its help, and the values of its Literal, which its validation checks, so help and
validation cannot disagree) and the default from the config the user gets without the option (the chosen preset,
the --config file, a study's own settings). tests/configs/test_help.py checks that every field has a sentence.
"""
from __future__ import annotations

from configs.config import declared, field_choices


def field_help(section: str, name: str, default: object) -> str:
    """The help of --NAME: "[section] sentence Choices: a, b. Default: X" (choices only where the field has them)."""
    choices = field_choices().get(name)
    listed = f" Choices: {', '.join(choices)}." if choices else ""
    return f"[{section}] {declared()[name][1].metadata['help']}{listed} Default: {default}"
