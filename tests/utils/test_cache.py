"""utils.cache: one user cache for every working folder, moved by QK_KEYS_CACHE or XDG_CACHE_HOME."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from configs import DataConfig
from utils.cache import cache_dir, user_cache_root


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No cache variable set, HOME (and LOCALAPPDATA) in tmp_path; returns monkeypatch."""
    for name in ("QK_KEYS_CACHE", "XDG_CACHE_HOME", "LOCALAPPDATA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("USERPROFILE", str(tmp_path / "home"))  # Path.home() on Windows
    return monkeypatch


def test_the_user_cache_per_platform(env, tmp_path):
    home = tmp_path / "home"
    env.setattr(sys, "platform", "linux")
    assert user_cache_root() == home / ".cache" / "qk-keys"
    env.setattr(sys, "platform", "darwin")
    assert user_cache_root() == home / "Library" / "Caches" / "qk-keys"
    env.setattr(sys, "platform", "win32")
    assert user_cache_root() == home / "AppData" / "Local" / "qk-keys"
    env.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert user_cache_root() == tmp_path / "local" / "qk-keys"


def test_the_environment_moves_it(env, tmp_path):
    env.setattr(sys, "platform", "linux")
    env.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the XDG spec asks
    assert user_cache_root() == tmp_path / "home" / ".cache" / "qk-keys"
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_root() == tmp_path / "xdg" / "qk-keys"
    env.setenv("QK_KEYS_CACHE", str(tmp_path / "mine"))
    assert user_cache_root() == tmp_path / "mine"
    env.setenv("QK_KEYS_CACHE", "~/qk")
    assert user_cache_root() == tmp_path / "home" / "qk"
    env.setenv("QK_KEYS_CACHE", "")  # empty reads as unset
    assert user_cache_root() == tmp_path / "xdg" / "qk-keys"


def test_auto_names_the_user_cache_and_a_folder_names_itself(env, tmp_path):
    env.setenv("QK_KEYS_CACHE", str(tmp_path / "c"))
    assert DataConfig().cache_dir == "auto"
    assert cache_dir("auto", "data") == cache_dir(None, "data") == tmp_path / "c" / "data"
    assert cache_dir("auto", "models") == tmp_path / "c" / "models"
    assert cache_dir(".cache/data", "data") == Path(".cache/data")  # an old config.json's: the working folder's
    assert cache_dir("~/x", "models") == tmp_path / "home" / "x"
    with pytest.raises(ValueError, match="cache kind 'blocks'"):
        cache_dir("auto", "blocks")


def test_the_tests_never_use_the_real_user_cache(user_cache):
    assert os.environ["QK_KEYS_CACHE"] == str(user_cache)  # tests/conftest.py, inherited by every subprocess
    assert user_cache_root() == user_cache
