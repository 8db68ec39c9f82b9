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
training tasks are dropped; when that leaves fewer than `eval_size`, a warning
says how many). A task's `metadata["kind"]` is its dataset, so an evaluation
reports accuracy per dataset (`eval/accuracy/<dataset>`). The reward reads the
policy's last `<answer>...</answer>` block and scores it with the dataset's
verifier (a float in [0, 1]; correct at 1).

Verifiers are reasoning-gym's code run on the model's text, so agentenv does
not trust them:

- each runs in the verifier worker (`agentenv.tasks.worker`), killed at
  `env.reward_timeout_s` (`countdown` on `1e999999` and
  `intermediate_integration` on `inf` ran 65-70 s); a check cut off or raising
  scores 0, the reward's minimum (the reward gate, `agentenv.tasks.rewards`);
- at load, each dataset's verifier scores junk answers (`JUNK_ANSWERS` and the
  question itself) on a few of its tasks: a dataset whose verifier pays full
  marks for junk is refused by name. Three whose upstream checks pay for junk
  are scored by a corrected check instead (`VERIFIER_FIXES`, documented in
  docs/reference/tasks.md).
"""

from __future__ import annotations

import cmath
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

from agentenv.errors import ConfigError
from agentenv.loader import check_number
from agentenv.tasks.rewards import RewardResult, bounded, extract_answer, verifier_timeout_s
from agentenv.tasks.task import Task
from agentenv.tasks.worker import VerifierFailed, VerifierTimeout, get_worker

log = logging.getLogger(__name__)

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
        check_number("seed", self.seed, low_ok=True, integer=True)
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
            check_number(f"{key}.seed", opts["seed"], low_ok=True, integer=True)
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
    """The source: each dataset's training tasks (in turn, dataset by dataset) and held-out tasks from another seed.

    Raises:
        ConfigError: (`env.tasks.datasets.NAME`) The dataset's verifier scores a junk answer as correct.
    """
    from agentenv.tasks.sources import TaskSet

    train: list[Task] = []
    heldout: list[Task] = []
    for name, opts in cfg.datasets.items():
        mine = _tasks(name, opts, "train", cfg.system_prompt)
        check_verifier(name, mine[:JUNK_PROBE_TASKS])
        train += mine
        if cfg.eval_size:
            seen = {t.question for t in mine}
            held = _tasks(name, {**opts, "size": cfg.eval_size, "seed": opts["seed"] + cfg.eval_seed_offset}, "heldout",
                          cfg.system_prompt)  # fmt: skip
            kept = [t for t in held if t.question not in seen]
            if len(kept) < cfg.eval_size:
                log.warning("reasoning_gym %s: %d held-out tasks of the %d asked (env.tasks.eval_size): %d repeat a "
                            "training question (its question space is small)", name, len(kept), cfg.eval_size,
                            cfg.eval_size - len(kept))  # fmt: skip
            heldout += kept
    return TaskSet(train, heldout)


# ----------------------------------------------------------------------------- scoring


def _fix_game_of_life_halting(ds: Any, answer: str, entry: dict[str, Any]) -> float:
    # upstream: `bool(answer) == bool(entry["answer"])`, and the answer is the string "True" or "False": any
    # non-empty text scored 1.0
    return float(answer.strip().lower() == str(entry["answer"]).strip().lower())


def _fix_coin_flip(ds: Any, answer: str, entry: dict[str, Any]) -> float:
    # upstream: partial credit for the share of leading characters that match, so "0" (one character, as
    # long as the shorter string) scored 1.0 against any probability below 1; here: within 1e-4, or 0
    try:
        got, want = float(Fraction(answer.replace(",", "").strip())), float(Fraction(str(entry["answer"]).replace(",", "")))
    except (ValueError, ZeroDivisionError, OverflowError):
        return 0.0
    return float(abs(got - want) <= 1e-4)


def _fix_complex_arithmetic(ds: Any, answer: str, entry: dict[str, Any]) -> float:
    # upstream: min(1.0, exp(-distance)), and min(1.0, nan) is 1.0: "nan" scored full marks; here a
    # non-finite answer scores 0
    try:
        if not cmath.isfinite(ds.parse_string_to_complex(answer)):
            return 0.0
    except (ValueError, TypeError):
        return 0.0
    return float(ds.score_answer(answer, entry))


VERIFIER_FIXES: dict[str, Callable[[Any, str, dict[str, Any]], float]] = {
    "game_of_life_halting": _fix_game_of_life_halting,
    "coin_flip": _fix_coin_flip,
    "complex_arithmetic": _fix_complex_arithmetic,
}
"""Datasets whose upstream verifier pays for junk (reasoning-gym 0.1.x), scored by a corrected check instead."""

JUNK_ANSWERS: tuple[str, ...] = ("", " ", "0", "1", "-1", "0.5", "nan", "inf", "-inf", "1e999999", "{}", "[]", "()",
                                 "None", "null", "True", "False", "yes", "no", "a", "x" * 20_000)  # fmt: skip
"""Answers no verifier may pay for (besides the question itself), unless one is the task's own answer."""
JUNK_PROBE_TASKS = 2
"""Tasks of each dataset its verifier is probed on at load."""
_PROBE_BATCH_S = 20.0
"""Limit of probing every junk answer of one task in one call; past it, each is probed alone."""
_PROBE_TIMEOUT_S = 2.0
"""Limit of one answer's probe: a check cut off scores as wrong, so only the load's time is at stake."""


