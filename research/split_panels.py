"""Redraw every figure and the report of a study folder from its JSON files alone.

    python research/split_panels.py research_results/qk_norm_50m_study
    python research/split_panels.py tests/fixtures/reference/qk_norm_50m_study --out /tmp/writeups

The second line redraws the write-ups' own 1.5B results, from the copy this repository ships (their three
runs' results.json, byte for byte). Beside report.md it writes report.html: the same report as one page to share,
its figures embedded (research/plots/page.py).
"""
from __future__ import annotations

import textwrap

from utils.cli import ArgumentParser, command

from research.analysis.rules import LOSS_MARGIN, MARGIN, check_margin
from research.results.vocabulary import PILOT_COMBINED, QK_CONDITIONS, RESULTS_FILE, STUDY_INDEX
from research.studies import QK_NORM, STUDIES
from research.studies.kinds import KINDS
from research.studies.render import render_study

DEFAULT_FOLDER = f"research_results/{QK_NORM.name}"


def drawn_files() -> str:
    """What each study of the catalog has drawn into its folder (its study.json is the runner's, kept as it is)."""
    lines = [f"{name}: {', '.join(f for f in study.outputs() if f != STUDY_INDEX)}" for name, study in STUDIES.items()]
    lines.append(f"a study file's (research/study.py): {', '.join(KINDS['conditions'].outputs([]))}")
    return "\n".join(textwrap.fill(line, 100, subsequent_indent="    ", break_on_hyphens=False) for line in lines)


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
The study is recognised from the files, as the registry of study kinds says (research/studies/kinds.py):
its study.json, or a study's own results file (pretrained_keys.json, checkpoint_keys.json). Every results
file is validated before anything is drawn; nothing is written unless all of them pass, and each
output is replaced atomically. Needs numpy and matplotlib only: torch is never imported.
"""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=f"{DESCRIPTION.rstrip()}\n\nThe files drawn for each study of the catalog (the "
                                   f"key-dynamics and head-specialization\nfigures carry the condition's name when a "
                                   f"study has several):\n{drawn_files()}")
    p.add_argument("folder", nargs="?", default=DEFAULT_FOLDER,
                   help=f"Study folder: one holding study.json (written by the study scripts), the pilot's "
                        f"{PILOT_COMBINED}, condition folders {', '.join(QK_CONDITIONS)} holding {RESULTS_FILE}, "
                        f"or a folder holding a study's own results file ("
                        f"{', '.join(k.found_by for k in KINDS.values() if k.found_by)}). Default: {DEFAULT_FOLDER}")
    p.add_argument("--out", help="Folder to write the figures and report into, with redraw.json naming the study "
                                 "folder it is a redraw of (never one holding others' results, nor another folder's "
                                 "redraw). Default: the study folder")
    p.add_argument("--margin", type=float,
                   help=f"Equivalence margin of key metrics, a share of the compared values' mean: an interval wholly "
                        f"inside +-margin reads 'about equal', wholly beyond it 'different' (docs/decisions.md). "
                        f"Default: the one the study ran with, else {MARGIN}")
    p.add_argument("--loss_margin", type=float,
                   help=f"Equivalence margin of losses, as --margin is of key metrics. Default: the study's, else "
                        f"{LOSS_MARGIN}")
    return p


@command(fix_also="pass --out DIR")
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    for name, value in (("--margin", args.margin), ("--loss_margin", args.loss_margin)):
        if value is not None:
            check_margin(name, value)
    for path in render_study(args.folder, args.out, args.margin, args.loss_margin):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
