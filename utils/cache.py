"""Where the caches live: one folder per user, shared by every run from every working folder.

    $QK_KEYS_CACHE              when set
    $XDG_CACHE_HOME/qk-keys     when set (an absolute path, as the XDG spec asks)
    ~/.cache/qk-keys            Linux and other Unix
    ~/Library/Caches/qk-keys    macOS
    %LOCALAPPDATA%\\qk-keys      Windows

A cache setting of "auto" (the default of --cache_dir) names that place; any other value is a folder, for one run.
What lies under it (data/, models/, runs/, cores/), and why a run may move it: docs/data.md, "The cache".
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

AUTO = "auto"  # --cache_dir's default: the user cache
KINDS = ("data", "models")


def user_cache_root() -> Path:
    """The user's qk-keys cache folder (see the module docstring); read from the environment at each call."""
    own = os.environ.get("QK_KEYS_CACHE")
    if own:
        return Path(own).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # a relative XDG_CACHE_HOME is to be ignored (XDG Base Directory spec)
        return Path(xdg) / "qk-keys"
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        return (Path(local) if local else Path.home() / "AppData" / "Local") / "qk-keys"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "qk-keys"
    return Path.home() / ".cache" / "qk-keys"


def cache_dir(setting: str | Path | None, kind: str) -> Path:
    """The folder a cache setting names: "auto" (or None) the user cache's `kind` folder (data or models),
    anything else that folder itself."""
    if kind not in KINDS:
        raise ValueError(f"cache kind {kind!r}: one of {', '.join(KINDS)}")
    if setting is None or str(setting) == AUTO:
        return user_cache_root() / kind
    return Path(setting).expanduser()
