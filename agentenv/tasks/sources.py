"""Task sources by name (`env.tasks.source`): where a run's training and held-out tasks come from.

    env:
      tasks:
        source: hf                      # a registered source, or 'package.module:attr'
        path: data/gsm8k.parquet        # the source's own options, checked by its config class
        answer_extractor: gsm8k
        limit: 1000                     # every source: at most this many training tasks

A source is a `Part`: `factory(config)` returns a `TaskSet` (or a list of
training tasks), where `config` is the source's validated config class built
from the section (minus `source`, `limit`, `eval_limit`). A source's config may
offer `tool_defaults()`: options it fills in for tools (the toy source gives
the search tool its corpus). Built in: `jsonl`, `parquet` (verl/ARPO schema),
`hf` (anything the `datasets` library reads); `toy` is registered by
`agentenv.toy`. An installed package adds sources through the
`agentenv.task_sources` entry-point group.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentenv.errors import ConfigError
from agentenv.loader import check_number, rest_field
from agentenv.registry import Part, Registry, as_part, is_import_path, load_import_path
from agentenv.tasks.task import Ability, Task, balanced_subset

TASK_SOURCES: Registry[Part[TaskSet | list[Task]]] = Registry(
    "task source", "env.tasks.source", group="agentenv.task_sources", adapt=as_part
)


@runtime_checkable
class FillsToolDefaults(Protocol):
    """A source config that offers tools options (by tool name), such as the toy corpus for `search`."""

    def tool_defaults(self) -> Mapping[str, Mapping[str, Any]]: ...


@runtime_checkable
class TaskSource(Protocol):
    """A task source's factory: its validated config (an instance of the source's config class) -> the run's tasks."""

    def __call__(self, config: Any, /) -> TaskSet | list[Task]: ...


def register_task_source(
    name: str, factory: TaskSource | str, config_cls: type | str | None = None, *, overwrite: bool = False
) -> None:
    """Register a task source: `factory(config) -> TaskSet | list[Task]`, options checked by `config_cls`."""
    TASK_SOURCES.register(name, Part(factory, config_cls), overwrite=overwrite)


@dataclass
class TaskSet:
    """The tasks of a run.

    Attributes:
        train: Training tasks, in the order the source gives them.
        heldout: Held-out tasks (may be empty).
    """

    train: list[Task]
    heldout: list[Task] = field(default_factory=list)


