import pytest

from research.plots.common import plt


@pytest.fixture(autouse=True)
def close_figures():
    """Figure builders return open figures; close them after each test."""
    yield
    plt.close("all")
