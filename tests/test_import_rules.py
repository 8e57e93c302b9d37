"""The import rules of the project's own code (docs/layout.md, "Imports go one way").

Every .py file outside tests/ is read with ast; every import counts, at module level or inside a function
(a deferred import is still an arrow). A room is a top-level package (utils/, configs/, ...), a package of
research/ (research/access/, ...), the scripts in research/ itself, or train_llm.py. Three rules:

(a) Rooms stand on the floors of FLOORS: a room imports only rooms on lower floors. Rooms on one floor are
    siblings and import each other neither way.
(b) No two folders import each other (checked on the arrows themselves, so also for a room missing from FLOORS).
(c) utils/ is the ground floor: it imports nothing of the project.
(d) No files import each other in a circle, within a room too: the graph of every file's imports of the project's
    own files has no cycle.

The torch-free boundary of research/results, analysis and plots (no torch at run time) is a test of its own:
tests/research/results/test_results.py.
"""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPTS = "research/*.py"  # the entry scripts in research/ (and research/__init__.py, empty)

# Lowest floor first. A room imports only rooms on floors below its own.
FLOORS: tuple[tuple[str, ...], ...] = (
    # 1. the ground floor: atomic files, locks, the cache, OS errors and ConfigError, the device choice
    ("utils",),
    # 2. the configuration dataclasses, presets and the command line
    ("configs",),
    # 3. the parts of a run, each knowing only its config: tokens and batches, the model, the optimizers
    ("data", "models", "optimizers"),
    # 4. the training loop, checkpoints, the run folder
    ("training",),
    # 5. results files without torch: the schema, the file names, the checks
    ("research/results",),
    # 6. two independent rooms over the results and the runs: the decisions (no torch) and model access
    #    (own runs, Hugging Face folders, GGUF files; research/access imports no research room but results)
    ("research/analysis", "research/access"),
    # 7. figures and report text, drawn from the results and the decisions (no torch); the decisions' error rates
    #    measured by simulation (no torch)
    ("research/plots", "research/simulations"),
    # 8. what is done with a loaded model: the key probe, the export to a Hugging Face folder
    ("research/probing", "research/export"),
    # 9. the pretrained-model tour and the key study on text windows (measures with the probe's metrics)
    ("research/inspection",),
    # 10. putting it together: the registry of study kinds, the catalog and runner, the studies of HF models; the
    #     audit of a model's attention against its config (through the adapters' capture)
    ("research/studies", "research/audit"),
    # 11. the speed measurements (a study's runs measured with and without the probe, among others); qk-decide's
    #     readers and command (this project's study folders decided as their studies decide)
    ("research/speed", "research/decide"),
    # 12. the entry points
    (SCRIPTS, "train_llm.py"),
)
FLOOR = {room: level for level, rooms in enumerate(FLOORS, start=1) for room in rooms}


@dataclass(frozen=True)
class Arrow:
    """One import statement of the project's own code that crosses from one room to another."""
    file: str  # the importing file, relative to the repository root
    line: int
    module: str  # the imported module, as written (resolved for relative imports)
    source: str  # the importing room
    target: str  # the imported room

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.module} ({self.source} -> {self.target})"


def project_files(root: Path) -> list[Path]:
    """The project's own .py files: its top-level packages but tests/, and its top-level modules."""
    packages = [d for d in sorted(root.iterdir()) if (d / "__init__.py").is_file() and d.name != "tests"]
    return sorted(root.glob("*.py")) + [p for d in packages for p in sorted(d.rglob("*.py"))]


def room_of(module: str, root: Path) -> str | None:
    """The room of a dotted module name; None for a module not of this project (torch, json, ...)."""
    parts = module.split(".")
    if (root / f"{parts[0]}.py").is_file():
        return f"{parts[0]}.py"
    if not (root / parts[0] / "__init__.py").is_file() or parts[0] == "tests":
        return None
    if parts[0] == "research":
        if len(parts) > 1 and (root / "research" / parts[1]).is_dir():
            return f"research/{parts[1]}"
        return SCRIPTS
    return parts[0]


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imported(node: ast.AST, path: Path, root: Path) -> list[str]:
    """The modules one import statement names; `from package import submodule` names the submodule."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: resolved against the importing file's package
        package = module_name(path, root).split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    names = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        as_path = root.joinpath(*sub.split("."))
        names.append(sub if as_path.with_suffix(".py").is_file() or (as_path / "__init__.py").is_file() else base)
    return list(dict.fromkeys(names))  # `from m import a, b`: one arrow to m


def arrows(root: Path = ROOT) -> list[Arrow]:
    """Every import of the project's own code from one room into another, module level or in a function."""
    found = []
    for path in project_files(root):
        source = room_of(module_name(path, root), root)
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
            for module in _imported(node, path, root):
                target = room_of(module, root)
                if target is not None and target != source:
                    found.append(Arrow(rel, node.lineno, module, source, target))
    return sorted(found, key=lambda a: (a.file, a.line, a.module))


