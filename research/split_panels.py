"""Redraw every figure and the report of a study folder from its JSON files alone.

    python research/split_panels.py research_results/qk_norm_50m_study
    python research/split_panels.py ../shared/reference/qk_norm_50m_study --out /tmp/writeups

The study is recognised from the files (research/results/layout.py). Every results file is
validated before anything is drawn; nothing is written unless all of them pass, and each
output is replaced atomically. Needs numpy and matplotlib only: torch is never imported.
"""
from __future__ import annotations

import sys

from research.analysis.rules import check_margin
from research.results import ResultsError
from research.studies.render import render_study
from utils.cli import ArgumentParser
from utils.errors import os_fix, os_problem
from utils.lock import LockError


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("folder", nargs="?", default="research_results/qk_norm_50m_study",
                   help="study folder (default research_results/qk_norm_50m_study)")
    p.add_argument("--out", help="write figures and report here instead of into the study folder")
    p.add_argument("--margin", type=float,
                   help="margin of key metrics, a share of the compared values' mean: an interval wholly inside "
                        "+-margin reads 'about equal', wholly beyond it 'different' (docs/decisions.md; default: the "
                        "one the study ran with, else 0.03)")
    p.add_argument("--loss_margin", type=float,
                   help="the same for losses (default: the study's, else 0.005)")
    args = p.parse_args(argv)
    for name, value in (("--margin", args.margin), ("--loss_margin", args.loss_margin)):
        if value is not None:
            try:
                check_margin(name, value)
            except ValueError as e:
                sys.exit(f"error: {e}")
    try:
        for path in render_study(args.folder, args.out, args.margin, args.loss_margin):
            print(f"wrote {path}")
    except (ResultsError, LockError) as e:
        sys.exit(f"error: {e}")
    except OSError as e:
        sys.exit(f"error: cannot write the figures: {os_problem(e)}. Fix: {os_fix(e)}, or pass --out DIR")


if __name__ == "__main__":
    main()
