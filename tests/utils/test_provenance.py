"""Provenance: the commit of the code's own qk-keys checkout (never the working folder's repository), the installed
version beside it, and how reports print them when there is no commit."""
from __future__ import annotations

import os
import shutil
import subprocess
from importlib import metadata

import pytest
import torch

import utils.runtime as runtime
from research.plots.common import fmt_code
from research.results.checks import ShapeError, check_provenance

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

# The commit of make_repo's one commit (fixed contents, names and dates): `git rev-parse HEAD` of it, once.
CHECKOUT_COMMIT = "5cb34d98b92be5420a3543724433cd223e78528e"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000",
           "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000", "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_CONFIG_NOSYSTEM": "1"}


def make_repo(folder, name: str = "qk-keys"):
    """A git repository in `folder` with one commit of a pyproject.toml naming `name` and utils/__init__.py."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, **GIT_ENV}
    (folder / "utils").mkdir(parents=True)
    (folder / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0.1.0"\n')
    (folder / "utils" / "__init__.py").write_text("x = 1\n")
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", "commit",
                                                "-q", "-m", "first"]):
        subprocess.run(["git", *cmd], cwd=folder, env=env, check=True, capture_output=True)
    return folder


@needs_git
def test_the_commit_is_the_checkouts_own_whatever_the_working_folder(tmp_path, monkeypatch):
    checkout = make_repo(tmp_path / "qk-keys")
    assert runtime.git_commit(checkout) == CHECKOUT_COMMIT
    user_repo = make_repo(tmp_path / "mine", name="my-project")  # the user's own repository, another commit
    monkeypatch.chdir(user_repo)
    monkeypatch.setenv("GIT_DIR", str(user_repo / ".git"))  # as inside one of the user's git hooks
    monkeypatch.setattr(runtime, "PACKAGE_ROOT", checkout)
    assert runtime.git_commit() == CHECKOUT_COMMIT
    (checkout / "utils" / "__init__.py").write_text("x = 2\n")
    assert runtime.git_commit() == CHECKOUT_COMMIT + "-dirty"


@needs_git
def test_no_commit_unless_the_folder_is_the_top_level_of_a_qk_keys_checkout(tmp_path, monkeypatch):
    user_repo = make_repo(tmp_path / "mine", name="my-project")
    assert runtime.git_commit(user_repo) is None  # another project's repository
    copy = user_repo / ".venv" / "src" / "qk-keys"  # a copy of the code inside the user's repository
    copy.mkdir(parents=True)
    (copy / "pyproject.toml").write_text('[project]\nname = "qk-keys"\n')
    assert runtime.git_commit(copy) is None  # git would answer with the user's commit
    checkout = make_repo(tmp_path / "qk-keys")
    assert runtime.git_commit(checkout / "utils") is None  # not the top level
    empty = tmp_path / "new"
    empty.mkdir()
    (empty / "pyproject.toml").write_text('[project]\nname = "qk-keys"\n')
    subprocess.run(["git", "init", "-q"], cwd=empty, check=True)
    assert runtime.git_commit(empty) is None  # a repository without a commit
    monkeypatch.setattr(runtime, "PACKAGE_ROOT", copy)
    assert runtime.git_commit() is None


def test_provenance_records_the_installed_version(monkeypatch):
    try:
        installed = metadata.version("qk-keys")
    except metadata.PackageNotFoundError:
        pytest.skip("qk-keys is not installed (pip install -e .)")
    text = (runtime.PACKAGE_ROOT / "pyproject.toml").read_text()
    assert f'version = "{installed}"' in text  # the checkout's own version
    assert runtime.package_version() == installed
    prov = runtime.provenance(torch.device("cpu"))
    assert prov["qk_keys"] == installed and "git_commit" in prov

    def missing(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "version", missing)
    assert runtime.package_version() is None


def test_reports_say_which_code_made_a_result():
    assert fmt_code({"git_commit": "0123456789abcdef0123456789abcdef01234567", "qk_keys": "0.1.0"}) == "git 0123456789"
    assert fmt_code({"git_commit": "0123456789abcdef0123456789abcdef01234567-dirty"}) == "git 0123456789-dirty"
    assert fmt_code({"git_commit": "abc1234"}) == "git abc1234"  # short, hand-written
    assert fmt_code({"git_commit": None, "qk_keys": "0.1.0"}) == "no git commit (qk-keys 0.1.0)"
    assert fmt_code({"git_commit": None, "qk_keys": None}) == "no git commit (qk-keys not installed)"
    assert fmt_code({"git_commit": None}) == fmt_code({}) == fmt_code(None) == "git commit not recorded"  # older


def test_results_validation_takes_the_version_and_files_without_it():
    for prov in (None, {}, {"git_commit": "abc1234"}, {"git_commit": None, "qk_keys": "0.1.0"},
                 {"git_commit": "abc", "qk_keys": None, "torch": "2.5"}):
        check_provenance(prov)
    with pytest.raises(ShapeError, match=r"provenance.qk_keys should be text or null, found 1"):
        check_provenance({"qk_keys": 1})
    with pytest.raises(ShapeError, match=r"provenance.git_commit should be text or null, found a list"):
        check_provenance({"git_commit": ["a"]})
    with pytest.raises(ShapeError, match=r"provenance should be an object, found list"):
        check_provenance([])


def test_a_report_prints_the_version_where_there_is_no_commit():
    from research.analysis.pretrained import analyze_file
    from research.plots.pretrained_report import report
    res = {"command": "qk-pretrained-keys", "provenance": {"git_commit": None, "qk_keys": "0.1.0", "cpu": "x"},
           "wall_s": 1.0, "models": {}}
    assert "`qk-pretrained-keys`; no git commit (qk-keys 0.1.0), x," in report(analyze_file(res))


def test_provenance_records_the_host_kind_once_defined(monkeypatch):
    """The host kind (utils.hosts): the CPU model and its native bf16 path, as this_host_kind gives it before a run."""
    prov = runtime.provenance(torch.device("cpu"))
    assert prov["cpu_bf16"] in ("AMX", "AVX512-BF16", "none")
    assert prov["cpu_native_bf16"] == (prov["cpu_bf16"] != "none")
    text = {"none": "no native bf16"}.get(prov["cpu_bf16"], prov["cpu_bf16"])
    assert prov["host_kind"] == f"{prov['cpu']} ({text})" == runtime.this_host_kind(torch.device("cpu"))
    runtime.cpu_bf16_path.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    try:
        assert runtime.cpu_bf16_path() == "AMX" and runtime.this_host_kind(torch.device("cpu")).endswith(" (AMX)")
    finally:
        runtime.cpu_bf16_path.cache_clear()


@pytest.mark.parametrize("cpu", ["", "Test CPU 9000"])
def test_this_host_kind_is_what_the_provenance_records(monkeypatch, cpu):
    """One source (runtime.host_fields): where the CPU is not named, the provenance records no host kind, and the
    host check's own kind is none either (not the text 'None', which no run records)."""
    monkeypatch.setattr(runtime, "cpu_name", lambda: cpu)
    prov = runtime.provenance(torch.device("cpu"))
    assert runtime.this_host_kind(torch.device("cpu")) == prov["host_kind"] == runtime.host_fields(
        torch.device("cpu"))["host_kind"]
    assert (prov["host_kind"] is None) == (cpu == "")