def verify(name: str, options: str, answer: str, entry: dict[str, Any]) -> float | None:
    """The dataset's verdict on `answer` (in the verifier worker): its own `score_answer`, or its fix."""
    ds = _dataset(name, options)
    fix = VERIFIER_FIXES.get(name)
    score = fix(ds, answer, entry) if fix is not None else ds.score_answer(answer, entry)
    return None if score is None else float(score)


def verify_upstream(name: str, options: str, answer: str, entry: dict[str, Any]) -> float | None:
    """The dataset's own `score_answer`, uncorrected (to show what `VERIFIER_FIXES` correct)."""
    score = _dataset(name, options).score_answer(answer, entry)
    return None if score is None else float(score)


def _verdict(task: Task, answer: str, timeout_s: float) -> float:
    """The verifier's score of `answer` on `task`, run in the worker.

    Raises:
        VerifierTimeout: Cut off after `timeout_s`.
        VerifierFailed: The verifier raised.
    """
    opts = json.loads(task.metadata["rg_options"])
    score = get_worker().call("agentenv.tasks.reasoning_gym:verify", task.metadata["rg_dataset"],
                              json.dumps({**opts, "size": 1}, sort_keys=True), answer, task.metadata["rg_entry"],
                              timeout_s=timeout_s)  # fmt: skip
    return 0.0 if score is None else score


def _same(junk: str, answer: str) -> bool:
    """Whether a junk answer is the task's own answer (then it is no junk for this task)."""
    a, b = junk.strip().lower(), answer.strip().lower()
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def probe(name: str, options: str, answers: list[str], entry: dict[str, Any], upstream: bool = False) -> list[float | str]:
    """In the verifier worker: the verifier's score of each answer (`"raised"` where it raised), in one call."""
    check = verify_upstream if upstream else verify
    out: list[float | str] = []
    for answer in answers:
        try:
            score = check(name, options, answer, entry)
            out.append(0.0 if score is None else score)
        except Exception:  # noqa: BLE001 - a verifier raising on junk: scored as wrong, as in training
            out.append("raised")
    return out


def check_verifier(name: str, tasks: list[Task], *, upstream: bool = False) -> None:
    """Probe the dataset's verifier with junk on `tasks`: none may score 1 (a check that raises or times out
    scores as wrong, as in training; junk that ran out the time on one task is not tried on the next).

    Args:
        name: The dataset.
        tasks: A few of its tasks.
        upstream: Probe reasoning-gym's own `score_answer`, not agentenv's corrections (`VERIFIER_FIXES`).

    Raises:
        ConfigError: (`env.tasks.datasets.NAME`) A junk answer scored as correct.
    """
    slow: set[str] = set()
    worker = get_worker()
    for task in tasks:
        junks = [j for j in (*JUNK_ANSWERS, task.question) if j not in slow and not _same(j, task.ground_truth)]
        opts = json.dumps({**json.loads(task.metadata["rg_options"]), "size": 1}, sort_keys=True)
        args = (name, opts, junks, task.metadata["rg_entry"], upstream)
        try:  # every answer in one call; a runaway one: each alone, each bounded
            results = worker.call("agentenv.tasks.reasoning_gym:probe", *args, timeout_s=_PROBE_BATCH_S)
        except VerifierTimeout:
            results = []
            for junk in junks:
                try:
                    results += worker.call("agentenv.tasks.reasoning_gym:probe", name, opts, [junk], args[3], upstream,
                                           timeout_s=_PROBE_TIMEOUT_S)  # fmt: skip
                except VerifierTimeout:
                    slow.add(junk)
                    results.append("timeout")
        except VerifierFailed:
            continue
        for junk, score in zip(junks, results, strict=True):
            if isinstance(score, (int, float)) and score >= 1.0:
                shown = junk if len(junk) <= 40 else f"{junk[:20]}... ({len(junk):,} characters)"
                what = "the question itself" if junk == task.question else repr(shown)
                raise ConfigError(f"env.tasks.datasets.{name}", (
                    f"reasoning-gym's {name} verifier scores junk as correct ({what} scored {score:g} on task "
                    f"{task.id!r}, whose answer is {task.ground_truth[:60]!r}): its reward would pay for junk, so "
                    "agentenv refuses the dataset; train on another, or fix its score_answer upstream"))  # fmt: skip


@bounded(0.0, 1.0)
def reasoning_gym_reward(response: str, task: Task, tool_calls: Mapping[str, int]) -> Any:
    """`reasoning_gym`: the task's dataset scores the last `<answer>` block (0 without one; correct at 1).

    The check runs in the verifier worker, cut off at `env.reward_timeout_s`.

    Raises:
        VerifierTimeout: The check was cut off (the reward gate scores it 0).
        VerifierFailed: The verifier raised (the reward gate scores it 0).
    """
    if task.metadata.get("rg_entry") is None:
        raise ValueError(f"task {task.id!r} is not a reasoning_gym task (env.reward: reasoning_gym needs "
                         "env.tasks.source: reasoning_gym)")  # fmt: skip
    answer = extract_answer(response)
    if answer is None:
        return RewardResult(0.0, False, False, None, "no <answer>...</answer>")
    score = _verdict(task, answer, verifier_timeout_s())
    return RewardResult(score, score >= 1.0, True, answer, f"{task.metadata['rg_dataset']} verifier: {score:g}")
