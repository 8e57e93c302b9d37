"""The one vocabulary of results: sites, metric names, condition tags, file names.

Writers (the probe, the studies) and readers (analysis, plots) import these names from
here, so a metric or a condition is spelled in exactly one place. No torch.
"""
from __future__ import annotations

from utils.telemetry import GATE_CLOSED, GATE_OPEN  # noqa: F401  (the gate's thresholds, with its metrics)

from utils import owners, run_names

# Where keys are measured: after k_norm, before RoPE (the write-ups' hook; for qk_norm='none'
# the raw projection), and after RoPE, as attention uses them.
SITES = ("k_norm", "k_rope")
# The same keys before the learned gain (k_norm output / gain), before and after RoPE: what the
# normalization gives, without the gain's arithmetic (recorded where the gain is learned).
PRE_GAIN_SITES = {"k_norm": "k_hat", "k_rope": "k_hat_rope"}
MAIN_SITE = "k_norm"  # the write-ups' site: layer_pr and mean_pr are its pr_sv
PR = f"{MAIN_SITE}.pr_sv"  # the per-layer mean that layer_pr records
KEY_METRICS = ("norm_mean", "norm_std", "max_abs", "mean_max_abs", "peak_frac", "std",
               "cos_mean", "pr_sv", "pr_var", "erank", "pr_vec")
ATTENTION_METRICS = ("entropy", "sink_mass", "qk_ratio", "logit_max", "logit_mean", "logit_std")
# logit_max taken apart at the (query, key) pair where it occurs: logit_max = scale x |q| x |k| x cos (before any
# soft-cap), with where the pair sits; and, where the model has q / k norm gains, how much each gain lengthens
# the normalized vector there (|x| / |x / gain|, 1 for gains of ones). Files written before 2026-11 lack them.
LOGIT_SPLIT = ("logit_scale", "logit_q_norm", "logit_k_norm", "logit_cos", "logit_query_pos", "logit_key_dist")
GAIN_SPLIT = ("logit_q_gain", "logit_k_gain")
# With attention-logit soft-capping (attn_softcap) the attention metrics are those of the capped logits; the
# largest logit before the cap and its split are recorded beside them under these names.
UNCAPPED = "_uncapped"
UNCAPPED_SPLIT = tuple(f"{name}{UNCAPPED}" for name in ("logit_max", *LOGIT_SPLIT))
# With gated attention (attn_gate), the gate's mean and population std over the probe batch, per query head.
# Gate saturation (marin's 535B run found its layer-0 gate shut for 98.3% of token x head gates): the share of gate
# values below GATE_CLOSED and above GATE_OPEN, and the norm of each head's rows of the gate's weight W_g.
GATE_METRICS = ("gate_mean", "gate_std", "gate_closed", "gate_open", "gate_weight_norm")
# What a key cache needs (research/probing/key_rank.py, rotary_use.py, kv_cache.py; docs/probing.md). At k_norm and
# k_rope, per KV head: the rank holding 90% / 99% of the energy of the covariance (Loki's) and of K^T K / N.
RANK_METRICS = ("rank90", "rank99", "rank90_uncentered", "rank99_uncentered")
# Rotary frequency use of the keys before rotary (k_norm's metrics) and of the queries (attn's, prefixed q_), per head;
# each pair's share [heads][pairs] in a layer record's `pair_share` object: of the keys' and the queries' energy, and
# of the largest logit. How the dims pair up is the model's (a probe record's `rotary`). Files written before 2026-11-27
# lack them.
ROTARY_METRICS = ("low_freq_share", "dominant_pair")
QUERY_ROTARY = tuple(f"q_{name}" for name in ROTARY_METRICS)
PAIR_SHARES = ("k_norm", "q_norm", "logit")
ROTARY_PAIRINGS = ("half", "interleaved")
# The key cache's section of results.json (once, at the end of a run; with kv_every_probe in every probe record too):
# keys fake-quantized in each scheme at each width, before or after rotary, and projected on their top r directions;
# the attention errors each causes, per layer and query head; the loss with every layer's keys quantized.
KV_CACHE = "kv_cache"
KV_SITES = ("pre_rope", "post_rope")
KV_SCHEMES = ("per_channel", "per_token", "per_token_hadamard")
KV_ERRORS = ("logit_error", "attention_kl", "output_error")
# The layer means an experiment tracker (--logger) shows per layer after each probe; a name the
# probe does not record (logit_max before the probe measured it) is left out.
TRACKED_LAYER_MEANS = (PR, f"{MAIN_SITE}.norm_mean", "attn.entropy", "attn.sink_mass", "attn.logit_max")

