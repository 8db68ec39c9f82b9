"""agentenv.rollout: the async engine that drives policies against envs."""

from agentenv.envs.episode import StepResult
from agentenv.rollout.config import RolloutConfig
from agentenv.rollout.engine import (
    Episode,
    RolloutEngine,
    concat_generations,
    derive_seed,
    run_episode,
    run_group,
)

__all__ = [
    "Episode",
    "RolloutConfig",
    "RolloutEngine",
    "StepResult",
    "concat_generations",
    "derive_seed",
    "run_episode",
    "run_group",
]
