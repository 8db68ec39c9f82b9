"""Tasks: the Task record, dataset loaders, task sources and rewards (a leaf: imports no other part)."""

from agentenv.tasks.loaders import load_jsonl, load_verl_parquet
from agentenv.tasks.prompts import ARPO_SYSTEM_PROMPT, render_prompt
from agentenv.tasks.rewards import REWARDS, Reward, RewardResult, arpo_reward, get_reward, register_reward
from agentenv.tasks.sources import TASK_SOURCES, TasksConfig, TaskSet, TaskSource, register_task_source
from agentenv.tasks.task import Task, balanced_subset

__all__ = [
    "ARPO_SYSTEM_PROMPT",
    "REWARDS",
    "Reward",
    "RewardResult",
    "TASK_SOURCES",
    "Task",
    "TaskSet",
    "TaskSource",
    "TasksConfig",
    "arpo_reward",
    "balanced_subset",
    "get_reward",
    "load_jsonl",
    "load_verl_parquet",
    "register_reward",
    "register_task_source",
    "render_prompt",
]
