"""Wiring: a RunConfig -> model path, tokenizer, policy, tools, tasks, env factory.

Everything heavy is imported here, inside functions, when a config asks for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agentenv.configs import EnvConfig, PolicyConfig, RunConfig, TasksConfig
from agentenv.errors import ConfigError
from agentenv.tasks.task import Task, balanced_subset


_CLOSE_TIMEOUT_S = 120.0
"""Bound on closing one prototype tool (a sandbox pool removes its containers)."""


def cache_root() -> Path:
    return Path(os.environ.get("AGENTENV_CACHE", Path.home() / ".cache" / "agentenv"))


def resolve_model_path(path: str) -> str:
    """`tiny` -> the embedded tiny model (built once, then cached); a local folder or a hub id as given.

    Raises:
        ConfigError: (`model.path`) a local path that does not exist, is a
            file, or holds no `config.json`.
    """
    if path == "tiny":
        from agentenv.policies.tiny import ensure_tiny_model

        return str(ensure_tiny_model())
    local = Path(path).expanduser()
    if local.exists():
        hint = "give a Hugging Face model folder (holding config.json), a hub id or `tiny`"
        if not local.is_dir():
            raise ConfigError("model.path", f"{path!r} is a file; {hint}")
        if not (local / "config.json").exists():
            raise ConfigError("model.path", f"{path!r} holds no config.json; {hint}")
        return str(local)
    if path.startswith(("/", ".", "~")) or path.endswith("/") or path.count("/") > 1:
        raise ConfigError("model.path", f"{path!r} does not exist (and is no hub id such as Qwen/Qwen2.5-7B-Instruct)")
    return path


def first_line(e: BaseException) -> str:
    """An exception's first line (library errors can run to pages), or its type."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_output_dir(path: str | Path) -> None:
    """Make `trainer.output_dir` and prove it writable, before minutes of model loading.

    Raises:
        ConfigError: It is a file, or cannot be created or written.
    """
    out = Path(path)
    probe = out / f".write-test-{os.getpid()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except FileExistsError:
        raise ConfigError("trainer.output_dir", f"{str(out)!r} is a file, not a folder") from None
    except OSError as e:
        raise ConfigError("trainer.output_dir", f"{str(out)!r} is not writable ({e.strerror or e})") from None


def check_prompts_fit(tasks: TaskSet, tokenizer: Any, max_context_tokens: int) -> None:
    """Every prompt must leave the policy room in `env.max_context_tokens`.

    Otherwise every such episode fails at its reset, and a run whose prompts
    are all too long would "finish" having learned nothing.

    Raises:
        ConfigError: (`env.max_context_tokens`) with the longest prompt's task and size.
    """
    from agentenv.tasks.prompts import render_prompt

    longest, worst = 0, None
    for task in [*tasks.train, *tasks.heldout]:
        n = len(render_prompt(tokenizer, task.messages))
        if n > longest:
            longest, worst = n, task
    if worst is not None and longest >= max_context_tokens:
        raise ConfigError(
            "env.max_context_tokens",
            f"{max_context_tokens} leaves no room for the policy: task {worst.id!r} has a {longest}-token prompt; "
            f"raise env.max_context_tokens above {longest} plus room for the answer (policy.max_turn_tokens)",
        )


def build_policy(cfg: PolicyConfig, model_path: str, dtype: str, seed: int) -> Any:
    """The rollout policy for `policy.backend`."""
    if cfg.backend == "hf":
        from agentenv.policies.hf import HFPolicy, HFPolicyConfig

        return HFPolicy(HFPolicyConfig(model=model_path, dtype=dtype, max_batch_size=cfg.max_batch_size, seed=seed))
    if cfg.backend == "vllm":
        from agentenv.policies.vllm import VLLMPolicyConfig, make_vllm_policy

        return make_vllm_policy(
            VLLMPolicyConfig(
                model=model_path,
                dtype=dtype,
                tensor_parallel_size=cfg.tensor_parallel_size,
                gpu_memory_utilization=cfg.gpu_memory_utilization,
                max_model_len=cfg.max_model_len,
                entropy_mode=cfg.entropy_mode,
                entropy_topk=cfg.entropy_topk,
                enforce_eager=cfg.enforce_eager,
                seed=seed,
            )
        )
    raise ConfigError("policy.backend", f"unknown backend {cfg.backend!r}")


@dataclass
class TaskSet:
    train: list[Task]
    heldout: list[Task]
    corpus_path: Path | None = None


