"""What happens to attention keys as the model trains: norm, outliers and redundancy per layer.

One QK-norm model, probed every N steps. Writes research_results/key_dynamics_study/:
key_analysis_report.png (smoothed norm of early / middle / final layer groups,
outlier magnitude of the first, middle and last layer, redundancy by group, final
norm per layer against sqrt(d_head)), key_norm_evolution.png and report.md (which
layers ended above and below sqrt(d_head)).

    python research/key_dynamics_study.py
"""
from research.studies import KEY_DYNAMICS
from research.studies.runner import run_study


def main(argv: list[str] | None = None) -> None:
    run_study(KEY_DYNAMICS, argv, description=__doc__)


if __name__ == "__main__":
    main()
