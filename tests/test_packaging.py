"""pyproject.toml's dependency bounds and requirements.txt's exact pins say the same thing."""
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_every_dependency_is_pinned_within_its_bounds():
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    required = [Requirement(r) for r in project["dependencies"] + extras["tensorboard"] + extras["test"]]
    assert {canonicalize_name(r.name) for r in required} == set(pins)  # nothing pinned that is not needed
    for r in required:
        assert r.specifier.contains(pins[canonicalize_name(r.name)]), (r, pins[canonicalize_name(r.name)])
    assert "torch" not in {canonicalize_name(Requirement(r).name) for r in project["dependencies"]
                           if "==" in r}  # only requirements.txt pins torch
