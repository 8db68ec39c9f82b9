"""agentenv: train tool-using LLM agents with reinforcement learning.

Importing this package loads neither vLLM, nor Docker, nor CUDA: backends load
when a config asks for them.
"""

import agentenv.envs  # noqa: F401  registers agentenv/<Name>-v0 with gymnasium (imports only gymnasium)
import agentenv.toy  # noqa: F401  registers the toy task source and the tiny model, as a user's package does
from agentenv.errors import AgentEnvError, ConfigError, InfraError, ToolError, TrainingStopped
from agentenv.types import Generation, Group, SamplingParams, Segment, ToolResult, Trajectory

__version__ = "0.1.0"

__all__ = [
    "AgentEnvError",
    "ConfigError",
    "Generation",
    "Group",
    "InfraError",
    "SamplingParams",
    "Segment",
    "ToolError",
    "ToolResult",
    "TrainingStopped",
    "Trajectory",
    "__version__",
]
