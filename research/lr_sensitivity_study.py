"""Why QK-norm exists: final loss against the learning rate, with and without QK-norm, and with QK-clip.

Four conditions, each trained at every multiple of the preset's Muon and AdamW learning rates (both
scaled together): QK (learned gain), QK_frozen (gain frozen at 1), NoQK (no QK-norm) and NoQK_clip
(no QK-norm, Kimi K2's QK-clip at tau = 100). A run whose loss becomes non-finite is recorded as
diverged and the study goes on. The figures show the final loss, the largest attention logit, the
learning-rate sensitivity and the keys against the multiplier; report.md decides the sensitivity as
Wortsman et al. 2023 define it, per seed. --help lists the files it writes.
"""
from utils.cli import command

from research.studies import LR_SENSITIVITY
from research.studies.runner import run_study


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
    python research/lr_sensitivity_study.py                 # tiny on CPU (~20 min), 88m on CUDA
    python research/lr_sensitivity_study.py --seeds 0 1 2   # more seeds
"""


@command
def main(argv: list[str] | None = None) -> None:
    run_study(LR_SENSITIVITY, argv, description=DESCRIPTION)


if __name__ == "__main__":
    main()
