"""Train one model from a preset plus command-line overrides.

    python train_llm.py --preset tiny --tokens 200000 --out runs/tiny
    python train_llm.py --preset tiny --out runs/tiny --resume          # continue the newest checkpoint
    python train_llm.py --preset tiny --out runs/p --probe_every 25     # key probe -> runs/p/results.json
    python train_llm.py --config runs/tiny/config.json --out runs/again  # a saved config, run again
    python train_llm.py --preset 1b --device cuda --plan               # memory per device, then exit
    torchrun --nproc_per_node 2 train_llm.py --preset tiny --out runs/ddp
"""
from __future__ import annotations

import os
import sys
from typing import NoReturn

# `python -m train_llm` puts the working folder first on sys.path, and a user's own utils.py, models.py or data.py
# there would shadow this project's packages ("No module named 'utils.runtime'; 'utils' is not a package"). This
# file sits beside its packages (in the checkout, or in site-packages): run as a program, its folder goes first,
# before they import. (Imported, e.g. by the qk-train command, it leaves sys.path alone.)
if __name__ == "__main__" and (_here := os.path.dirname(os.path.abspath(__file__))) not in sys.path[:1]:
    sys.path.insert(0, _here)

from utils.cli import command  # noqa: E402 (first: Ctrl-C while torch imports ends in one line)
from research.probing import command as train  # noqa: E402 (after the sys.path guard)


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
Every config field is an option (`--n_layers 8`, `--qk_norm frozen`, ...); see --help. Later wins:
the preset (--preset, else the --config file's, else tiny), the --config file, the options.
"""


def build_parser(argv: list[str] | None = None):
    return train.build_parser(argv, DESCRIPTION)


@command
def main(argv: list[str] | None = None) -> dict | None:
    return train.main(argv, DESCRIPTION)


def cli() -> NoReturn:
    """`python train_llm.py` and the qk-train command (pyproject.toml): exits 0 after a run and with main's status
    otherwise (main returns the run's summary, which a console script would print and exit 1 on), and ends a
    torchrun worker as training.distributed.end_process must."""
    from training.distributed import end_process
    try:
        main()
    except SystemExit as e:
        end_process(e.code)
    end_process(0)


if __name__ == "__main__":
    cli()
