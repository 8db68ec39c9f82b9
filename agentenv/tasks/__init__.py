"""Tasks: the Task record, dataset loaders, toy task generators and rewards."""

from agentenv.tasks.loaders import load_jsonl, load_verl_parquet
from agentenv.tasks.prompts import ARPO_SYSTEM_PROMPT, TOY_SYSTEM_PROMPT, render_prompt
from agentenv.tasks.rewards import REWARDS, RewardResult, arpo_reward, get_reward
from agentenv.tasks.task import Task, balanced_subset
from agentenv.tasks.toy import ToyConfig, ToySuite, build_toy_suite, load_toy_tasks, reference_turns, write_corpus

__all__ = [
    "ARPO_SYSTEM_PROMPT",
    "REWARDS",
    "RewardResult",
    "TOY_SYSTEM_PROMPT",
    "Task",
    "ToyConfig",
    "ToySuite",
    "arpo_reward",
    "build_toy_suite",
    "get_reward",
    "load_jsonl",
    "load_toy_tasks",
    "load_verl_parquet",
    "reference_turns",
    "render_prompt",
    "write_corpus",
]
