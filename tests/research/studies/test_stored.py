"""Every kind of study folder, stored as its study wrote it, redraws to the same report, combined file and figures.

The archives (tests/research/studies/stored.py) were drawn by the code of their commit; split_panels must draw the
same bytes from them today, through the one registry of study kinds, for every kind it holds.
"""
from __future__ import annotations

import pytest

from research import split_panels
from research.studies.kinds import KINDS
from tests.research.studies.stored import BUILDERS, drawn, unpack


def test_every_registered_kind_has_a_stored_folder():
    assert set(BUILDERS) == set(KINDS)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_split_panels_draws_what_the_study_drew(kind, tmp_path, capsys):
    folder, expected = unpack(kind, tmp_path / "stored")
    out = tmp_path / "redrawn"
    split_panels.main([str(folder), "--out", str(out)])
    capsys.readouterr()
    got = drawn(out)
    assert sorted(got) == sorted(expected)
    assert got["figures.txt"].decode().split() == expected["figures.txt"].decode().split()
    for name in expected:
        assert got[name] == expected[name], f"{kind}: {name} differs from the stored one"
