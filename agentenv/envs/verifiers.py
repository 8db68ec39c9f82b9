"""`env.class: verifiers`: a verifiers environment (PrimeIntellect's `verifiers`) as the run's env.

    env:
      class: verifiers
      options:
        environment: my_envs:load_environment   # 'module:attr' of a vf.Environment or a function making one,
                                                # or the id of an installed environment (vf.load_environment)
        args: {num_examples: 100}               # keyword arguments of that function
        eval_examples: 20                       # held-out tasks from its eval_dataset (0: none)

The environment's dataset becomes the run's tasks (one per row: its prompt
messages, its answer). Each episode runs the environment's own rollout (its
multi-turn protocol: a `SingleTurnEnv`'s one request, a `ToolEnv`'s tool
loop, ...) with a client of agentenv's OpenAI-compatible endpoint, which
records every token the policy samples exactly; its rubric's weighted sum is
the reward, and each reward function's value is logged beside it
(`Scored.parts`, `rollout/reward_part/<name>`). The environment cannot be
forked mid-episode, so tree samplers (ARPO) refuse it.

Needs `pip install 'agentenv[verifiers]'` (verifiers 0.3, whose legacy API
holds `SingleTurnEnv`, `ToolEnv` and `Rubric`; `scripts/setup.sh` installs it
without changing the installed torch, transformers, openai or mcp).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentenv.errors import ConfigError
from agentenv.loader import check_number
from agentenv.registry import is_import_path, load_import_path
from agentenv.tasks.rewards import Scored
from agentenv.tasks.sources import TaskSet
from agentenv.tasks.task import Task

_KEY = "env.options.environment"


@dataclass(frozen=True)
class VerifiersConfig:
    """`env.options` of `env.class: verifiers`.

    Attributes:
        environment: `module:attr` of a `verifiers.Environment`, or of a function
            returning one (called with `args`); or the id of an installed
            verifiers environment (`verifiers.load_environment(id, **args)`).
        args: Keyword arguments of that function.
        eval_examples: Held-out tasks taken from the environment's
            `eval_dataset` (0: none).
        sampling_args: Extra arguments the environment passes to each request
            (the endpoint honors `max_tokens` and `stop`; sampling follows `policy`).
    """

    environment: str = ""
    args: Mapping[str, Any] = field(default_factory=dict)
    eval_examples: int = 0
    sampling_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.environment, str) or not self.environment.strip():
            raise ConfigError("environment", "name a verifiers environment: 'module:attr' or an installed environment's id")
        check_number("eval_examples", self.eval_examples, low_ok=True, integer=True)


def _is_environment(obj: Any) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("get_dataset", "rollout")) and hasattr(obj, "rubric")


def load_environment(cfg: VerifiersConfig) -> Any:
    """The verifiers environment `cfg` names.

    Raises:
        ConfigError: (`env.options.environment`) verifiers is not installed, the
            environment does not import or fails to build, or it is no environment.
    """
    try:
        import verifiers as vf
    except ImportError as e:
        raise ConfigError(_KEY, f"needs verifiers: pip install 'agentenv[verifiers]' ({e})") from None
    name = cfg.environment
    try:
        if is_import_path(name):
            obj = load_import_path(name, _KEY, "verifiers environment")
            if not _is_environment(obj) and callable(obj):
                obj = obj(**dict(cfg.args))
            elif cfg.args:
                raise ConfigError("env.options.args", f"{name!r} is an environment, not a function: it takes no args")
        else:
            obj = vf.load_environment(name, **dict(cfg.args))
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a user's environment can fail any way: say which and why
        raise ConfigError(_KEY, f"verifiers environment {name!r} failed to load: {type(e).__name__}: {e}") from e
    if not _is_environment(obj):
        raise ConfigError(_KEY, f"{name!r} gave {type(obj).__name__}, not a verifiers Environment "
                          "(one with get_dataset(), rollout() and a rubric)")  # fmt: skip
    return obj


class VerifiersEnv:
    """A verifiers environment as a client env (`agentenv.envs.parts.ClientEnv`).

    Args:
        env: The verifiers `Environment`.
        config: Its options.
    """

    can_fork: ClassVar[bool] = False
    config_cls: ClassVar[type] = VerifiersConfig

    def __init__(self, env: Any, config: VerifiersConfig):
        self.env = env
        self.config = config
        self._rows: dict[str, Mapping[str, Any]] = {}

    @classmethod
    def from_options(cls, options: VerifiersConfig) -> VerifiersEnv:
        return cls(load_environment(options), options)

    def _tasks_of(self, dataset: Any, split: str, limit: int | None) -> list[Task]:
        out = []
        for i, row in enumerate(dataset):
            if limit is not None and i >= limit:
                break
            tid = f"vf-{split}-{row.get('example_id', i)}"
            prompt = row.get("prompt")
            if not isinstance(prompt, list) or not prompt:
                raise ConfigError(_KEY, f"{self.config.environment!r}: row {i} of its {split} dataset has no chat "
                                  f"prompt (got {prompt!r}); agentenv runs chat environments")  # fmt: skip
            messages = tuple({"role": m["role"], "content": m.get("content") or ""} for m in prompt)
            self._rows[tid] = row
            out.append(Task(tid, messages, str(row.get("answer", "")), metadata={"kind": split, "source": "verifiers"}))
        return out

    def tasks(self) -> TaskSet:
        """The environment's dataset as training tasks (and `eval_examples` of its eval dataset as held-out)."""
        try:
            train = self._tasks_of(self.env.get_dataset(), "train", None)
            heldout: list[Task] = []
            if self.config.eval_examples:
                heldout = self._tasks_of(self.env.get_eval_dataset(), "eval", self.config.eval_examples)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - the environment's dataset code is the user's
            raise ConfigError(_KEY, f"{self.config.environment!r}: its dataset failed to load: {type(e).__name__}: {e}") from e
        if not train:
            raise ConfigError(_KEY, f"{self.config.environment!r} has an empty dataset")
        return TaskSet(train, heldout)

    async def run(self, client: Any, task: Task, model: str) -> Scored:
        """One rollout of the environment's protocol through `client`, scored by its rubric."""
        from verifiers.legacy.clients import OpenAIChatCompletionsClient

        row = self._rows[task.id]
        rollout_input = {k: row[k] for k in ("prompt", "example_id", "answer", "info", "task") if k in row}
        state = await self.env._run_rollout_state(  # the rollout and its rubric, without the output's conversion
            rollout_input, OpenAIChatCompletionsClient(client), model, dict(self.config.sampling_args)
        )
        if state.get("error") is not None:
            raise RuntimeError(f"the verifiers rollout failed: {state['error']}")
        parts = {str(k): float(v) for k, v in (state.get("metrics") or {}).items()}
        reward = float(state.get("reward") or 0.0)
        if not math.isfinite(reward):
            raise ValueError(f"the rubric of {self.config.environment!r} gave a reward of {reward}")
        return Scored(reward, correct=reward > 0, parts=parts)


__all__ = ["VerifiersConfig", "VerifiersEnv", "load_environment"]