@functools.cache
def project_arrows() -> list[Arrow]:
    return arrows(ROOT)


@functools.cache
def project_file_imports() -> dict[str, dict[str, int]]:
    return file_imports(ROOT)


def floor_breaks(found: list[Arrow]) -> list[str]:
    """Rule (a): each arrow that runs up or sideways, or touches a room FLOORS does not place."""
    problems = []
    for a in found:
        missing = [room for room in (a.source, a.target) if room not in FLOOR]
        if missing:
            problems.append(f"{a}: {' and '.join(missing)} is on no floor; add it to FLOORS in {Path(__file__).name}")
        elif FLOOR[a.target] >= FLOOR[a.source]:
            where = "the same floor" if FLOOR[a.target] == FLOOR[a.source] else f"floor {FLOOR[a.target]}"
            problems.append(f"{a}: {a.source} (floor {FLOOR[a.source]}) may import only rooms below it, and "
                            f"{a.target} is on {where}; move the shared piece down instead")
    return problems


def mutual(found: list[Arrow]) -> list[str]:
    """Rule (b): each pair of rooms that import each other, with one arrow of each direction."""
    first: dict[tuple[str, str], Arrow] = {}
    for a in found:
        first.setdefault((a.source, a.target), a)
    return [f"{x} and {y} import each other: {first[x, y]}; {first[y, x]}"
            for (x, y) in sorted(first) if x < y and (y, x) in first]


def module_file(module: str, root: Path) -> str | None:
    """The project file a dotted module name is (a module, or a package's __init__.py); None for one not of the
    project."""
    path = root.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate.relative_to(root).as_posix()
    return None


