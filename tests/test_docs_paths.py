"""Every path the README and docs/ name exists in the clone, and every file docs/layout.md's table of folders and its
paragraph per folder name lies in that folder: a doc that names a moved or deleted file fails here, not in a reader's
hands."""
from __future__ import annotations

import re

from tests.helpers import REPO

TOPS = ("research/", "models/", "configs/", "data/", "training/", "optimizers/", "utils/", "tests/", "docs/", ".ci/")
GENERATED = ("research_results/",)  # what the commands write: named in the docs, not kept in the clone


def named_paths(text: str) -> set[str]:
    """Repository paths a Markdown text names: in `code` or as a link target, from a top-level folder of the project;
    'path:NAME' and 'path#anchor' name the path; placeholders (<x>, *, {x}) are not paths."""
    found = re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)\s]+)\)", text)
    out = set()
    for item in found:
        path = re.split(r"[#:]", item, maxsplit=1)[0].rstrip(".,;")
        if path.startswith(TOPS) and not re.search(r"[<>*{}]", path):
            out.add(path)
    return out


def table_files(text: str) -> dict[str, set[str]]:
    """{folder: the file names (in `code`, without a slash) that its row of the '| `folder/` | what |' table and its
    paragraph under a '### `folder/`' heading name}; the paragraph ends at the first blank line."""
    rows: dict[str, set[str]] = {}
    rows_and_paragraphs = re.findall(r"^\| `([\w./*-]+/)` \| (.*) \|$", text, re.M) + \
        re.findall(r"^### `([\w./*-]+/)`\n\n(.+?)(?:\n\n|\Z)", text, re.M | re.S)
    for folder, what in rows_and_paragraphs:
        rows.setdefault(folder, set()).update(re.findall(r"`([\w.-]+\.py)`", what))
    return rows


def test_the_helpers_read_paths_and_rows_by_hand():
    text = "see `research/plots/page.py:page`, [x](docs/decisions.md#margins), `research_results/x`, `<run>/a.py`\n" \
           "| `utils/` | `io.py` (writes), `console.py` |\n| `data/` | blocks |\n\n" \
           "### `utils/`\n\n`lock.py` (locks),\n`hosts.py`.\n\nAfter the paragraph: `later.py`.\n\n" \
           "### `models/`\n\n`llm.py`"
    assert named_paths(text) == {"research/plots/page.py", "docs/decisions.md", "utils/", "data/", "models/"}
    assert table_files(text) == {"utils/": {"io.py", "console.py", "lock.py", "hosts.py"}, "data/": set(),
                                 "models/": {"llm.py"}}


def test_every_path_the_docs_name_exists():
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    missing = {str(doc.relative_to(REPO)): sorted(p for p in named_paths(doc.read_text())
                                                   if not (REPO / p).exists() and not (doc.parent / p).exists())
               for doc in docs}
    assert {doc: paths for doc, paths in missing.items() if paths} == {}


def test_every_file_the_layout_table_names_is_in_its_folder():
    rows = table_files((REPO / "docs" / "layout.md").read_text())
    assert rows, "docs/layout.md has no table of folders"
    missing = {folder: sorted(name for name in names if not any((REPO / folder).rglob(name)))
               for folder, names in rows.items() if "*" not in folder}
    assert {folder: names for folder, names in missing.items() if names} == {}
