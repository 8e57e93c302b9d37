"""The size rules of the project's own code: no source file over MAX_FILE_LINES lines, no function over
MAX_FUNCTION_LINES lines (docs/layout.md, "Sizes").

The files are those tests/test_import_rules.py reads: every .py file of the project's packages and top level,
tests/ aside. A function's length runs from its `def` line to its last line (decorators aside), nested functions
and methods counted on their own under their qualified name ("Trainer.__init__", "main.per_head"). A file or
function over a limit fails the suite unless EXCEPTIONS names it with its reason; an exception no longer needed
fails too, so none outlives its reason.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.test_import_rules import ROOT, project_files

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60

# "path" (a file) or "path::qualified.name" (a function) -> why it may be longer, for now
EXCEPTIONS: dict[str, str] = {
}


def function_lengths(tree: ast.AST, prefix: str = "") -> dict[str, int]:
    """Qualified name -> lines, def line to last line, of every function in `tree` (methods and nested ones too)."""
    found = {}
    for node in ast.iter_child_nodes(tree):
        name = f"{prefix}{node.name}" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
            else prefix.rstrip(".")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[name] = node.end_lineno - node.lineno + 1
        found.update(function_lengths(node, f"{name}." if name else ""))
    return found


def oversized(root: Path) -> dict[str, int]:
    """Each file ("path") and function ("path::name") of the project at `root` over its limit -> its lines."""
    over = {}
    for path in project_files(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_FILE_LINES:
            over[rel] = len(text.splitlines())
        for name, n in function_lengths(ast.parse(text, filename=rel)).items():
            if n > MAX_FUNCTION_LINES:
                over[f"{rel}::{name}"] = n
    return over


@functools.cache
def project_oversized() -> dict[str, int]:
    return oversized(ROOT)


def test_no_file_or_function_over_the_limits():
    bad = {k: n for k, n in project_oversized().items() if k not in EXCEPTIONS}
    assert not bad, (f"over the limits ({MAX_FILE_LINES} lines a file, {MAX_FUNCTION_LINES} a function): "
                     + "; ".join(f"{k}: {n} lines" for k, n in sorted(bad.items()))
                     + ". Split by what each part does, or name it in EXCEPTIONS with its reason")


def test_every_exception_is_still_needed():
    over = project_oversized()
    stale = sorted(k for k in EXCEPTIONS if k not in over)
    assert not stale, f"within the limits now, remove from EXCEPTIONS: {', '.join(stale)}"
    assert all(reason.strip() for reason in EXCEPTIONS.values())


def test_the_rule_sees_what_is_too_long(tmp_path):
    """A made-up project: a file of 501 lines and one of 500, a function of 61 lines and one of 60, a method
    and a nested function of 61 each; only those over the limits are found, with their counts."""
    def fn(name: str, lines: int, indent: str = "") -> str:  # a function of `lines` lines, def line included
        return f"{indent}def {name}():\n" + "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * 501)
    (tmp_path / "pkg" / "edge.py").write_text("x = 1\n" * 500)
    (tmp_path / "top.py").write_text("@staticmethod\n" + fn("long", 61) + fn("fits", 60) + "class C:\n"
                                     + fn("m", 61, "    ") + "def outer():\n" + fn("inner", 61, "    ")
                                     + "    return inner\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "test_big.py").write_text("x = 1\n" * 600)  # tests are not held to it
    assert oversized(tmp_path) == {"pkg/big.py": 501, "top.py::long": 61, "top.py::C.m": 61,
                                   "top.py::outer.inner": 61, "top.py::outer": 63}
