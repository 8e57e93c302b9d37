"""The command-line parser every entry point uses.

One spelling per option: words are joined by underscores, as the config fields they set are
(`--n_layers`, `--no_progress`, `--loss_margin`). A hyphenated spelling is refused with the right one
named, and an option is never matched by its prefix (`--out` does not stand for `--output`).
"""
from __future__ import annotations

import argparse
import re


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with the project's habits: no prefix matching, the description printed as
    written (its examples keep their lines), and a hint when an option is spelled with hyphens."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        known = {s for a in self._actions for s in a.option_strings}
        hints = [f"{word} is spelled --{word[2:].replace('-', '_')}"
                 for word in re.findall(r"--[a-z0-9]+(?:-[a-z0-9]+)+", message)
                 if f"--{word[2:].replace('-', '_')}" in known]
        if hints:
            message = f"{message} ({'; '.join(hints)}: options join words with underscores)"
        super().error(message)