def file_imports(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """Every file's imports of the project's own files, module level or in a function: {file: {imported file: the
    line of its first import}}. A file imports the module it names (`from package import name` names the package's
    __init__.py), not the packages above it, which Python runs first whoever imports."""
    files = {p.relative_to(root).as_posix(): p for p in project_files(root)}
    graph: dict[str, dict[str, int]] = {}
    for rel, path in files.items():
        edges = graph.setdefault(rel, {})
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
            for module in _imported(node, path, root):
                target = module_file(module, root)
                if target in files and target != rel:
                    edges.setdefault(target, node.lineno)
    return graph


def file_cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    """Rule (d): each group of files that import each other in a circle (a strongly connected component of the
    import graph, found by Tarjan's algorithm), named by one shortest circle through its first file, each arrow with
    its line: "a.py:3 -> b.py:7 -> a.py"."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # the graph of a few hundred files: recursion stays shallow
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle(graph, group) for group in sorted(groups)]


def _circle(graph: dict[str, dict[str, int]], group: list[str]) -> str:
    """One shortest circle from the group's first file back to it, within the group (breadth first)."""
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w in members and w not in came_from:
                came_from[w] = v
                queue.append(w)
        if start in came_from:
            break
    path = [start]
    while len(path) == 1 or path[-1] != start:
        path.append(came_from[path[-1]])
    path.reverse()  # start, ..., start
    arrows = " -> ".join(f"{a}:{graph[a][b]}" for a, b in zip(path, path[1:]))
    return f"{arrows} -> {start} ({len(group)} files import each other in a circle: {', '.join(group)})"


def ground_breaks(found: list[Arrow]) -> list[str]:
    """Rule (c): each import of utils/ from the rest of the project."""
    return [f"{a}: utils imports nothing of the project" for a in found if a.source == "utils"]


def _report(problems: list[str]) -> str:
    return "\n".join(["", *problems])


def test_rooms_import_only_lower_floors():
    assert not (problems := floor_breaks(project_arrows())), _report(problems)


def test_no_two_folders_import_each_other():
    assert not (problems := mutual(project_arrows())), _report(problems)


def test_utils_imports_nothing_of_the_project():
    assert not (problems := ground_breaks(project_arrows())), _report(problems)


def test_no_files_import_each_other_in_a_circle():
    # Before research/studies/executors.py (issue 51) this failed, naming the one circle of the time (checked on a
    # copy of that tree): "research/studies/ray_executor.py:29 -> research/studies/runner.py:436 ->
    # research/studies/ray_executor.py", runner.py's import of the Ray module inside a function.
    assert not (problems := file_cycles(project_file_imports())), _report(problems)


def test_every_room_is_on_a_floor():
    rooms = {room_of(module_name(p, ROOT), ROOT) for p in project_files(ROOT)}
    assert rooms == set(FLOOR), f"rooms without a floor: {sorted(rooms - set(FLOOR))}; " \
                                f"floors without a room: {sorted(set(FLOOR) - rooms)}"


def write_tree(root: Path, files: dict[str, str]) -> None:
    """A small project under root: {relative path: text}, folders made as needed."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_rules_see_a_bad_import(tmp_path):
    """The checks find what they are for: an arrow up inside a function, a pair importing each other, utils
    importing configs, and a relative import; each message names the file, the line and the module."""
    init = ""
    write_tree(tmp_path, {
        "utils/__init__.py": init, "configs/__init__.py": init, "research/__init__.py": init,
        "research/access/__init__.py": init, "research/probing/__init__.py": init,
        "utils/runtime.py": "import os\nfrom configs.config import ConfigError\n",
        "configs/config.py": "from utils import runtime\n",
        "research/access/adapters.py": "import torch\n\n\ndef f():\n    from research.probing.probe import unwrap\n",
        "research/probing/probe.py": "from ..access import adapters\n",
        "tests/test_x.py": "from research.probing import probe\n",  # tests are not rooms
    })
    found = arrows(tmp_path)
    assert [str(a) for a in found] == [
        "configs/config.py:1 imports utils.runtime (configs -> utils)",
        "research/access/adapters.py:5 imports research.probing.probe (research/access -> research/probing)",
        "research/probing/probe.py:1 imports research.access.adapters (research/probing -> research/access)",
        "utils/runtime.py:2 imports configs.config (utils -> configs)",
    ]
    ups = floor_breaks(found)
    assert len(ups) == 2 and ups[0].startswith("research/access/adapters.py:5 imports research.probing.probe")
    assert ups[1].startswith("utils/runtime.py:2 imports configs.config")
    pairs = mutual(found)
    assert len(pairs) == 2 and pairs[0].startswith("configs and utils import each other: configs/config.py:1")
    assert pairs[1].startswith("research/access and research/probing import each other")
    assert ground_breaks(found) == ["utils/runtime.py:2 imports configs.config (utils -> configs): utils imports "
                                    "nothing of the project"]


def test_the_file_rule_sees_a_circle(tmp_path):
    """Three files in a circle, one arrow inside a function, are named with each import's line; a package's
    __init__.py importing its modules, and a module importing a sibling, are no circle."""
    write_tree(tmp_path, {
        "utils/__init__.py": "", "utils/a.py": "from utils import b\n",
        "utils/b.py": "import os\n\n\ndef f():\n    from utils.c import g\n",
        "utils/c.py": "import json\nfrom utils.a import x\n",
        "research/__init__.py": "", "research/studies/__init__.py": "from research.studies.runner import run\n",
        "research/studies/runner.py": "from . import executors\nimport torch\n",
        "research/studies/executors.py": "from utils.a import x\n",
    })
    graph = file_imports(tmp_path)
    assert graph["utils/b.py"] == {"utils/c.py": 5} and graph["research/studies/runner.py"] == \
        {"research/studies/executors.py": 1}
    assert file_cycles(graph) == ["utils/a.py:1 -> utils/b.py:5 -> utils/c.py:2 -> utils/a.py (3 files import each "
                                  "other in a circle: utils/a.py, utils/b.py, utils/c.py)"]
    assert file_cycles({**graph, "utils/c.py": {}}) == []
