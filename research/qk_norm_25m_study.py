"""QK-norm and rank collapse: does the learned gain or the normalization drive the keys' rank?

Three conditions, same seed and data order: QK (RMSNorm on q and k with a learned
gain), QK_frozen (the same normalization with the gain frozen at 1), NoQK (no
QK-norm). Every condition is probed every N steps; the figures 1_loss.png,
2_key_pr_causal.png, 3_per_layer.png, 4_causal_decomposition.png, 5_gamma_cv.png,
combined.json and report.md (table and triangulation verdict) land in
research_results/qk_norm_50m_study/.

    python research/qk_norm_25m_study.py                   # tiny preset on CPU (~10 min), 1b on CUDA
    python research/qk_norm_25m_study.py --seeds 0 1 2     # paired by seed: verdicts per docs/decisions.md
    python research/qk_norm_25m_study.py --preset 88m --tokens 8000000 --out runs/qk88m
"""
from research.studies import QK_NORM
from research.studies.runner import run_study


def main(argv: list[str] | None = None) -> None:
    run_study(QK_NORM, argv, description=__doc__)


if __name__ == "__main__":
    main()
