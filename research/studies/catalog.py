"""The studies: each is data, a name, how its results are drawn, and its conditions as config overrides."""
from __future__ import annotations

from dataclasses import dataclass, field

from research.results.vocabulary import STUDY_INDEX, grid_key


@dataclass(frozen=True)
class Study:
    name: str  # output folder under research_results/
    kind: str  # how its results become figures and a report: a key of research.studies.kinds.KINDS
    conditions: dict[str, dict] = field(default_factory=dict)  # condition -> config overrides
    gpu_preset: str = "88m"  # the write-ups' setting, used on CUDA when --preset is auto
    default_tokens: int | None = None  # tokens per condition on the tiny preset (None: the preset's)
    default_seeds: tuple[int, ...] = (0, 1, 2)  # enough for the decisions to be tested; --seeds overrides
    lr_multipliers: tuple[float, ...] = ()  # train every condition at each multiple of its rates (runner.run_config)
    tiny_overrides: dict = field(default_factory=dict)  # the study's own settings on the tiny preset
    probes_per_run: int = 20  # probe_every defaults to steps // probes_per_run
    # A study file's (research/studies/study_file.py): its preset (over gpu_preset and tiny where --preset is auto),
    # the config fields every run shares on any preset, the condition the others are compared with, its margins
    preset: str | None = None
    shared: dict = field(default_factory=dict)
    baseline: str | None = None
    primary: tuple[str, ...] = ()  # the quantities read as one family (research.analysis.conditions.check_primary)
    margin: float | None = None  # None: research.analysis.rules.MARGIN
    loss_margin: float | None = None  # None: LOSS_MARGIN
    logit_margin: float | None = None  # None: research.analysis.conditions.LOGIT_MARGIN
    kv_loss_margin: float | None = None  # None: research.analysis.conditions.KV_LOSS_MARGIN
    source: str | None = None  # the study file it was read from, as messages name it

    def runs(self) -> list[tuple[str, dict]]:
        """(name in study.json, config overrides) of every run of one seed: a condition, or a condition at
        each learning-rate multiplier ('NoQK@4', research.results.vocabulary.grid_key)."""
        if not self.lr_multipliers:
            return list(self.conditions.items())
        return [(grid_key(c, m), {**o, "lr_multiplier": m}) for c, o in self.conditions.items()
                for m in self.lr_multipliers]

    def outputs(self) -> list[str]:
        """The files the study writes into its folder besides its runs' folders, in order: study.json (the
        runner's index), then what its kind (research.studies.kinds) draws for its conditions."""
        from research.studies.kinds import KINDS
        return [STUDY_INDEX, *KINDS[self.kind].outputs(list(self.conditions))]


# 4 seeds x 300k tokens: with Bonferroni over three pairs a fourth seed lowers the t each test needs from 7.6
# to 4.9, worth more than 100k tokens per run; 12 runs fit in 15 minutes on 2 CPU cores (docs/studies.md)
QK_NORM = Study("qk_norm_50m_study", "qk_norm", gpu_preset="1b", default_tokens=300_000, default_seeds=(0, 1, 2, 3),
                conditions={
                    "QK": {"qk_norm": "learned"}, "QK_frozen": {"qk_norm": "frozen"}, "NoQK": {"qk_norm": "none"}})
PILOT = Study("qk_norm_500k_study", "pilot", default_tokens=500_000, conditions={
    "qk_norm": {"qk_norm": "learned"}, "no_qk_norm": {"qk_norm": "none"}})
KEY_DYNAMICS = Study("key_dynamics_study", "keys", conditions={
    "QK": {"qk_norm": "learned"}, "QK_no_gain_wd": {"qk_norm": "learned", "wd_on_gains": False}})
HEAD_SPECIALIZATION = Study("head_specialization_study", "heads", conditions={"QK": {"qk_norm": "learned"}})

# Wortsman et al. (2023): final loss against the learning rate, with and without QK-norm, and Kimi K2's QK-clip
# (tau 100, as Kimi K2). On tiny: 4 conditions x 6 rates x 2 seeds of 100k tokens (98 steps of 8 x 128, with
# warmup and cosine decay as Wortsman et al.) fit in 20 minutes on 2 CPU cores; in the fp32 run of docs/studies.md the
# final loss at 64x was 1.00 nats above that at 1x without QK-norm, 0.41 with it.
LR_SENSITIVITY = Study(
    "lr_sensitivity_study", "lr", default_tokens=100_000, default_seeds=(0, 1), probes_per_run=8,
    lr_multipliers=(0.25, 1, 4, 16, 32, 64),
    tiny_overrides={"batch_size": 8, "warmup_frac": 0.1, "schedule": "cosine", "probe_batch": 16},
    conditions={"QK": {"qk_norm": "learned"}, "QK_frozen": {"qk_norm": "frozen"}, "NoQK": {"qk_norm": "none"},
                "NoQK_clip": {"qk_norm": "none", "qk_clip": 100.0}})

# Do the keys warn before the loss spikes (docs/spikes.md)? QK and NoQK at 128x and 256x the preset's learning
# rates, where the pilots of docs/spikes.md saw spikes in 400 steps without divergence (64x had none in 100 steps,
# 1024x never trained); every step logged (the spike rule and the signals read every step, on any preset). 12 seeds:
# the first 6 choose the alarm thresholds, the last 6 evaluate them; with 3 evaluation seeds the Bonferroni t
# interval (df 2, t ~ 12) decided no signal either way. On tiny: 400 steps of 4 x 128 tokens per run,
# 2 x 2 x 12 = 48 runs, about an hour on 2 CPU cores.
SPIKE_WARNING = Study(
    "spike_warning_study", "spikes", default_tokens=204_800, default_seeds=tuple(range(12)),
    lr_multipliers=(128, 256), shared={"log_every": 1},
    tiny_overrides={"batch_size": 4, "warmup_frac": 0.1, "schedule": "cosine", "probe_batch": 16},
    conditions={"QK": {"qk_norm": "learned"}, "NoQK": {"qk_norm": "none"}})

STUDIES = {s.name: s for s in (QK_NORM, PILOT, KEY_DYNAMICS, HEAD_SPECIALIZATION, LR_SENSITIVITY, SPIKE_WARNING)}
