"""jaxrose: fast JAX training for embodied RL (Rose synchronous overlap, EBRL asynchrony)."""

from jaxrose.config import ConfigError, EnvConfig, NetworkConfig, PPOConfig, RunConfig, TrainConfig
from jaxrose.presets import PRESETS, get_preset
from jaxrose.sequential import RunState, SequentialExecutor
from jaxrose.train import TrainResult, train

__version__ = "0.1.0"
__all__ = ["ConfigError", "EnvConfig", "NetworkConfig", "PPOConfig", "RunConfig", "TrainConfig", "PRESETS",
           "get_preset", "RunState", "SequentialExecutor", "TrainResult", "train"]
