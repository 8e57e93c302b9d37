"""The one error of a results file that cannot be used, and the one answer to a file written by a newer version:
below research.results.schema (which names them for every reader) so that the declarations of the files the schema
command publishes (research.results.published) can use them without importing the command. No torch.
"""
from __future__ import annotations

from pathlib import Path

from research.results.checks import is_integer
from research.results.vocabulary import SCHEMA_VERSION
from utils.errors import UserError


class ResultsError(UserError, ValueError):
    """A results file that cannot be used; the message names the file, the problem and the fix."""


def check_version(res: dict, path: str | Path, version: int = SCHEMA_VERSION, key: str = "schema_version") -> None:
    """Refuse a file written by a newer version of this project (older versions and none at all are read): the one
    answer for every versioned file (results.json's `schema_version`, the studies' `version`), never "run again",
    which would overwrite it. `key`: the field holding the file's version."""
    found = res.get(key)
    if is_integer(found) and found > version:
        raise ResultsError(f"{path}: {key}: written by a newer version of this project ({key} {found} > {version}, "
                           f"the newest this code reads): update the code (git pull) to read it")
