"""QK-norm and rank collapse: does the learned gain or the normalization drive the keys' rank?

Three conditions, same seed and data order: QK (RMSNorm on q and k with a learned
gain), QK_frozen (the same normalization with the gain frozen at 1), NoQK (no
QK-norm). Every condition is probed every N steps. The figures show the losses, the key
PR over training and per layer, the gain's and the normalization's effects, the gain's CV
and the gain against geometry; report.md holds the table and the triangulation verdict,
combined.json the numbers. --help lists the files it writes.
"""
from utils.cli import command

from research.studies import QK_NORM
from research.studies.runner import run_study


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
    python research/qk_norm_25m_study.py                   # tiny preset on CPU (~10 min), 1b on CUDA
    python research/qk_norm_25m_study.py --seeds 0 1 2     # paired by seed: verdicts per docs/decisions.md
    python research/qk_norm_25m_study.py --preset 88m --tokens 8000000 --out runs/qk88m
"""


@command
def main(argv: list[str] | None = None) -> None:
    run_study(QK_NORM, argv, description=DESCRIPTION)


if __name__ == "__main__":
    main()
