"""Head specialization: do heads within a layer split into high-norm sinks and low-norm gatherers?

One QK-norm model, probed every N steps. Writes research_results/head_specialization_study/:
norm_divergence.png, entropy_norm_scatter.png, effective_rank.png, gamma_heatmap.png
and report.md (sinks / gatherers at the last probe, with the thresholds used).

    python research/head_specialization_study.py
"""
from research.studies import Study, run_study

STUDY = Study(name="head_specialization_study", kind="heads", gpu_preset="88m", description=__doc__,
              conditions={"QK": {"qk_norm": "learned"}})

if __name__ == "__main__":
    run_study(STUDY)
