"""Head specialization: do heads within a layer split into high-norm sinks and low-norm gatherers?

One QK-norm model, probed every N steps. Writes research_results/head_specialization_study/:
norm_divergence.png, entropy_norm_scatter.png, effective_rank.png, gamma_heatmap.png
and report.md (sinks / gatherers at the last probe, with the thresholds used).

    python research/head_specialization_study.py
"""
from research.studies import HEAD_SPECIALIZATION
from research.studies.runner import run_study


def main(argv: list[str] | None = None) -> None:
    run_study(HEAD_SPECIALIZATION, argv, description=__doc__)


if __name__ == "__main__":
    main()
