"""Packaging: pyproject.toml's dependency bounds and requirements.txt's exact pins say the same thing; the console
commands run each script's main from any folder, one holding a user's own utils.py, models.py and data.py
included; every module imports where fcntl and resource are missing (Windows)."""
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import REPO, pyproject

# The console commands and the script whose main(argv=None) each runs.
COMMANDS = {"qk-train": "train_llm", "qk-audit": "research.qk_audit", "qk-decide": "research.qk_decide",
            "qk-norm-study": "research.qk_norm_25m_study",
            "qk-pilot-study": "research.qk_norm_500k_study", "qk-key-dynamics": "research.key_dynamics_study",
            "qk-head-specialization": "research.head_specialization_study",
            "qk-lr-sensitivity": "research.lr_sensitivity_study", "qk-spike-warning": "research.spike_warning_study",
            "qk-pretrained-keys": "research.pretrained_keys_study",
            "qk-checkpoint-keys": "research.checkpoint_keys_study", "qk-finetune-keys": "research.finetune_keys_study",
            "qk-split-panels": "research.split_panels", "qk-inspect": "research.inspect_pretrained",
            "qk-export": "research.export_hf", "qk-benchmark": "research.benchmark", "qk-study": "research.study"}


def _project() -> dict:
    return pyproject()["project"]


# The minor versions of Python the README names (requires-python's lower bound and every one after it tested).
PYTHONS = ("3.10", "3.11", "3.12", "3.13")


def _pins() -> dict[str, list[Requirement]]:
    """requirements.txt's pins by package: one, or one per environment marker (python_version)."""
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            pin = Requirement(line)
            pins.setdefault(canonicalize_name(pin.name), []).append(pin)
    return pins


def test_every_dependency_is_pinned_within_its_bounds():
    pins = _pins()
    project = _project()
    assert project["requires-python"] == f">={PYTHONS[0]}"
    extras = project["optional-dependencies"]
    wanted = project["dependencies"] + extras["tensorboard"] + extras["trackio"] + extras["ray"] + extras["test"]
    required = [Requirement(r) for r in wanted]
    assert {canonicalize_name(r.name) for r in required} == set(pins)  # nothing pinned that is not needed
    for r in required:
        for pin in pins[canonicalize_name(r.name)]:
            (version,) = [s.version for s in pin.specifier]
            assert r.specifier.contains(version), (r, str(pin))
    assert "torch" not in {canonicalize_name(Requirement(r).name) for r in project["dependencies"]
                           if "==" in r}  # only requirements.txt pins torch


def test_every_python_named_gets_exactly_one_pin_of_each_package():
    """numpy 2.3+, scipy 1.16+, matplotlib 3.11+, pyarrow 26+ and transformers 5.21+ need Python 3.11: 3.10 gets
    the last release for it, through a python_version marker."""
    for name, pins in _pins().items():
        for python in PYTHONS:
            chosen = [str(p.specifier) for p in pins
                      if p.marker is None or p.marker.evaluate({"python_version": python})]
            assert len(chosen) == 1, (name, python, chosen)
    assert [str(p) for p in _pins()["numpy"]] == ['numpy==2.4.6; python_version >= "3.11"',
                                                  'numpy==2.2.6; python_version < "3.11"']
    assert f"(Python {PYTHONS[0]} to {PYTHONS[-1]})" in (REPO / "README.md").read_text()  # the first commands'


def test_every_console_command_runs_a_scripts_main():
    scripts = _project()["scripts"]
    assert set(scripts) == set(COMMANDS)
    for name, target in scripts.items():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), name
        main = importlib.import_module(COMMANDS[name]).main
        assert inspect.signature(main).parameters["argv"].default is None, name
        returns = inspect.signature(main).return_annotation
        exit_status = returns in (None, int, "None", "int")  # a console script exits with what main returns
        assert exit_status == (target == f"{COMMANDS[name]}:main"), name  # else through a wrapper (qk-train)


def test_qk_train_exits_0_after_a_run_and_with_mains_status_otherwise(monkeypatch):
    import train_llm
    monkeypatch.setattr(train_llm, "main", lambda: {"steps": 2})  # the summary a run returns
    with pytest.raises(SystemExit) as e:
        train_llm.cli()
    assert e.value.code == 0
    monkeypatch.setattr(train_llm, "main", lambda: sys.exit(2))  # a user error, as utils.cli.command ends it
    with pytest.raises(SystemExit) as e:
        train_llm.cli()
    assert e.value.code == 2


