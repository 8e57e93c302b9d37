from configs.cli import add_config_args, apply_overrides, config_from_args
from configs.config import QK_NORM_MODES, ConfigError, DataConfig, ModelConfig, ProbeConfig, RunConfig, TrainConfig
from configs.flops import flops_per_token
from configs.presets import PRESETS, get_preset

__all__ = ["ConfigError", "DataConfig", "ModelConfig", "ProbeConfig", "QK_NORM_MODES", "RunConfig", "TrainConfig",
           "flops_per_token", "PRESETS", "get_preset", "add_config_args", "apply_overrides", "config_from_args"]
