"""The one error boundary of every entry point (docs/layout.md, "Exit codes"): every script and every module with a
__main__ block runs its main through utils.cli.command and imports utils.cli before anything heavy, so a user error
ends in one line with status 2 and Ctrl-C in one line with status 130, also while torch is still importing; every
error class a user meets is a utils.errors.UserError, so the wrapper knows it."""
from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("research", "training", "utils", "configs", "data", "optimizers", "models")


def _sources() -> list[Path]:
    files = [REPO / "train_llm.py"]
    for package in PACKAGES:
        files += sorted((REPO / package).rglob("*.py"))
    return files


def _entry_points() -> list[Path]:
    return [p for p in _sources() if "__main__" in p.read_text(encoding="utf-8")]


def _is_main_block(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"


def _wrapped(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Name) and target.id == "command":
            return True
    return False


def _project_import(node: ast.stmt) -> str | None:
    """The module a top-level import statement takes from outside the standard library, else None."""
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
        name = node.module
    elif isinstance(node, ast.Import):
        name = node.names[0].name
    else:
        return None
    return None if name.split(".")[0] in sys.stdlib_module_names else name


def test_the_walk_finds_the_known_entry_points():
    names = {p.relative_to(REPO).as_posix() for p in _entry_points()}
    assert {"train_llm.py", "research/finetune_keys_study.py", "research/speed/hf_probe.py",
            "research/speed/probe_share.py", "research/split_panels.py"} <= names and len(names) >= 17


@pytest.mark.parametrize("path", _entry_points(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_entry_point_runs_its_main_through_the_wrapper_and_imports_it_first(path):
    """A new command cannot forget the wrapper: its __main__ block calls only functions wrapped by
    utils.cli.command (directly, or a caller of one), and utils.cli is its first import from outside the standard
    library, so that Ctrl-C during the imports after it ends in one line (utils.cli's hook)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    wrapped = {name for name, fn in functions.items() if _wrapped(fn)}
    # a plain function that calls a wrapped one (train_llm's cli, which turns main's result into a status) counts
    wrapped |= {name for name, fn in functions.items()
                if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in wrapped
                       for c in ast.walk(fn))}
    blocks = [n for n in tree.body if _is_main_block(n)]
    assert len(blocks) == 1, f"{path}: one `if __name__ == '__main__':` block at the top level"
    called = {c.func.id for c in ast.walk(blocks[0]) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    called -= {"SystemExit", "exit"}
    assert called and called <= wrapped, (
        f"{path}: its __main__ block calls {sorted(called)}, not a function wrapped by @command (utils.cli): "
        f"decorate main with @command so a user error ends in one line with status 2 and Ctrl-C with 130")
    first = next(m for m in map(_project_import, tree.body) if m is not None)
    assert first == "utils.cli", (
        f"{path}: its first import from outside the standard library is {first}; import utils.cli first, so that "
        f"Ctrl-C while the libraries import ends in one line")


def test_the_packages_an_entry_module_runs_in_import_nothing():
    """`python -m research.speed.hf_probe` imports research and research.speed first: they stay empty of imports,
    so utils.cli is in force before anything heavy."""
    for path in _entry_points():
        folder = path.parent
        while folder != REPO:
            init = folder / "__init__.py"
            if folder.name == "research" or folder.name == "speed":
                tree = ast.parse(init.read_text(encoding="utf-8"))
                assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], init
            folder = folder.parent


# Error classes that never reach a user: each is caught where it is raised and told as a UserError there.
INTERNAL_ERRORS = {
    "FormatError": "utils/formats.py: each reader turns it into its file's error (ResultsError, CheckpointError, ...)",
    "DuplicateKey": "configs/files.py: the config readers turn it into ConfigError naming the file",
    "UnreadableJSON": "utils/formats.py: a json.JSONDecodeError, which every JSON reader turns into its file's error",
}


def test_every_error_class_a_user_meets_is_a_user_error():
    bases: dict[str, list[str]] = {}
    where: dict[str, str] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                if node.name.endswith(("Error", "Exception", "Interrupted")) or any(
                        n.endswith(("Error", "Exception")) for n in names):
                    bases[node.name] = names
                    where[node.name] = path.relative_to(REPO).as_posix()

    def is_user(name: str, seen=()) -> bool:  # Interrupted: Ctrl-C with what was kept, which the wrapper tells (130)
        return name in ("UserError", "Interrupted") or any(is_user(b, (*seen, name)) for b in bases.get(name, [])
                                                           if b not in seen)

    others = {n: where[n] for n in bases if not is_user(n) and n not in INTERNAL_ERRORS}
    assert not others, (f"error classes that are not utils.errors.UserError: {others}; subclass UserError (the "
                        f"wrapper then tells them in one line, status 2) or name them in INTERNAL_ERRORS with why")
    assert {"InspectError", "ProbeError", "DataError", "ConfigError", "LockError", "StudyError"} <= set(bases)


# ----------------------------------------------------------------------------- behaviour

def _one_line(err: str) -> str:
    assert "Traceback" not in err and err.count("\n") == 1, err[-3000:]
    return err.strip()


def _usage_error(err: str) -> str:
    """argparse's usage error: the usage, then one line 'PROG: error: ...'; no traceback."""
    assert "Traceback" not in err, err[-3000:]
    return err.rstrip("\n").rsplit("\n", 1)[-1]


@pytest.mark.parametrize("args, message", [
    (["--every", "0"], "argument --every: expected a whole number of at least 1, got 0"),
    (["--steps", "0"], "argument --steps: expected a whole number of at least 1, got 0"),
    (["--probes", "-2"], "argument --probes: expected a whole number of at least 1, got -2"),
    (["--batch_size", "2.5"], "argument --batch_size: expected a whole number of at least 1, got '2.5'"),
    (["--seq_len", "0"], "argument --seq_len: expected a whole number of at least 1, got 0"),
])
def test_hf_probe_checks_its_options_when_parsed(args, message, capsys):
    from research.speed import hf_probe

    with pytest.raises(SystemExit) as stop:
        hf_probe.main(args)
    assert stop.value.code == 2 and _usage_error(capsys.readouterr().err).endswith(f": error: {message}")


@pytest.mark.parametrize("module, args, option, found", [
    ("research.benchmark", ["--steps", "0"], "--steps", "0"),
    ("research.benchmark", ["--probe_every", "0"], "--probe_every", "0"),
    ("research.benchmark", ["--probe_memory_layers", "-1"], "--probe_memory_layers", "-1"),
    ("research.speed.measure", ["training", "--steps", "0"], "--steps", "0"),
    ("research.speed.measure", ["probe-memory", "--layers", "0"], "--layers", "0"),
    ("research.speed.probe_share", ["--repeats", "0"], "--repeats", "0"),
    ("research.speed.probe_share", ["--steps", "-5"], "--steps", "-5"),
    ("research.speed.gpu", ["--steps", "0"], "--steps", "0"),
])
def test_the_speed_commands_check_their_counts_when_parsed(module, args, option, found, capsys):
    import importlib

    with pytest.raises(SystemExit) as stop:
        importlib.import_module(module).main(args)
    assert stop.value.code == 2
    last = _usage_error(capsys.readouterr().err)
    assert f"error: argument {option}: expected a whole number of at least " in last and last.endswith(found), last


def test_hf_probe_with_a_missing_model_ends_in_one_line(tmp_path, capsys):
    from research.speed import hf_probe

    with pytest.raises(SystemExit) as stop:
        hf_probe.main(["--model", str(tmp_path / "no_model"), "--steps", "1", "--probes", "1"])
    line = _one_line(capsys.readouterr().err)
    assert stop.value.code == 2 and line.startswith(f"error: model '{tmp_path / 'no_model'}' not found"), line


def test_probe_share_is_wrapped(capsys, monkeypatch):
    """Its main used to run unwrapped: a user error deep in the run printed a traceback."""
    from research.speed import probe_share
    from utils.errors import ConfigError

    def refuse(*a, **k):
        raise ConfigError("--device tpu: choose auto or one of the devices available here: cpu")

    monkeypatch.setattr(probe_share, "study_run_config", refuse)
    with pytest.raises(SystemExit) as stop:
        probe_share.main(["--device", "tpu"])
    assert stop.value.code == 2
    assert _one_line(capsys.readouterr().err) == "error: --device tpu: choose auto or one of the devices available " \
                                                 "here: cpu"


def _run(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX exit statuses")
def test_a_device_that_is_not_here_ends_in_one_line_as_a_program(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: --device cuda is valid")
    proc = _run([str(REPO / "research" / "finetune_keys_study.py"), "--device", "cuda", "--out", str(tmp_path / "o")])
    line = _one_line(proc.stderr)
    assert proc.returncode == 2 and line == "error: --device cuda: choose auto or one of the devices available " \
                                            "here: cpu", proc.stderr
    assert not (tmp_path / "o").exists()
    proc = _run(["-m", "research.speed.hf_probe", "--every", "0"])
    assert proc.returncode == 2 and _usage_error(proc.stderr) == (
        "hf_probe.py: error: argument --every: expected a whole number of at least 1, got 0"), proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
@pytest.mark.parametrize("args", [["train_llm.py", "--help"], ["-m", "research.speed.hf_probe", "--help"]],
                         ids=["script", "module"])
def test_ctrl_c_while_torch_imports_ends_in_one_line_with_130(args):
    """The signal is sent once utils.cli has imported (-X importtime prints each import as it completes), while the
    heavy imports after it still run: exit 130 and one line, no traceback of the import under way."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # SIGINT as a terminal delivers it: a shell's background job (CI) would hand the child SIGINT ignored
    proc = subprocess.Popen([sys.executable, "-X", "importtime", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.rstrip().endswith("| utils.cli"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    proc.wait(timeout=120)
    said = [x for x in (lines + rest.splitlines(keepends=True)) if not x.startswith("import time:")]
    assert proc.returncode == 130, (proc.returncode, said)
    assert said == ["interrupted while starting (nothing was done)\n"]
    assert "Traceback" not in rest