@pytest.fixture
def users_folder(tmp_path):
    """A working folder holding a user's own utils.py, models.py and data.py, each failing if imported."""
    for name in ("utils", "models", "data"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('shadowed: the user\'s own module was imported')\n")
    return tmp_path


def _in(folder, command: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # after the working folder on sys.path; found without an install
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_train_llm_as_a_module_runs_beside_a_users_own_modules(users_folder):
    proc = _in(users_folder, [sys.executable, "-m", "train_llm", "--help"])
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-2000:]


def test_the_installed_command_runs_beside_a_users_own_modules(users_folder):
    command = Path(sys.executable).with_name("qk-train")  # this interpreter's, not the first on PATH
    if not command.is_file():
        pytest.skip("qk-train is not installed beside this Python (pip install -e .)")
    proc = _in(users_folder, [command, "--help"])
    assert proc.returncode == 0 and "usage: qk-train" in proc.stdout, proc.stderr[-2000:]


# Imports every module of the project where fcntl and resource are missing and os has no O_NOFOLLOW, as on
# Windows; msvcrt, which Windows has, is played by POSIX record locks (fcntl.lockf: one process's, like Windows'
# byte-range locks). Then a folder is locked there, and a second such process is refused it, told the holder.
_NO_FCNTL = r"""
import errno, fcntl as real_fcntl, importlib, os, sys, types
from pathlib import Path

def locking(fd, mode, nbytes):
    start = os.lseek(fd, 0, os.SEEK_CUR)  # msvcrt.locking locks from the file's position
    try:
        real_fcntl.lockf(fd, real_fcntl.LOCK_UN if mode == 0 else real_fcntl.LOCK_EX | real_fcntl.LOCK_NB,
                         nbytes, start)
    except OSError:
        raise PermissionError(errno.EACCES, "Permission denied") from None

sys.modules["fcntl"] = None
sys.modules["resource"] = None
del os.O_NOFOLLOW
repo, folder, role = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
sys.modules["msvcrt"] = types.SimpleNamespace(locking=locking, LK_UNLCK=0, LK_NBLCK=2)
from utils.lock import FolderLock, LockError
del sys.modules["msvcrt"]  # for utils.lock alone: subprocess, for one, takes msvcrt for Windows
if role == "second":
    try:
        FolderLock(folder, hint="choose another --out").acquire()
    except LockError as e:
        print(e)
    sys.exit(0)
names = ["train_llm"] + [".".join(p.relative_to(repo).with_suffix("").parts).removesuffix(".__init__")
                         for pkg in ("configs", "models", "optimizers", "data", "training", "utils", "research")
                         for p in sorted((repo / pkg).rglob("*.py"))]
for name in names:
    importlib.import_module(name)
print(len(names), "modules")
link = folder.parent / "linked"
link.mkdir()
(link / "target").write_text("kept")
os.symlink(link / "target", link / ".lock")  # within the folder (utils.io.check_links allows it), not followed
try:
    FolderLock(link).acquire()
except LockError as e:
    print(e)
with FolderLock(folder):
    import subprocess
    print(subprocess.run([sys.executable, __file__, *sys.argv[1:3], "second"], capture_output=True, text=True,
                         check=True).stdout)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="plays Windows on POSIX")
def test_every_module_imports_without_fcntl_and_the_lock_still_locks(tmp_path):
    script = tmp_path / "no_fcntl.py"
    script.write_text(_NO_FCNTL)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(script), str(REPO), str(tmp_path / "run"), "first"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert int(out.split(" modules")[0]) > 100
    assert "its .lock is a link, which this project never writes through" in out
    assert f"{tmp_path / 'run'} is in use by pid " in out and "no_fcntl.py" in out and "choose another --out" in out
    assert (tmp_path / "linked" / "target").read_text() == "kept"  # the link was not followed


def _bad_input(command: str, tmp: Path) -> list[str]:
    """Arguments that each command refuses as a user error (a missing file or folder), past argparse."""
    missing = str(tmp / "missing")
    if command in ("qk-train", "qk-norm-study", "qk-pilot-study", "qk-key-dynamics", "qk-head-specialization",
                   "qk-lr-sensitivity", "qk-spike-warning"):
        return ["--config", f"{missing}.yaml", "--out", str(tmp / "out")]
    if command in ("qk-pretrained-keys", "qk-checkpoint-keys"):
        return ["--render_only", "--out", missing]
    if command in ("qk-finetune-keys", "qk-inspect"):
        return ["--model", missing, "--out", str(tmp / "out")]
    if command == "qk-export":
        return [missing, str(tmp / "out")]
    if command in ("qk-split-panels", "qk-audit", "qk-decide"):
        return [missing]
    if command == "qk-study":
        return [f"{missing}.yaml", "--out", str(tmp / "out")]
    return ["--configs", "missing"]  # qk-benchmark reads no files: an option's bad value (argparse's own error)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_ends_a_user_error_with_one_line_and_status_2(command, tmp_path, capsys, monkeypatch):
    """The one wrapper (utils.cli.command): the console command's own target, as pip's script calls it."""
    module, _, attr = _project()["scripts"][command].partition(":")
    monkeypatch.setattr(sys, "argv", [command, *_bad_input(command, tmp_path)])
    with pytest.raises(SystemExit) as stop:
        sys.exit(getattr(importlib.import_module(module), attr)())
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err[-2000:]
    last = err.rstrip("\n").rsplit("\n", 1)[-1]
    if command == "qk-benchmark":  # argparse's usage error: the usage, then "PROG: error: ..."
        assert last.startswith(f"{command}: error: argument --configs"), err
    else:
        assert last.startswith("error: ") and str(tmp_path / "missing") in last, err


@pytest.mark.slow
def test_a_script_run_as_a_program_exits_2_on_a_user_error_and_130_on_ctrl_c(tmp_path):
    """The exit status the shell sees, from a real process: a user error, then Ctrl-C (a KeyboardInterrupt raised
    where the data would be read)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(REPO / "research" / "split_panels.py"), str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    code = ("import sys, research.split_panels as s; sys.argv = ['split_panels.py', sys.argv[1]]\n"
            "def stop(*a, **k): raise KeyboardInterrupt\n"
            "s.render_study = stop; s.main()")
    (tmp_path / "study.json").write_text("{}")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 130 and proc.stderr == "interrupted\n", proc.stderr
