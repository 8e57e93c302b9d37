"""What a run's config measures, and the one refusal of a run or a study asked to measure what its settings cannot.

The probe (probe_every > 0) measures the keys, the attention and the losses at each probe; the key cache's costs
(results.json's kv_cache section, research/probing/kv_cache.py) are measured by the probe where kv_cache,
kv_every_probe or kv_layer_bits asks for them. A key-cache field with no probe, or a study whose primary quantity
is read from a measurement its config leaves off, would train and then decide nothing ("no paired values" in every
table). Every entry point refuses it before anything trains, through `check_measured`: training.run.train_run for a
run (train_llm.py and every study's runs), and the study runner for a study's primary quantities
(research.studies.runner.check_runs: research/study.py and every catalog study script).

    check_measured(cfg)                                                  # a run's own kv_* fields
    check_measured(cfg, {"primary quantity kv_loss_4bit": KEY_CACHE})    # what a study decides, too
"""
from __future__ import annotations

from configs.config import ConfigError, RunConfig

PROBE = "the key probe"
KEY_CACHE = "the key cache's costs"
KV_FIELDS = ("kv_cache", "kv_every_probe", "kv_layer_bits")  # each asks the probe for the key cache's costs


def missing(cfg: RunConfig, needs: str) -> str | None:
    """Why `cfg` does not measure `needs` (PROBE or KEY_CACHE), with the setting that would; None where it does."""
    if cfg.probe.probe_every <= 0:
        return "probe_every is 0 (no probe): give probe_every > 0 (e.g. --probe_every 25)"
    if needs == KEY_CACHE and not any(getattr(cfg.probe, name) for name in KV_FIELDS):
        return ("the key cache's measurement is off (kv_cache, kv_every_probe and kv_layer_bits false): set kv_cache "
                "true (--kv_cache true, or kv_cache: true in a study file)")
    return None


def check_measured(cfg: RunConfig, asked: dict[str, str] | None = None) -> None:
    """ConfigError in one line where `cfg` cannot measure what is asked of it: its own key-cache fields (they need
    the probe) and `asked`, {what asks, in words: the measurement it needs (PROBE or KEY_CACHE)}."""
    own = {f"{name} true": PROBE for name in KV_FIELDS if getattr(cfg.probe, name)}
    for what, needs in {**own, **(asked or {})}.items():
        why = missing(cfg, needs)
        if why:
            raise ConfigError(f"{what} asks for {needs}, which this config does not measure: {why}; or leave {what} "
                              f"out")
