"""Head specialization: do heads within a layer split into high-norm sinks and low-norm gatherers?

One condition, a QK-norm model (learned gain), probed every N steps. Its figures show the key norm
and entropy of each KV head of one layer over training, every head as a dot of key norm against
entropy, the keys' effective rank per layer and the k_norm gain per dimension; report.md names the
sinks and gatherers at the last probe, with the thresholds used. --help lists the files it writes.

    python research/head_specialization_study.py
"""
from utils.cli import command

from research.studies import HEAD_SPECIALIZATION
from research.studies.runner import run_study


@command
def main(argv: list[str] | None = None) -> None:
    run_study(HEAD_SPECIALIZATION, argv, description=__doc__)


if __name__ == "__main__":
    main()
