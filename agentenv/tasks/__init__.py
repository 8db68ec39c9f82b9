"""Tasks: the Task record, dataset loaders, toy task generators and rewards."""

from agentenv.tasks.task import Task

__all__ = ["Task"]
