"""The pilot: QK-norm (learned gain) against no QK-norm, 500k tokens each on the tiny preset.

Writes research_results/qk_norm_500k_study/: combined_results.json (keys qk_norm and
no_qk_norm), panel_a_loss.png, panel_b_pr_trajectory.png, panel_c_per_layer.png,
panel_d_delta.png, layer_pr_heatmap_500k.png and report.md.

    python research/qk_norm_500k_study.py
"""
from research.studies import Study, run_study

STUDY = Study(
    name="qk_norm_500k_study", kind="pilot", gpu_preset="88m", default_tokens=500_000, description=__doc__,
    conditions={"qk_norm": {"qk_norm": "learned"}, "no_qk_norm": {"qk_norm": "none"}},
)

if __name__ == "__main__":
    run_study(STUDY)