# The write-ups' top-level fields (names and meanings kept), and those with one value per probe.
WRITEUP_FIELDS = ("tag", "tokens", "loss", "val_loss", "mean_pr", "layer_pr", "gamma_cv", "gamma_final")
PER_PROBE = ("tokens", "loss", "val_loss", "mean_pr")
SCHEMA = "qk-keys/results"
SCHEMA_VERSION = 1

# The three-condition QK-norm study: tags, the letters its report uses, and labels for people.
QK_CONDITIONS = ("QK", "QK_frozen", "NoQK")
LETTERS = {"QK": "A", "QK_frozen": "B", "NoQK": "C"}
# Its three comparisons: the gain's effect (A - B), the normalization's (B - C), QK-norm's whole (A - C).
QK_PAIRS = (("QK", "QK_frozen"), ("QK_frozen", "NoQK"), ("QK", "NoQK"))
TAG_BY_QK_NORM = {"learned": "QK", "frozen": "QK_frozen", "none": "NoQK"}
# The learning-rate study adds no QK-norm with Kimi K2's QK-clip, and names its runs condition@multiplier.
LR_CONDITIONS = (*QK_CONDITIONS, "NoQK_clip")
# The gain ablations of a learned-gain run (research.probing.ablation): which gains are replaced, by what.
ABLATION_MODES = ("learned", "k_ones", "q_ones", "qk_ones", "k_mean", "q_mean", "qk_mean")
ABLATION_TEXT = {"k_ones": "k gain \u2192 1", "q_ones": "q gain \u2192 1", "qk_ones": "q and k gains \u2192 1",
                 "k_mean": "k gain \u2192 its mean", "q_mean": "q gain \u2192 its mean",
                 "qk_mean": "q and k gains \u2192 their means"}
LEGACY_ABLATION_MODES = {"ones": "k_ones", "mean": "k_mean"}  # files written before q gains were ablated
GRID_SEP = "@"
# The kinds of study a study.json may name (research.studies.kinds.KINDS draws each), and those whose runs are a
# learning-rate grid, named condition@multiplier: both derived from the one table of kinds (utils.owners.OWNERS).
STUDY_KINDS, GRID_KINDS = owners.STUDY_KINDS, owners.GRID_KINDS


def grid_key(condition: str, multiplier: float) -> str:
    """'NoQK@4': a condition trained at 4x the preset's learning rates."""
    return f"{condition}{GRID_SEP}{multiplier:g}"


def split_grid_key(key: str) -> tuple[str, float]:
    condition, _, multiplier = key.rpartition(GRID_SEP)
    return condition, float(multiplier)


def base_condition(name: str) -> str:
    """The condition of a run name: 'NoQK' for 'NoQK@4' (a run of the learning-rate grid) and for 'NoQK'."""
    return name.rpartition(GRID_SEP)[0] if GRID_SEP in name else name

CONDITION_LABELS = {
    "QK": "QK-norm, learned gain",
    "QK_frozen": "QK-norm, gain frozen at 1",
    "NoQK": "no QK-norm",
    "NoQK_clip": "no QK-norm, QK-clip",
    # the fine-tuning study of a pretrained model (research/finetune_keys_study.py)
    "gains_trained": "q/k norm gains trained",
    "gains_frozen": "q/k norm gains frozen at their pretrained values",
    # the pilot's names (its combined_results.json keys)
    "qk_norm": "QK-norm, learned gain",
    "no_qk_norm": "no QK-norm",
}

# File names inside a study folder.
RESULTS_FILE = run_names.RESULTS  # a run's key probe writes it into the run folder
METRICS_FILE = run_names.METRICS  # the trainer's per-step log in the run folder
# The files that mark whose a folder is are named in the owner table (utils.owners), which training asks too.
STUDY_INDEX = owners.STUDY_INDEX
# What a training run writes into its folder: a tool that writes figures, reports or an export never writes into a
# folder holding any of them.
RUN_FILES = run_names.RUN_FILES
QK_COMBINED = owners.QK_COMBINED
PILOT_COMBINED = owners.PILOT_COMBINED
REPORT = "report.md"
REPORT_PAGE = "report.html"  # report.md as one page to share, written beside it (research.plots.page)
INSPECT_FILE = owners.INSPECT_FILE  # research/inspect_pretrained.py's results


def label(condition: str) -> str:
    """A condition's name for people ('QK-norm, learned gain'); unknown tags are shown as they are."""
    return CONDITION_LABELS.get(condition, condition)
