"""A study folder in a notebook: the README's lines, and plotting code that leaves matplotlib's globals alone."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.figure import Figure

from research.plots import qk_norm as qk_plots
from research.results import save_results
from research.results.layout import condition_dir, write_study_index
from tests.helpers import REPO, labelled_lines
from tests.research.synthetic import qk_runs

README_FOLDER = "research_results/qk_norm_50m_study"


def _study_folder(folder, runs) -> None:
    paths = {}
    for cond, seeds in runs.items():
        for seed, res in enumerate(seeds):
            run_dir = condition_dir(folder, cond, seed, several_seeds=True)
            save_results(run_dir / "results.json", res)
            paths.setdefault(cond, []).append(str((run_dir / "results.json").relative_to(folder)))
    write_study_index(folder, name="qk_norm_50m_study", kind="qk_norm", seeds=[0, 1, 2], preset="tiny",
                      conditions=paths, margin=0.03, loss_margin=0.005)


def test_the_readme_notebook_lines_analyze_and_draw_a_study_folder(tmp_path, capsys):
    runs = qk_runs((50, 40, 40), (3.6, 3.6, 3.6))  # A != B ~ C over 3 seeds: the gain drives rank
    _study_folder(tmp_path / "study", runs)
    readme = (REPO / "docs" / "studies.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "load_and_analyze" in b)
    assert README_FOLDER in block
    before = sorted(p.name for p in (tmp_path / "study").rglob("*"))
    namespace: dict = {}
    exec(block.replace(README_FOLDER, str(tmp_path / "study")), namespace)  # noqa: S102 - the README's own lines
    study, fig = namespace["study"], namespace["fig"]
    assert study.kind == "qk_norm" and study.analysis.verdict.key == "gain"
    printed = capsys.readouterr().out
    assert printed.startswith(study.analysis.verdict.text) and study.report in printed
    assert isinstance(fig, Figure) and set(study.figures) == set(qk_plots.FIGURES)
    lines = labelled_lines(fig.axes[0])  # each condition's mean over its seeds
    for cond in ("QK", "QK_frozen", "NoQK"):
        np.testing.assert_allclose(lines[qk_plots.name(cond) + ", n=3"],
                                   np.mean([r["mean_pr"] for r in runs[cond]], axis=0))
    assert sorted(p.name for p in (tmp_path / "study").rglob("*")) == before  # nothing written


@pytest.mark.slow
def test_importing_the_plots_leaves_matplotlib_backend_and_style_alone(tmp_path):
    code = ("import sys, matplotlib; import research.plots.common, research.plots.qk_norm, research.plots.pilot, "
            "research.plots.keys, research.plots.heads, research.plots.inspection, research.studies.render; "
            "from research.analysis import qk_norm as an; from research.plots.common import write_outputs; "
            "from tests.research.synthetic import qk_runs; "
            "runs = qk_runs((50, 40, 40), (3.6, 3.6, 3.6)); "
            f"paths = write_outputs({str(tmp_path)!r}, research.plots.qk_norm.figures(an.analyze(runs))); "
            "print(matplotlib.get_backend(), matplotlib.rcParams['axes.grid'], matplotlib.rcParams['figure.dpi'], "
            "'matplotlib.pyplot' in sys.modules, len(paths))")
    env = {**os.environ, "MPLBACKEND": "svg", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["svg", "False", "100.0", "False", str(len(qk_plots.FIGURES))]
    for name in qk_plots.FIGURES:  # the figures still save as PNG, in the style (dpi 130 of a 9-13 inch figure)
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width = int.from_bytes(data[16:20], "big")
        assert 1000 < width < 2000, (name, width)
