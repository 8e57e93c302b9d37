"""The pilot: QK-norm (learned gain) against no QK-norm, 500k tokens each on the tiny preset.

Its figures show the losses, the mean key PR over training, the final PR per layer and its
difference, and a heatmap of PR per layer and probe; combined_results.json holds both conditions
(keys qk_norm and no_qk_norm). --help lists the files it writes.

    python research/qk_norm_500k_study.py
"""
from utils.cli import command

from research.studies import PILOT
from research.studies.runner import run_study


@command
def main(argv: list[str] | None = None) -> None:
    run_study(PILOT, argv, description=__doc__)


if __name__ == "__main__":
    main()
