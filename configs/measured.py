"""What a run's config measures, and the one refusal of a run or a study asked to measure what its settings cannot.

A key-cache field (kv_cache, kv_every_probe, kv_layer_bits) with no probe, or a study whose primary quantity its
config leaves unmeasured, would train and then decide nothing; `check_measured` refuses both before anything trains.

    check_measured(cfg)                                                  # a run's own kv_* fields
    check_measured(cfg, {"primary quantity kv_loss_4bit": KEY_CACHE})    # what a study decides, too

Who asks it: docs/probing.md, "What a key cache needs".
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