@dataclass(frozen=True)
class TasksConfig:
    """The `env.tasks` section: a source by name, its options, and limits every source shares.

    Attributes:
        source: A registered task source (`toy`, `jsonl`, `parquet`, `hf`, ...) or `module:attr`.
        limit: Use at most this many training tasks.
        eval_limit: Use at most this many held-out tasks (taken round-robin over kinds).
        options: The source's own options (every other key of the section).
    """

    source: str = "toy"
    limit: int | None = None
    eval_limit: int | None = None
    options: Mapping[str, Any] = rest_field()

    def __post_init__(self) -> None:
        if self.limit is not None:
            check_number("env.tasks.limit", self.limit, low=1, low_ok=True, integer=True)
        if self.eval_limit is not None:
            check_number("env.tasks.eval_limit", self.eval_limit, low_ok=True, integer=True)
        part = TASK_SOURCES.get(self.source, "env.tasks.source")
        object.__setattr__(self, "_part", part)
        object.__setattr__(self, "_config", part.config(self.options, "env.tasks"))

    @property
    def source_config(self) -> Any:
        """The source's validated options."""
        return self._config  # type: ignore[attr-defined]  # set in __post_init__ on the frozen config, not a field

    def tool_defaults(self) -> dict[str, dict[str, Any]]:
        """Options the source fills in for tools, by tool name (e.g. the toy corpus for `search`)."""
        cfg = self.source_config
        return {k: dict(v) for k, v in (cfg.tool_defaults() if isinstance(cfg, FillsToolDefaults) else {}).items()}

    def load(self) -> TaskSet:
        """Load the tasks and apply the limits.

        Raises:
            ConfigError: The source loaded no training tasks, or failed on bad data
                (the message names the file and the row).
        """
        try:
            out = self._part.make(self.source_config)  # type: ignore[attr-defined]  # set in __post_init__ on the frozen config
        except (FileNotFoundError, ValueError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError("env.tasks", f"source {self.source!r} failed: {e}") from e
        if not isinstance(out, TaskSet):
            out = TaskSet(list(out))
        if self.limit is not None:
            out.train = out.train[: self.limit]
        if self.eval_limit is not None:
            out.heldout = balanced_subset(out.heldout, self.eval_limit)
        if not out.train:
            raise ConfigError("env.tasks", f"source {self.source!r} loaded no training tasks")
        return out


# --------------------------------------------------------------------------- jsonl and parquet
@dataclass(frozen=True)
class FileTasksConfig:
    """Tasks from files of the source's format.

    Attributes:
        path: Training file.
        eval_path: Held-out file (none: no held-out tasks).
        system_prompt: JSONL: put before the question of records that give only a
            question. Parquet: replaces each row's own system message (verl rows
            carry ARPO's, which describes the `tags` tool-call format; give one
            that fits another format, e.g. `hermes`).
        prefill: Text every response begins with: appended to each task as the
            assistant's message, which the policy continues (e.g. the opening of
            a tool call, for a model that does not call tools on its own).
    """

    path: str
    eval_path: str | None = None
    system_prompt: str | None = None
    prefill: str | None = None


def _read_files(cfg: FileTasksConfig, load: Callable[[Path], list[Task]]) -> TaskSet:
    """`load` on the training and held-out files; a path that is no file, or a file that is no tasks,
    is a ConfigError naming `env.tasks.path` (or `eval_path`) before anything starts."""

    def read(path: str, key: str) -> list[Task]:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(key, f"{path!r} {'is a folder, not a file' if p.is_dir() else 'does not exist'}")
        try:
            return load(p)
        except (OSError, ValueError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(key, f"{path!r} cannot be read as tasks: {e}") from None

    def prefilled(tasks: list[Task]) -> list[Task]:
        if not cfg.prefill:
            return tasks
        turn = {"role": "assistant", "content": cfg.prefill}
        return [dataclasses.replace(t, messages=(*t.messages, turn)) for t in tasks]

    heldout = read(cfg.eval_path, "env.tasks.eval_path") if cfg.eval_path else []
    return TaskSet(prefilled(read(cfg.path, "env.tasks.path")), prefilled(heldout))


def jsonl_tasks(cfg: FileTasksConfig) -> TaskSet:
    """`jsonl`: one task per line (see `agentenv.tasks.loaders.load_jsonl`)."""
    from agentenv.tasks.loaders import load_jsonl

    return _read_files(cfg, lambda p: load_jsonl(p, system_prompt=cfg.system_prompt))


def parquet_tasks(cfg: FileTasksConfig) -> TaskSet:
    """`parquet`: verl/ARPO parquet files (see `agentenv.tasks.loaders.load_verl_parquet`)."""
    from agentenv.tasks.loaders import load_verl_parquet

    def load(path: Path) -> list[Task]:
        tasks = load_verl_parquet(path)
        if cfg.system_prompt is None:
            return tasks
        system = {"role": "system", "content": cfg.system_prompt}
        return [
            dataclasses.replace(t, messages=(system, *(m for m in t.messages if m.get("role") != "system")))
            for t in tasks
        ]

    return _read_files(cfg, load)


# --------------------------------------------------------------------------- any dataset through `datasets`
def gsm8k_answer(text: str) -> str:
    """GSM8K's reference answer: the text after the last `####`, without thousands separators."""
    if "####" not in text:
        raise ValueError(f"no '####' in the answer text {text[-80:]!r}")
    return text.rsplit("####", 1)[1].strip().replace(",", "")


ANSWER_EXTRACTORS: dict[str, Callable[[str], str]] = {"gsm8k": gsm8k_answer}
"""Named answer extractors of the `hf` source."""


@dataclass(frozen=True)
class HFTasksConfig:
    """Tasks from any dataset the `datasets` library reads.

    Attributes:
        path: A dataset folder (`save_to_disk`, or a folder of data files), a
            parquet/JSONL/CSV file, or a hub name (where a hub is reachable).
        name: The dataset's configuration (hub datasets with several, e.g. `main`).
        split: Split of the training tasks.
        eval_split: Split of the held-out tasks (none: no held-out tasks).
        eval_path: A separate file or folder for the held-out tasks (read with `eval_split`, default `split`).
        question: Column of the question.
        answer: Column of the reference answer.
        id: Column of the task id (default `<dataset name>-<split>-<row>`).
        answer_extractor: Turns the answer column into the reference answer:
            `gsm8k` (the text after `####`), a `module:attr` function (str -> str),
            or a regular expression whose first group is the answer.
        ability: `math` (checked by equality) or `qa` (checked by F1).
        system_prompt: System message put before each question.
        cache_dir: Where `datasets` keeps its converted copy (default its own cache).
    """

    path: str
    name: str | None = None
    split: str = "train"
    eval_split: str | None = None
    eval_path: str | None = None
    question: str = "question"
    answer: str = "answer"
    id: str | None = None
    answer_extractor: str | None = None
    ability: Ability = "qa"
    system_prompt: str | None = None
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        extractor_fn(self.answer_extractor)  # a bad extractor fails at load time

    def extractor(self) -> Callable[[str], str] | None:
        return extractor_fn(self.answer_extractor)


def extractor_fn(spec: str | None) -> Callable[[str], str] | None:
    """The answer extractor a config names (see `HFTasksConfig.answer_extractor`)."""
    key = "env.tasks.answer_extractor"
    if spec is None:
        return None
    if spec in ANSWER_EXTRACTORS:
        return ANSWER_EXTRACTORS[spec]
    if is_import_path(spec):
        fn = load_import_path(spec, key, "answer extractor")
        if not callable(fn):
            raise ConfigError(key, f"{spec!r} is not a function")
        return fn
    try:
        pattern = re.compile(spec)
    except re.error as e:
        raise ConfigError(key, f"{spec!r} is neither {', '.join(ANSWER_EXTRACTORS)}, module:attr, nor a regular expression: {e}") from e
    if pattern.groups < 1:
        raise ConfigError(key, f"the regular expression {spec!r} needs a group that captures the answer")

    def by_pattern(text: str) -> str:
        found = pattern.findall(text)
        if not found:
            raise ValueError(f"{spec!r} does not match the answer text {text[-80:]!r}")
        last = found[-1]
        return (last[0] if isinstance(last, tuple) else last).strip()

    return by_pattern


def _read_dataset(path: str, name: str | None, split: str, cache_dir: str | None) -> Any:
    """One split of a dataset: a save_to_disk folder, a data file or folder, or a hub name."""
    try:
        import datasets
    except ImportError as e:
        raise ConfigError("env.tasks.source", "the hf source needs the datasets library: pip install 'agentenv[hf]'") from e
    p = Path(path).expanduser()
    if p.is_dir() and ((p / "dataset_dict.json").exists() or (p / "state.json").exists()):
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ConfigError("env.tasks.split", f"{path} has no split {split!r} (splits: {', '.join(ds)})")
            ds = ds[split]
        return ds
    if p.is_file():
        kinds = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
        kind = kinds.get(p.suffix.lower())
        if kind is None:
            raise ConfigError("env.tasks.path", f"{path}: cannot read {p.suffix!r} files; give parquet, JSONL or CSV")
        # A single file is one split, whatever its name.
        return datasets.load_dataset(kind, data_files={split: str(p)}, split=split, cache_dir=cache_dir)
    if not p.exists() and (p.is_absolute() or path.startswith((".", "~")) or p.suffix):
        raise ConfigError("env.tasks.path", f"no file or folder at {path}")
    try:
        return datasets.load_dataset(path, name, split=split, cache_dir=cache_dir)
    except ValueError as e:
        raise ConfigError("env.tasks.split", f"{path}: {e}") from e


def _hf_split(cfg: HFTasksConfig, path: str, split: str) -> list[Task]:
    ds = _read_dataset(path, cfg.name, split, cfg.cache_dir)
    columns = list(ds.column_names)
    for key, col in (("question", cfg.question), ("answer", cfg.answer), ("id", cfg.id)):
        if col is not None and col not in columns:
            raise ConfigError(f"env.tasks.{key}", f"{path} has no column {col!r} (columns: {', '.join(columns)})")
    extract = cfg.extractor()
    prefix = Path(path).stem if Path(path).exists() else path.replace("/", "_")
    tasks: list[Task] = []
    for i, row in enumerate(ds):
        question, raw = row[cfg.question], row[cfg.answer]
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{path} {split} row {i}: column {cfg.question!r} is not a non-empty string")
        answers = [str(a) for a in raw] if isinstance(raw, (list, tuple)) else [str(raw)]
        if extract is not None:
            try:
                answers = [extract(a) for a in answers]
            except ValueError as e:
                raise ValueError(f"{path} {split} row {i}: {e}") from None
        messages = [{"role": "user", "content": question}]
        if cfg.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": cfg.system_prompt})
        tasks.append(
            Task(
                id=str(row[cfg.id]) if cfg.id else f"{prefix}-{split}-{i}",
                messages=tuple(messages),
                ground_truth=answers[0],
                ability=cfg.ability,
                metadata={"source": "hf", "dataset": path, "split": split, "index": i, "answers": answers},
            )
        )
    return tasks


def hf_tasks(cfg: HFTasksConfig) -> TaskSet:
    """`hf`: a question and an answer column of any dataset `datasets` reads."""
    train = _hf_split(cfg, cfg.path, cfg.split)
    heldout: list[Task] = []
    if cfg.eval_path or cfg.eval_split:
        heldout = _hf_split(cfg, cfg.eval_path or cfg.path, cfg.eval_split or cfg.split)
    return TaskSet(train, heldout)


register_task_source("jsonl", jsonl_tasks, FileTasksConfig)
register_task_source("parquet", parquet_tasks, FileTasksConfig)
register_task_source("hf", hf_tasks, HFTasksConfig)
register_task_source("reasoning_gym", "agentenv.tasks.reasoning_gym:reasoning_gym_tasks",
                     "agentenv.tasks.reasoning_gym:ReasoningGymConfig")  # fmt: skip

__all__ = [
    "ANSWER_EXTRACTORS",
    "FileTasksConfig",
    "HFTasksConfig",
    "TASK_SOURCES",
    "TaskSet",
    "TaskSource",
    "TasksConfig",
    "gsm8k_answer",
    "hf_tasks",
    "jsonl_tasks",
    "parquet_tasks",
    "register_task_source",
]
