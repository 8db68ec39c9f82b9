"""GiGPO: episode-level (GRPO's) plus step-level advantages from anchor-state groups (arXiv 2505.10978)."""

from agentenv.algorithms.gigpo.algorithm import GiGPO, TreeGiGPO, gigpo_advantages, step_metrics, steps_of
from agentenv.algorithms.gigpo.config import GiGPOConfig, StepConfig, TreeGiGPOConfig

__all__ = ["GiGPO", "GiGPOConfig", "StepConfig", "TreeGiGPO", "TreeGiGPOConfig", "gigpo_advantages", "step_metrics", "steps_of"]
