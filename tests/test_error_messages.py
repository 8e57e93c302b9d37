"""Error messages a user reads at a glance: every exception the project raises with a message written in the source
says it in one line of at most MAX_MESSAGE characters of its own text (each {value} counted as one character), the
problem and then the fix; why the rule exists and the longer story of a refusal belong in docs/.

The files are those tests/test_import_rules.py reads. A message built elsewhere (a variable, a call) is not read.
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_rules import ROOT, project_files

MAX_MESSAGE = 200


def literal(node: ast.AST) -> str | None:
    """The text a message expression writes itself, each formatted value as one "~"; None where it is not literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "~" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = literal(node.left), literal(node.right)
        return None if left is None and right is None else (left or "~") + (right or "~")
    return None


def messages(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each `raise X("...")` in the file whose first argument is literal."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            text = literal(node.exc.args[0])
            if text is not None:
                out.append((node.lineno, text))
    return out


def faults(root: Path) -> list[str]:
    """One line per message over MAX_MESSAGE characters or with a newline: its file, line and faults."""
    nl = "\n"
    return [f"  {p.relative_to(root).as_posix()}:{line}: {len(text)} characters{', a newline' * (nl in text)}"
            for p in project_files(root) for line, text in messages(p) if len(text) > MAX_MESSAGE or "\n" in text]


def test_every_error_message_is_one_short_line():
    files = project_files(ROOT)
    assert len(files) > 100 and sum(len(messages(p)) for p in files) > 300, "the walk found too few messages"
    bad = faults(ROOT)
    assert not bad, (f"{len(bad)} error message(s) over {MAX_MESSAGE} characters or over one line: say the problem "
                     f"and the fix in one line, the rest in docs/\n" + "\n".join(bad))


def test_the_check_fails_on_a_long_message_and_a_newline(tmp_path):
    (tmp_path / "train_llm.py").write_text("")
    mod = tmp_path / "utils" / "m.py"
    mod.parent.mkdir()
    (mod.parent / "__init__.py").write_text("")
    mod.write_text('def f(x):\n    raise ValueError(f"{x} " + "a" * 0 + "b" * 1)\n'
                   f'def g(x):\n    raise ValueError(f"{{x}}: " f"{"y" * 198}")\n'
                   'def h():\n    raise ValueError("one\\ntwo")\n'
                   f'def k():\n    raise ValueError("{"z" * 200}")\n')
    bad = faults(tmp_path)
    assert [b.split(":")[1] for b in bad] == ["4", "6"], bad
    assert "201 characters" in bad[0] and "a newline" in bad[1]
