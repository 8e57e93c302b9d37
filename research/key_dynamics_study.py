"""What happens to attention keys as the model trains: norm, outliers and redundancy per layer.

Two conditions, both with QK-norm (learned gain), probed every N steps: QK, and QK_no_gain_wd
without weight decay on the norm gains. Per condition, one figure of four panels (smoothed norm of
the early / middle / final layer groups, outlier magnitude of the first, middle and last layer,
redundancy by group, final norm per layer against sqrt(d_head)) and one of the key norm over
training; report.md says which layers ended above and below sqrt(d_head). --help lists the files it
writes.

    python research/key_dynamics_study.py
"""
from utils.cli import command

from research.studies import KEY_DYNAMICS
from research.studies.runner import run_study


@command
def main(argv: list[str] | None = None) -> None:
    run_study(KEY_DYNAMICS, argv, description=__doc__)


if __name__ == "__main__":
    main()
