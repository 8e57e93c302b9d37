"""The registry of study kinds: a kind added in one place (its record in the table of kinds, utils.owners.OWNERS, and
its entry in research.studies.kinds.KINDS) owns its folders, and is read, decided, drawn and written by
split_panels, in its own folder or another."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from research import split_panels
from research.plots.common import message_figure
from research.studies import STUDIES, kinds
from research.studies.kinds import KINDS, Kind
from tests.helpers import stops
from utils.owners import OWNERS, Owner, OwnerError, refuse_foreign, reserved_names


@dataclass(frozen=True)
class ToyAnalysis:
    total: float
    margin: float


def _load(folder: Path, index: dict) -> dict:
    return json.loads((folder / "toy.json").read_text())


def _analyze(inputs: dict, margin: float | None, loss_margin: float | None) -> ToyAnalysis:
    return ToyAnalysis(sum(inputs["values"]), 0.25 if margin is None else margin)


TOY = Kind("toy", _load, _analyze, figures=lambda analysis: {"toy.png": message_figure("toy", f"{analysis.total}")},
           report=lambda analysis: f"# Toy\n\ntotal {analysis.total:g} at margin {analysis.margin:g}\n",
           outputs=lambda conditions: ["toy.png", "report.md", "report.html", "toy_combined.json"],
           combined=lambda analysis: {"toy_combined.json": {"total": analysis.total}},
           compare=kinds.nothing_to_pair,  # one file, no runs to pair
           in_short=lambda analysis: [f"- total: {analysis.total:g}"])
TOY_RECORD = Owner("toy", "the toy study (toy.py)", ("toy.json",), found_by="toy.json")  # recognised by its file


@pytest.fixture
def toy_kind(monkeypatch):
    monkeypatch.setitem(OWNERS, "toy", TOY_RECORD)
    monkeypatch.setitem(KINDS, "toy", TOY)
    return TOY


def toy_report(text: str, short: str) -> str:
    """The toy's report as render writes it: In short first, the opening paragraph under a heading of its own, and the
    figure its report does not place, placed at its end."""
    return f"# Toy\n\n## In short\n\n{short}\n\n## About this study\n\n{text}\n\n## Figures\n\n![toy](toy.png)\n"


def toy_folder(folder: Path, values: list[float]) -> Path:
    folder.mkdir()
    (folder / "toy.json").write_text(json.dumps({"values": values}))
    return folder


def test_a_kind_registered_once_is_redrawn_by_split_panels(toy_kind, tmp_path, capsys):
    folder = toy_folder(tmp_path / "toy_study", [1.5, 2.0, 0.5])
    assert toy_kind.found_by == "toy.json" and toy_kind.owner is TOY_RECORD
    split_panels.main([str(folder), "--margin", "0.1"])
    written = capsys.readouterr().out.split()
    assert [Path(w).name for w in written if w != "wrote"] == toy_kind.outputs([])
    assert (folder / "report.md").read_text() == toy_report("total 4 at margin 0.1", "- total: 4")
    assert '<h2 id="in-short">In short</h2>' in (folder / "report.html").read_text()
    assert json.loads((folder / "toy_combined.json").read_text()) == {"total": 4.0}
    assert (folder / "toy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_kind_registered_once_owns_its_folders_and_is_redrawn_into_another(toy_kind, tmp_path, capsys):
    folder = toy_folder(tmp_path / "toy_study", [1.0, 2.0])
    refuse_foreign(folder, "toy", "toy.py")  # its own
    with pytest.raises(OwnerError) as refused:
        refuse_foreign(folder, "inspect", "inspect_pretrained.py")
    assert str(refused.value) == (f"{folder} belongs to the toy study (toy.py), by its toy.json: inspect_pretrained.py "
                                  f"writes only into a folder of its own (inspect) or a new one, never over another "
                                  f"tool's results and report; pass another --out (nothing was written)")
    assert reserved_names()["toy.json"] is TOY_RECORD  # a study's condition may not be named so
    capsys.readouterr()
    split_panels.main([str(folder), "--out", str(tmp_path / "redraw")])  # a redraw, into a new folder
    assert capsys.readouterr().out == "".join(f"wrote {tmp_path / 'redraw' / name}\n" for name in (
        "redraw.json", "toy.png", "report.md", "report.html", "toy_combined.json"))
    assert json.loads((tmp_path / "redraw" / "redraw.json").read_text()) == {"redraw_of": str(folder.resolve()),
                                                                             "kind": "toy"}
    assert (tmp_path / "redraw" / "report.md").read_text() == toy_report("total 3 at margin 0.25", "- total: 3")
    other = toy_folder(tmp_path / "other", [5.0])  # another toy study is no redraw's to draw into
    err = stops(capsys, split_panels.main, [str(folder), "--out", str(other)])
    assert err == (f"error: {other} belongs to the toy study (toy.py), by its toy.json: the drawing of a toy study "
                   f"(split_panels.py) writes only into a folder of its own (toy, a redraw of {folder.resolve()}) or a "
                   f"new one, never over another tool's results and report; pass another --out (nothing was written)")
    assert [p.name for p in other.iterdir()] == ["toy.json"]  # nothing was written


def test_every_kind_is_found_by_its_study_json_or_its_own_file():
    named = {s.kind for s in STUDIES.values()} | {"finetune", "conditions"}  # the last: study files (research/study.py)
    assert {name for name, kind in KINDS.items() if kind.found_by is None} == named
    assert {kind.found_by for kind in KINDS.values() if kind.found_by} == {"pretrained_keys.json",
                                                                           "checkpoint_keys.json"}
    assert all(kind.name == name for name, kind in KINDS.items())


def test_a_folder_of_no_kind_is_named_as_such(tmp_path):
    from research.results import ResultsError
    with pytest.raises(ResultsError, match="no study found"):
        kinds.read(tmp_path, {})


def test_every_kind_says_its_report_in_short():
    assert all(kind.in_short is not kinds._no_short for kind in KINDS.values()), [
        name for name, kind in KINDS.items() if kind.in_short is kinds._no_short]
