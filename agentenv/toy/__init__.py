"""The toy world: a generated knowledge base, toy tool-use tasks, and the tiny model that solves them in part.

It plugs into agentenv the way a user's package does, by registering its parts
by name (nothing here is imported until a config asks for it):

- the `toy` task source (`env.tasks.source: toy`, `agentenv.toy.source`), which
  also gives the search tool its corpus;
- the `tiny` model (`model.path: tiny`, `agentenv.toy.model`): a small Qwen2
  built offline and given a cold-start SFT (`agentenv.toy.tiny`).

It stands above tools, tasks, policies, envs and rollout (it uses all of them
to build the tiny model); nothing below imports it.
"""

from agentenv.policies.models import register_model
from agentenv.tasks.sources import register_task_source

register_task_source("toy", "agentenv.toy.source:toy_tasks", "agentenv.toy.source:ToyTasksConfig")
register_model("tiny", "agentenv.toy.model:TINY")
