"""The pilot: QK-norm (learned gain) against no QK-norm, 500k tokens each on the tiny preset.

Writes research_results/qk_norm_500k_study/: combined_results.json (keys qk_norm and
no_qk_norm), panel_a_loss.png, panel_b_pr_trajectory.png, panel_c_per_layer.png,
panel_d_delta.png, layer_pr_heatmap_500k.png and report.md.

    python research/qk_norm_500k_study.py
"""
from research.studies import PILOT
from research.studies.runner import run_study


def main(argv: list[str] | None = None) -> None:
    run_study(PILOT, argv, description=__doc__)


if __name__ == "__main__":
    main()
