"""One validated config tree (`schema`, `sources`, `algo` with its typed sub-configs) and its loader (`load`): YAML, dotted overrides,
unknown keys named with the nearest valid one; `help` lists every key for the CLIs' `--help`. Imports nothing of the project but registry names
from the leaf modules `agentrl.algo` and `agentrl.rollout.tools` (inside validators)."""

from agentrl.config.algo import (AdaptiveKL, FixedKL, GaeAdvantage, LossKL, MaskCorrection, NoCorrection, NoKL,
                                 RewardKL, ScalarAdvantage, TISCorrection)
from agentrl.config.load import ConfigError, apply_override, build_config, load_config
from agentrl.config.learner import CriticConfig, LearnerConfig, LoraConfig, OptimConfig
from agentrl.config.schema import (AlgoConfig, BufferConfig, ClusterConfig, Config, DataConfig, DefaultModelConfig,
                                   EngineConfig, EnvConfig, ModelConfig, RolloutConfig, ServerConfig, TrainConfig,
                                   WeightSyncConfig)
from agentrl.config.teacher import TeacherConfig
from agentrl.config.tools import ToolsConfig, ToolServerConfig
from agentrl.config.sources import (SOURCE_TYPES, EndpointConfig, EnvSource, HttpSource, RewardModelConfig,
                                    RewardModelSource, RewardsConfig, RewardSourceConfig, RuleSource, VerifierConfig)

__all__ = [
    "AdaptiveKL", "FixedKL", "GaeAdvantage", "LossKL", "MaskCorrection", "NoCorrection", "NoKL", "RewardKL",
    "ScalarAdvantage", "TISCorrection",
    "SOURCE_TYPES", "AlgoConfig", "BufferConfig", "ClusterConfig", "Config", "ConfigError", "CriticConfig", "DataConfig",
    "DefaultModelConfig", "EndpointConfig", "EngineConfig", "EnvConfig", "EnvSource", "HttpSource", "LearnerConfig",
    "LoraConfig", "ModelConfig", "OptimConfig", "RewardModelConfig", "RewardModelSource", "RewardSourceConfig",
    "RewardsConfig", "RolloutConfig", "RuleSource", "ServerConfig", "TeacherConfig", "ToolServerConfig", "ToolsConfig", "TrainConfig", "VerifierConfig",
    "WeightSyncConfig",
    "apply_override", "build_config", "load_config",
]
