"""Prose a newcomer reads fast: every module of the project opens with a docstring of at most MAX_DOC_LINES lines,
what the module is for and what to read next; the rule explained, the worked example and the history live in docs/.

The files are those tests/test_import_rules.py reads (research, models, configs, data, training, optimizers, utils
and the top-level modules such as train_llm.py); a docstring's lines are counted as written,
ast.get_docstring(tree, clean=False). A module without a docstring passes: the rule is about length.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_import_rules import ROOT, project_files

MAX_DOC_LINES = 10


def doc_lines(path: Path) -> int:
    """Lines of the file's module docstring as written; 0 without one."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
    return len(doc.splitlines()) if doc else 0


def check_docstrings(root: Path) -> None:
    """Fail naming every module under `root` whose docstring is over MAX_DOC_LINES lines, with its line count."""
    over = {p.relative_to(root).as_posix(): n for p in project_files(root) if (n := doc_lines(p)) > MAX_DOC_LINES}
    listed = "\n".join(f"  {n:3d} lines  {path}" for path, n in sorted(over.items()))
    assert not over, (f"{len(over)} module docstring(s) over {MAX_DOC_LINES} lines: keep what the module is for and "
                      f"what to read next, and move the rest into the docs/ page on its topic\n{listed}")


def test_every_module_docstring_is_at_most_ten_lines():
    files = project_files(ROOT)
    assert ROOT / "train_llm.py" in files and len(files) > 100, "the walk found too few files: it is wrong"
    check_docstrings(ROOT)


def test_the_check_fails_on_a_docstring_of_eleven_lines(tmp_path):
    def module(path: Path, lines: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('"""' + "\n".join(f"line {i}" for i in range(1, lines + 1)) + '\n"""\nX = 1\n')

    module(tmp_path / "top.py", 10)
    module(tmp_path / "pkg" / "__init__.py", 1)
    module(tmp_path / "pkg" / "deep" / "mod.py", 10)
    (tmp_path / "pkg" / "bare.py").write_text("X = 1\n")
    assert [doc_lines(tmp_path / "top.py"), doc_lines(tmp_path / "pkg" / "bare.py")] == [10, 0]
    check_docstrings(tmp_path)  # ten lines, one line and none pass

    module(tmp_path / "pkg" / "deep" / "mod.py", 11)
    assert doc_lines(tmp_path / "pkg" / "deep" / "mod.py") == 11
    with pytest.raises(AssertionError, match=r"1 module docstring\(s\) over 10 lines") as failed:
        check_docstrings(tmp_path)
    assert " 11 lines  pkg/deep/mod.py\n" in str(failed.value)  # the offender, with its line count
