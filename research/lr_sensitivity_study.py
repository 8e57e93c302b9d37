"""Why QK-norm exists: final loss against the learning rate, with and without QK-norm, and with QK-clip.

Four conditions, each trained at every multiple of the preset's Muon and AdamW learning rates (both
scaled together): QK (learned gain), QK_frozen (gain frozen at 1), NoQK (no QK-norm) and NoQK_clip
(no QK-norm, Kimi K2's QK-clip at tau = 100). A run whose loss becomes non-finite is recorded as
diverged and the study goes on. Outputs in research_results/lr_sensitivity_study/: results.json per
run, lr_final_loss.png, lr_max_logit.png, lr_sensitivity.png, lr_keys.png and report.md (learning-rate
sensitivity as Wortsman et al. 2023 define it, decided per seed).

    python research/lr_sensitivity_study.py                 # tiny on CPU (~20 min), 88m on CUDA
    python research/lr_sensitivity_study.py --seeds 0 1 2   # more seeds
"""
from research.studies import LR_SENSITIVITY
from research.studies.runner import run_study


def main(argv: list[str] | None = None) -> None:
    run_study(LR_SENSITIVITY, argv, description=__doc__)


if __name__ == "__main__":
    main()
