"""reasoning-gym's procedural tasks as a task source, scored by their own verifiers.

    env:
      tasks:
        source: reasoning_gym
        datasets:                         # reasoning-gym dataset name -> its options
          basic_arithmetic: {size: 200, seed: 1, max_terms: 4}
          leg_counting: {size: 200}       # seed: the section's `seed`
        eval_size: 50                     # held-out tasks per dataset, generated from another seed
      reward: reasoning_gym               # the dataset's own `score_answer`

Tasks are generated, nothing is downloaded. Each dataset's held-out tasks come
from its seed plus `eval_seed_offset` (questions that also occur in its
training tasks are dropped). A task's `metadata["kind"]` is its dataset, so an
evaluation reports accuracy per dataset (`eval/accuracy/<dataset>`). The
reward reads the policy's last `<answer>...</answer>` block and scores it with
the dataset's verifier (a float in [0, 1]; correct at 1).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from agentenv.errors import ConfigError
from agentenv.loader import check_number
from agentenv.tasks.task import Task

DEFAULT_SYSTEM_PROMPT = (
    "Solve the task. Think step by step if it helps, then give only the final answer inside "
    "<answer>...</answer>."
)


def _rg() -> Any:
    try:
        import reasoning_gym
    except ImportError as e:
        raise ConfigError("env.tasks.source", "reasoning_gym needs the reasoning-gym package: "
                                              "pip install 'agentenv[dev]' (or pip install reasoning-gym)") from e  # fmt: skip
    return reasoning_gym


@dataclass(frozen=True)
class ReasoningGymConfig:
    """The `reasoning_gym` task source's options.

    Attributes:
        datasets: Dataset name (reasoning-gym's, e.g. `basic_arithmetic`) -> its
            options: `size` (training tasks), `seed`, and any field of the
            dataset's own config class (e.g. `max_terms`), checked when loading.
        size: Training tasks of a dataset that gives no `size`.
        seed: Seed of a dataset that gives no `seed`.
        eval_size: Held-out tasks per dataset (0: none).
        eval_seed_offset: Held-out tasks are generated with the dataset's seed plus this (not 0).
        system_prompt: The system message of every task (how to write the answer).
    """

    datasets: Mapping[str, Any] = field(default_factory=dict)
    size: int = 100
    seed: int = 0
    eval_size: int = 20
    eval_seed_offset: int = 1_000_003
    system_prompt: str = DEFAULT_SYSTEM_PROMPT

    def __post_init__(self) -> None:
        if not isinstance(self.datasets, Mapping) or not self.datasets:
            raise ConfigError("datasets", f"name at least one reasoning-gym dataset: datasets: {{basic_arithmetic: "
                                          f"{{size: 100}}}}, got {self.datasets!r}")  # fmt: skip
        check_number("size", self.size, low=1, low_ok=True, integer=True)
        check_number("eval_size", self.eval_size, low_ok=True, integer=True)
        if not isinstance(self.eval_seed_offset, int) or isinstance(self.eval_seed_offset, bool) or self.eval_seed_offset == 0:
            raise ConfigError("eval_seed_offset", f"must be a non-zero integer (held-out tasks from another seed), "
                                                  f"got {self.eval_seed_offset!r}")  # fmt: skip
        known = set(_rg().factory.DATASETS)
        specs = {}
        for name, opts in self.datasets.items():
            key = f"datasets.{name}"
            if name not in known:
                import difflib

                close = difflib.get_close_matches(str(name), sorted(known), n=3)
                hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
                raise ConfigError(key, f"unknown reasoning-gym dataset {name!r}.{hint}")
            if opts is not None and not isinstance(opts, Mapping):
                raise ConfigError(key, f"expected a mapping of the dataset's options, got {opts!r}")
            opts = dict(opts or {})
            opts.setdefault("size", self.size)
            opts.setdefault("seed", self.seed)
            check_number(f"{key}.size", opts["size"], low=1, low_ok=True, integer=True)
            try:
                _dataset(name, json.dumps({**opts, "size": 1}, sort_keys=True))
            except Exception as e:  # noqa: BLE001 - the dataset's config rejects the options: say which
                raise ConfigError(key, f"reasoning-gym rejects {opts}: {type(e).__name__}: {e}") from None
            specs[str(name)] = opts
        object.__setattr__(self, "datasets", specs)


@lru_cache(maxsize=256)
def _dataset(name: str, options: str) -> Any:
    """A reasoning-gym dataset by name and JSON options (cached: the reward scores with it)."""
    return _rg().create_dataset(name, **json.loads(options))


def _tasks(name: str, opts: dict[str, Any], split: str, system_prompt: str) -> list[Task]:
    ds = _dataset(name, json.dumps(opts, sort_keys=True))
    scorer = json.dumps({k: v for k, v in opts.items() if k != "size"}, sort_keys=True)
    out = []
    for i in range(opts["size"]):
        entry = ds[i]
        out.append(Task(
            id=f"{name}/{split}/{i}",
            messages=({"role": "system", "content": system_prompt}, {"role": "user", "content": entry["question"]}),
            ground_truth=str(entry["answer"]),
            ability="qa",
            metadata={"kind": name, "source": "reasoning_gym", "split": split, "rg_dataset": name,
                      "rg_options": scorer, "rg_entry": entry},
        ))  # fmt: skip
    return out


def reasoning_gym_tasks(cfg: ReasoningGymConfig) -> Any:
    """The source: each dataset's training tasks (in turn, dataset by dataset) and held-out tasks from another seed."""
    from agentenv.tasks.sources import TaskSet

    train: list[Task] = []
    heldout: list[Task] = []
    for name, opts in cfg.datasets.items():
        mine = _tasks(name, opts, "train", cfg.system_prompt)
        train += mine
        if cfg.eval_size:
            seen = {t.question for t in mine}
            held = _tasks(name, {**opts, "size": cfg.eval_size, "seed": opts["seed"] + cfg.eval_seed_offset}, "heldout",
                          cfg.system_prompt)  # fmt: skip
            heldout += [t for t in held if t.question not in seen]
    return TaskSet(train, heldout)


def reasoning_gym_reward(response: str, task: Task, tool_calls: Mapping[str, int]) -> Any:
    """`reasoning_gym`: the task's dataset scores the last `<answer>` block (0 without one; correct at 1)."""
    from agentenv.tasks.rewards import RewardResult, extract_answer

    entry = task.metadata.get("rg_entry")
    if entry is None:
        raise ValueError(f"task {task.id!r} is not a reasoning_gym task (env.reward: reasoning_gym needs "
                         "env.tasks.source: reasoning_gym)")  # fmt: skip
    answer = extract_answer(response)
    if answer is None:
        return RewardResult(0.0, False, False, None, "no <answer>...</answer>")
    opts = json.loads(task.metadata["rg_options"])
    ds = _dataset(task.metadata["rg_dataset"], json.dumps({**opts, "size": 1}, sort_keys=True))
    score = float(ds.score_answer(answer, entry) or 0.0)
    return RewardResult(score, score >= 1.0, True, answer, f"{task.metadata['rg_dataset']} verifier: {score:g}")