def build_tasks(cfg: TasksConfig) -> TaskSet:
    """Training and held-out tasks (and, for toy tasks, the search corpus they need)."""
    if cfg.source == "toy":
        from agentenv.tasks.toy import GENERATOR_VERSION, ToyConfig, build_toy_suite

        suite = build_toy_suite(ToyConfig(seed=cfg.seed))
        kinds = set(cfg.kinds)
        train = [t for t in suite.train if t.metadata["kind"] in kinds]
        heldout = [t for t in suite.heldout if t.metadata["kind"] in kinds]
        corpus = cache_root() / "toy" / f"v{GENERATOR_VERSION}-seed{cfg.seed}" / "corpus.jsonl"
        if not corpus.exists():
            corpus.parent.mkdir(parents=True, exist_ok=True)
            tmp = corpus.with_suffix(f".tmp{os.getpid()}")
            suite.write_corpus(tmp)
            os.replace(tmp, corpus)
        out = TaskSet(train, heldout, corpus)
    else:
        from agentenv.tasks.loaders import load_jsonl, load_verl_parquet

        load = load_jsonl if cfg.source == "jsonl" else load_verl_parquet
        train = _load_tasks(load, cfg.path, "env.tasks.path")
        heldout = _load_tasks(load, cfg.eval_path, "env.tasks.eval_path") if cfg.eval_path else []
        out = TaskSet(train, heldout, None)
    if cfg.limit is not None:
        out.train = out.train[: cfg.limit]
    if cfg.eval_limit is not None:
        out.heldout = balanced_subset(out.heldout, cfg.eval_limit)
    if not out.train:
        raise ConfigError("env.tasks", "no training tasks were loaded")
    return out


def _load_tasks(load: Callable[[Any], list[Task]], path: Any, key: str) -> list[Task]:
    if not Path(path).expanduser().is_file():
        what = "is a folder, not a file" if Path(path).expanduser().is_dir() else "does not exist"
        raise ConfigError(key, f"{str(path)!r} {what}")
    try:
        return load(Path(path).expanduser())
    except (OSError, ValueError) as e:
        raise ConfigError(key, f"{str(path)!r} cannot be read as tasks: {e}") from None


def build_tools(cfg: EnvConfig, tasks: TaskSet, summarizer: Any = None) -> dict[str, Any]:
    """Prototype tools by name (episodes fork them)."""
    from agentenv.configs import tool_config

    tools: dict[str, Any] = {}
    for name in cfg.tools:
        opts = dict(getattr(cfg, name))
        if name == "search":
            from agentenv.tools.search import make_search_tool

            if "corpus" not in opts and tasks.corpus_path is not None:
                opts["corpus"] = str(tasks.corpus_path)
            tools[name] = make_search_tool(tool_config(name, opts))
        elif name == "python":
            from agentenv.tools.python_sandbox import make_python_tool

            tools[name] = make_python_tool(tool_config(name, opts))
        elif name == "browse":
            from agentenv.tools.browser import make_browser_tool

            tools[name] = make_browser_tool(tool_config(name, opts), summarizer=summarizer)
    return tools


def make_env_factory(cfg: EnvConfig, tools: dict[str, Any], tokenizer: Any) -> Callable[[], Any]:
    """A zero-argument callable returning a fresh AgentEnv over the prototype tools."""
    from agentenv.envs import AgentEnv, AgentEnvConfig
    from agentenv.tasks.rewards import get_reward

    reward_fn = get_reward(cfg.reward)
    env_cfg = AgentEnvConfig(
        max_tool_calls=cfg.max_tool_calls,
        max_context_tokens=cfg.max_context_tokens,
        max_result_tokens=cfg.max_result_tokens,
        tool_timeout_s=cfg.tool_timeout_s,
    )
    prototypes = list(tools.values())

    def make_env() -> Any:
        return AgentEnv(prototypes, tokenizer, reward_fn=reward_fn, config=env_cfg)

    return make_env


def rollout_config(cfg: RunConfig) -> Any:
    """The rollout limits a run's samplers and evaluations honour: each trajectory's own
    deadline is `trainer.rollout_timeout_s` (a generation gets no more)."""
    from agentenv.rollout import RolloutConfig

    return RolloutConfig(episode_timeout_s=cfg.trainer.rollout_timeout_s)


@dataclass
class Runtime:
    """Everything a run needs besides the trainable model."""

    model_path: str
    tokenizer: Any
    policy: Any
    tools: dict[str, Any]
    tasks: TaskSet
    make_env: Callable[[], Any]
    extras: dict[str, Any] = field(default_factory=dict)

    async def aclose(self) -> None:
        from agentenv.envs.results import close_tool

        for tool in self.tools.values():
            await close_tool(tool, _CLOSE_TIMEOUT_S)
        close = getattr(self.policy, "aclose", None) or getattr(self.policy, "close", None)
        if close is not None:
            res = close()
            if hasattr(res, "__await__"):
                await res


def build_runtime(cfg: RunConfig, model_path: str | None = None) -> Runtime:
    from transformers import AutoTokenizer

    path = model_path or resolve_model_path(cfg.model.path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:  # no such hub id, no tokenizer files, offline
        raise ConfigError("model.path", f"cannot load a tokenizer from {path!r}: {first_line(e)}") from None
    tasks = build_tasks(cfg.env.tasks)
    check_prompts_fit(tasks, tokenizer, cfg.env.max_context_tokens)  # before the policy's minutes of start-up
    tools = build_tools(cfg.env, tasks)
    policy = build_policy(cfg.policy, path, cfg.model.dtype, cfg.trainer.seed)
    return Runtime(path, tokenizer, policy, tools, tasks, make_env_factory(cfg.env, tools, tokenizer))
