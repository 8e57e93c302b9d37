"""What the main study loads when it starts: the import closure of research/qk_norm_25m_study.py, held at or under
MAX_SHARE of the project's source lines (docs/layout.md, beside the floors of imports).

The closure is read statically: every `import` and `from ... import` a module runs when it is imported (at module
level, in a class body, under `if` or `try`), not those inside a function or under `if TYPE_CHECKING:`, resolved to
this project's files only (the files tests/test_import_rules.py reads: its packages but tests/, and its top-level
modules). Importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` first, and they count too. A kind's analysis
and plots, model access and the like are imported where they are used; what the entry point pulls in at start
stays well short of everything. On failure the message names the largest modules in the closure, each with the
chain of imports that pulls it in.

    python -m tests.test_import_closure      # the closure's share, and its largest modules
"""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

from tests.test_import_rules import ROOT, _imported, module_file, project_files, write_tree

ENTRY = "research/qk_norm_25m_study.py"
MAX_SHARE = 0.60  # of the project's source lines; 78% before the kinds loaded their analysis and plots on demand
SHOWN = 12  # the largest modules a failure names


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def run_at_import(tree: ast.AST):
    """The import statements a module runs when it is imported: none inside a function or a TYPE_CHECKING block."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        elif isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                yield from run_at_import(ast.Module(body=[child], type_ignores=[]))
        else:
            yield from run_at_import(node)


def with_packages(module: str, root: Path) -> list[str]:
    """The project files importing `module` runs: each package's __init__.py above it, then its own file."""
    parts = module.split(".")
    files = (module_file(".".join(parts[:i]), root) for i in range(1, len(parts) + 1))
    return [f for f in files if f is not None]


def start_imports(root: Path) -> dict[str, dict[str, int]]:
    """{file: {project file it runs at import: the line of the import}} for every project file."""
    graph: dict[str, dict[str, int]] = {}
    for path in project_files(root):
        rel = path.relative_to(root).as_posix()
        edges = graph.setdefault(rel, {})
        for node in run_at_import(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
            for module in _imported(node, path, root):
                for target in with_packages(module, root):
                    if target != rel:
                        edges.setdefault(target, node.lineno)
    return graph


@dataclass(frozen=True)
class Closure:
    entry: str
    lines: dict[str, int]  # every project file -> its lines
    via: dict[str, tuple[str, int]]  # a file of the closure -> (the file that first imports it, the line)

    @property
    def files(self) -> list[str]:
        return [self.entry, *self.via]

    @property
    def share(self) -> float:
        return sum(self.lines[f] for f in self.files) / sum(self.lines.values())

    def chain(self, file: str) -> str:
        """How the entry point comes to import `file`: "entry:14 -> a.py:3 -> file"."""
        steps = [file]
        while steps[-1] in self.via:
            steps.append(self.via[steps[-1]][0])
        steps.reverse()
        return " -> ".join(f"{a}:{self.via[b][1]}" for a, b in zip(steps, steps[1:])) + f" -> {file}"

    def largest(self, n: int = SHOWN) -> list[str]:
        return [f"{self.lines[f]:5d} {f}  ({self.chain(f)})"
                for f in sorted(self.via, key=lambda f: (-self.lines[f], f))[:n]]

    def summary(self) -> str:
        total = sum(self.lines.values())
        held = sum(self.lines[f] for f in self.files)
        return (f"{self.entry} imports at start {len(self.files)} of {len(self.lines)} files, {held} of {total} "
                f"source lines ({self.share:.1%}); the largest, with the imports that pull each in:\n"
                + "\n".join(self.largest()))


def closure(entry: str, root: Path) -> Closure:
    """The files `entry` runs at import (breadth first: each reached by a shortest chain of imports)."""
    graph = start_imports(root)
    lines = {f: len((root / f).read_text(encoding="utf-8").splitlines()) for f in graph}
    via: dict[str, tuple[str, int]] = {}
    queue = [entry]
    while queue:
        here = queue.pop(0)
        for target, line in graph[here].items():
            if target != entry and target not in via:
                via[target] = (here, line)
                queue.append(target)
    return Closure(entry, lines, via)


def over(c: Closure, limit: float) -> str:
    """What a closure over `limit` of the source lines pulls in, in words; "" for one within it."""
    return "" if c.share <= limit else f"over {limit:.0%} of the source lines: {c.summary()}"


@functools.cache
def main_study() -> Closure:
    return closure(ENTRY, ROOT)


def test_the_main_study_imports_at_most_its_share_at_start():
    assert not (problem := over(main_study(), MAX_SHARE)), problem


def test_the_closure_counts_what_runs_at_import_and_names_the_chain(tmp_path):
    """A package's __init__.py counts when its submodule is imported; imports in a function or under TYPE_CHECKING
    do not, those in a class body, a try or an if do; the message names the chain to each large module."""
    write_tree(tmp_path, {
        "app.py": "import os\nfrom pkg.sub import f\n\n\ndef g():\n    import heavy\n",
        "pkg/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import heavy\nelse:\n"
                           "    from . import light\n",
        "pkg/sub.py": "try:\n    from pkg import big\nexcept ImportError:\n    pass\n",
        "pkg/light.py": "x = 1\n",
        "pkg/big.py": "class A:\n    import other\n" + "y = 2\n" * 20,
        "other/__init__.py": "", "other/x.py": "",
        "heavy/__init__.py": "z = 3\n" * 50,
    })
    c = closure("app.py", tmp_path)
    assert c.files == ["app.py", "pkg/__init__.py", "pkg/sub.py", "pkg/light.py", "pkg/big.py", "other/__init__.py"]
    assert c.chain("pkg/big.py") == "app.py:2 -> pkg/sub.py:2 -> pkg/big.py"
    assert c.chain("pkg/light.py") == "app.py:2 -> pkg/__init__.py:5 -> pkg/light.py"
    total = sum(c.lines.values())
    assert total == 6 + 5 + 4 + 1 + 22 + 50 and c.share == (6 + 5 + 4 + 1 + 22) / total
    assert c.largest(1) == ["   22 pkg/big.py  (app.py:2 -> pkg/sub.py:2 -> pkg/big.py)"]
    assert closure("pkg/light.py", tmp_path).share == 1 / total  # a module alone: its own lines
    problem = over(c, 0.4)
    assert problem.startswith("over 40% of the source lines: app.py imports at start 6 of 8 files, 38 of 88 source "
                              "lines (43.2%); the largest, with the imports that pull each in:\n")
    assert "   22 pkg/big.py  (app.py:2 -> pkg/sub.py:2 -> pkg/big.py)" in problem.splitlines()
    assert over(c, 0.5) == ""


if __name__ == "__main__":
    print(main_study().summary())
