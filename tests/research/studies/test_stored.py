"""Every kind of study folder, stored as its study wrote it, redraws to the same report, combined file and figures.

The archives (tests/research/studies/stored.py) were drawn by the code of their commit; split_panels must draw the
same bytes from them today, through the one registry of study kinds, for every kind it holds; a JSON file's numbers
may differ in their last digits where the Python's pinned scipy computes a t quantile differently (Python 3.10 pins
scipy 1.15: a 95% half-width moved by 2e-11 relative), never more.
"""
from __future__ import annotations

import json
import math

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
        if name.endswith(".json") and got[name] != expected[name]:
            assert same_within(json.loads(got[name]), json.loads(expected[name])), f"{kind}: {name} differs"
        else:
            assert got[name] == expected[name], f"{kind}: {name} differs from the stored one"


def same_within(a, b, rel: float = 1e-9) -> bool:
    """Equal JSON values, floats within `rel` of each other (scipy's quantiles differ by release in the last digits)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_within(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_within(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel) or (math.isnan(a) and math.isnan(b))
    return a == b
