"""The registry of study kinds: a kind added in one place is read, decided, drawn and written by split_panels."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from research import split_panels
from research.plots.common import message_figure
from research.studies import STUDIES, kinds
from research.studies.kinds import KINDS, Kind


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
           outputs=lambda conditions: ["toy.png", "report.md", "toy_combined.json"],
           combined=lambda analysis: {"toy_combined.json": {"total": analysis.total}}, found_by="toy.json",
           compare=kinds.nothing_to_pair)  # one file, no runs to pair


@pytest.fixture
def toy_kind(monkeypatch):
    monkeypatch.setitem(KINDS, "toy", TOY)
    return TOY


def test_a_kind_registered_once_is_redrawn_by_split_panels(toy_kind, tmp_path, capsys):
    folder = tmp_path / "toy_study"
    folder.mkdir()
    (folder / "toy.json").write_text(json.dumps({"values": [1.5, 2.0, 0.5]}))
    split_panels.main([str(folder), "--margin", "0.1"])
    written = capsys.readouterr().out.split()
    assert [Path(w).name for w in written if w != "wrote"] == toy_kind.outputs([])
    assert (folder / "report.md").read_text() == "# Toy\n\ntotal 4 at margin 0.1\n"
    assert json.loads((folder / "toy_combined.json").read_text()) == {"total": 4.0}
    assert (folder / "toy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
