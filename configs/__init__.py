from configs.config import (ConfigError, DataConfig, ModelConfig, ProbeConfig, QK_NORM_MODES, RunConfig,
                            TrainConfig, flops_per_token)
from configs.presets import PRESETS, get_preset
from configs.cli import add_config_args, apply_overrides, config_from_args

__all__ = ["ConfigError", "DataConfig", "ModelConfig", "ProbeConfig", "QK_NORM_MODES", "RunConfig", "TrainConfig",
           "flops_per_token", "PRESETS", "get_preset", "add_config_args", "apply_overrides", "config_from_args"]
