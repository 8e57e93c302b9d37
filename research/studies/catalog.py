"""The studies: each is data, a name, how its results are drawn, and its conditions as config overrides."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Study:
    name: str  # output folder under research_results/
    kind: str  # how its results become figures and a report: a key of research.studies.render.KINDS
    conditions: dict[str, dict] = field(default_factory=dict)  # condition -> config overrides
    gpu_preset: str = "88m"  # the write-ups' setting, used on CUDA when --preset is auto
    default_tokens: int | None = None  # tokens per condition on the tiny preset (None: the preset's)
    default_seeds: tuple[int, ...] = (0, 1, 2)  # enough for the decisions to be tested; --seeds overrides


# 4 seeds x 300k tokens: with Holm over three pairs a fourth seed lowers the t the first test needs from 7.6
# to 4.9, worth more than 100k tokens per run; 12 runs fit in 15 minutes on 2 CPU cores (README, "Studies")
QK_NORM = Study("qk_norm_50m_study", "qk_norm", gpu_preset="1b", default_tokens=300_000, default_seeds=(0, 1, 2, 3),
                conditions={
                    "QK": {"qk_norm": "learned"}, "QK_frozen": {"qk_norm": "frozen"}, "NoQK": {"qk_norm": "none"}})
PILOT = Study("qk_norm_500k_study", "pilot", default_tokens=500_000, conditions={
    "qk_norm": {"qk_norm": "learned"}, "no_qk_norm": {"qk_norm": "none"}})
KEY_DYNAMICS = Study("key_dynamics_study", "keys", conditions={
    "QK": {"qk_norm": "learned"}, "QK_no_gain_wd": {"qk_norm": "learned", "wd_on_gains": False}})
HEAD_SPECIALIZATION = Study("head_specialization_study", "heads", conditions={"QK": {"qk_norm": "learned"}})

STUDIES = {s.name: s for s in (QK_NORM, PILOT, KEY_DYNAMICS, HEAD_SPECIALIZATION)}
