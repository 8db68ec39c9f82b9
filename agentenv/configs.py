"""Run configs: YAML -> typed, validated dataclasses.

One section per part, and each section is that part's own config class:
`model`, `policy` (`agentenv.policies.config.PolicyConfig`, with each backend's
settings built as the backend's class), `env` (`agentenv.envs.config.AgentEnvConfig`),
`rollout` (`agentenv.rollout.RolloutConfig`), `algorithm` (the plugin's class),
`trainer`, `logging`, `sft` (the cold-start SFT of `agentenv sft`). A default lives in one place. Every error names the dotted
key and the bad value. Overrides use dotted keys:
`agentenv train configs/toy_arpo.yaml algorithm.forks_per_branch=3`.
Configs are never mutated after parsing.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from agentenv.envs.config import AgentEnvConfig
from agentenv.errors import ConfigError
from agentenv.loader import apply_overrides, build_dataclass, check_number, dump_dataclass, rest_field
from agentenv.policies.backends import BoundsContext
from agentenv.policies.config import PolicyConfig
from agentenv.rollout.config import RolloutConfig
from agentenv.tools.base import ForkLimited


# --------------------------------------------------------------------------- sections
@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021, through PEFT): only the adapters train.

    Attributes:
        r: Rank of each adapter; 0 turns LoRA off (every weight trains).
        alpha: Scale numerator: an adapter adds `alpha / r * B @ A` to its weight.
        dropout: Dropout on the adapters' input while training.
        target_modules: Names of the linear layers that get adapters (PEFT's
            `target_modules`; the default is every projection of a Qwen2/Llama block).
    """

    r: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __post_init__(self) -> None:
        check_number("model.lora.r", self.r, low_ok=True, integer=True)
        check_number("model.lora.alpha", self.alpha)
        check_number("model.lora.dropout", self.dropout, low_ok=True)
        if self.dropout >= 1.0:
            raise ConfigError("model.lora.dropout", f"must be below 1, got {self.dropout!r}")
        if self.enabled and not self.target_modules:
            raise ConfigError("model.lora.target_modules", "must name at least one layer when model.lora.r > 0, got []")

    @property
    def enabled(self) -> bool:
        return self.r > 0


@dataclass(frozen=True)
class ModelConfig:
    """The model that is trained.

    Attributes:
        path: A local Hugging Face model folder, a hub id, or a registered
            model name: `tiny`, the embedded default model, built offline on
            first use (see `agentenv.policies.models`).
        dtype: Training dtype of the weights.
        gradient_checkpointing: Trade compute for memory on long contexts.
        lora: Train low-rank adapters instead of every weight (`r: 0`, the default, is off).
    """

    path: str = "tiny"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    gradient_checkpointing: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        if not self.path.strip():
            raise ConfigError("model.path", "must name a model: `tiny`, a local model folder or a hub id, got ''")


@dataclass(frozen=True)
class AlgorithmSection:
    """`algorithm:` selects a plugin by `name` (registered, or `module:attr`); its other keys go to its config class."""

    name: str = "grpo"
    params: Mapping[str, Any] = rest_field()

    def build(self) -> Any:
        """The plugin's validated config dataclass (a new one; `config` is the section's own, built once)."""
        from agentenv.algorithms import get_algorithm

        cls = get_algorithm(self.name).config_cls
        return build_dataclass(cls, dict(self.params), "algorithm")

    @functools.cached_property
    def config(self) -> Any:
        """The plugin's validated config dataclass, built once from the frozen fields (equal to `build()`)."""
        return self.build()


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer, its learning-rate schedule and the checkpoints: what the RL trainer (`trainer`) and the
    cold-start SFT (`sft`) share, each section with its own defaults.

    Attributes:
        lr: AdamW learning rate.
        warmup_steps: Linear warmup in optimizer updates.
        lr_schedule: After warmup, `constant` or `cosine`: decay along half a
            cosine to `lr * min_lr_ratio` at the last update.
        min_lr_ratio: Where `cosine` ends, as a fraction of `lr` (in [0, 1]).
        weight_decay: AdamW weight decay.
        max_grad_norm: Gradient clipping norm.
        output_dir: Where checkpoints and metrics go.
        checkpoint_every: Save every N steps (and at the end).
        keep_checkpoints: How many recent checkpoints to keep.
    """

    section: ClassVar[str] = "trainer"  # the section's key, in errors

    lr: float = 1e-6
    warmup_steps: int = 0
    lr_schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    output_dir: str = "runs/default"
    checkpoint_every: int = 5
    keep_checkpoints: int = 2

    def __post_init__(self) -> None:
        at = self.section
        for key in ("checkpoint_every", "keep_checkpoints"):
            check_number(f"{at}.{key}", getattr(self, key), low=1, low_ok=True, integer=True)
        check_number(f"{at}.warmup_steps", self.warmup_steps, low_ok=True, integer=True)
        check_number(f"{at}.lr", self.lr)
        check_number(f"{at}.min_lr_ratio", self.min_lr_ratio, low_ok=True)
        if self.min_lr_ratio > 1:
            raise ConfigError(f"{at}.min_lr_ratio", f"must be in [0, 1] (a fraction of {at}.lr), got {self.min_lr_ratio}")
        # <= 0 would flip the clipped gradient's sign (gradient ascent) or zero it
        check_number(f"{at}.max_grad_norm", self.max_grad_norm)
        check_number(f"{at}.weight_decay", self.weight_decay, low_ok=True)
        if not self.output_dir.strip():
            raise ConfigError(f"{at}.output_dir", "must name a folder, got ''")


@dataclass(frozen=True)
class TrainerConfig(OptimizerConfig):
    """The training loop; the optimizer, its schedule and the checkpoints are `OptimizerConfig`'s fields.

    Attributes:
        steps: Optimizer steps of the outer loop (one rollout batch each).
        tasks_per_step: Tasks per rollout batch, over all processes (the ARPO
            paper: batch 128).
        mini_batch_tasks: Tasks per PPO mini-batch (one optimizer update each;
            the paper: 16). Must divide tasks_per_step.
        micro_batch_size: Trajectories per forward/backward (gradient accumulation fills the mini-batch).
        ppo_epochs: Passes over each rollout batch.
        lr: AdamW learning rate (the paper: 1e-6 for 7B models).
        lr_schedule: `constant` (the paper) or `cosine`, which ends at the last
            update (`steps * ppo_epochs * tasks_per_step / mini_batch_tasks` updates).
        seed: Run seed; tasks, rollouts and init all derive from it.
        output_dir: Where checkpoints, metrics and TensorBoard logs go.
        eval_every: Evaluate on held-out tasks every N steps (0: only at the end).
        eval_tasks: Held-out tasks per evaluation.
        eval_samples: Samples per held-out task (k of pass@k).
        eval_temperature: Sampling temperature of evaluation (0: greedy).
        eval_greedy: Also evaluate the final model greedily (temperature 0),
            when `eval_temperature` samples: `eval.json` holds that report under
            `greedy`, the metrics log it as `eval_greedy/*`. A sampled
            evaluation is one draw; a greedy one is the policy's mode.
        eval_seed: Seed of the evaluation's samples (None: `seed`). Fixed, runs
            of different seeds score with the same per-request sampling seeds, so
            their evaluations differ by what training did (and, on vLLM, by
            batch-dependent numerics).
        strategy: How the trained model is spread over the processes: `ddp`
            (each process holds all of it; gradients are all-reduced) or `fsdp2`
            (parameters, gradients and optimizer state are sharded with
            PyTorch's `fully_shard`, one unit per decoder layer; checkpoints are
            sharded too). With one process `ddp` is plain training. Launch with
            `torchrun` or `accelerate launch` and a plain multi-process
            Accelerate config: sharding is this key's job, not Accelerate's.
        max_failed_steps: Stop the run (with an error saying why) after this
            many consecutive steps in which every trajectory failed.
        nonfinite_patience: Stop the run after this many consecutive steps
            whose loss or gradient norm was not finite (their updates are
            skipped); weights that stop being finite stop it at once.
        pack_prefixes: Compute the prefixes that a micro-batch's trajectories
            share (an ARPO tree's branches, a group's prompt) once in the
            old-logprob recompute and the update (`agentenv.training.packing`;
            the same logprobs and gradients). `auto`: for algorithms that grow
            trees (ARPO), where the model's attention takes a 4D mask (eager,
            sdpa; not FlashAttention); `on`: always (an error where it cannot);
            `off`: never.
        max_staleness: eta, how many weight versions rollout may run ahead of
            the trainer (`agentenv.training.async_rollout`, docs/training/async.md).
            0: the synchronous loop (a step rolls out, then updates). eta >= 1:
            groups for the next steps roll out while the trainer updates; a
            step trains on the next `tasks_per_step` finished groups, and a
            group whose oldest token is more than eta versions behind the
            trainer is dropped and its task requeued. Pair it with an off-policy
            correction (`algorithm.off_policy: decoupled` or `algorithm.rollout_correction`).
    """

    steps: int = 20
    tasks_per_step: int = 8
    mini_batch_tasks: int = 8
    micro_batch_size: int = 16
    ppo_epochs: int = 1
    seed: int = 0
    eval_every: int = 0
    eval_tasks: int = 64
    eval_samples: int = 1
    eval_temperature: float = 0.0
    eval_greedy: bool = False
    eval_seed: int | None = None
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    max_failed_steps: int = 3
    nonfinite_patience: int = 3
    pack_prefixes: Literal["auto", "on", "off"] = "auto"
    max_staleness: int = 0

    def __post_init__(self) -> None:
        for key in ("steps", "tasks_per_step", "mini_batch_tasks", "micro_batch_size", "ppo_epochs", "eval_samples",
                    "max_failed_steps", "nonfinite_patience"):
            check_number(f"trainer.{key}", getattr(self, key), low=1, low_ok=True, integer=True)
        for key in ("eval_every", "eval_tasks", "max_staleness"):
            check_number(f"trainer.{key}", getattr(self, key), low_ok=True, integer=True)
        if self.tasks_per_step % self.mini_batch_tasks:
            raise ConfigError(
                "trainer.mini_batch_tasks",
                f"{self.mini_batch_tasks} must divide trainer.tasks_per_step {self.tasks_per_step}",
            )
        super().__post_init__()
        check_number("trainer.eval_temperature", self.eval_temperature, low_ok=True)

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
        save_rollouts: Keep a bounded record of sampled groups in
            `<trainer.output_dir>/rollouts/` (tokens, text, masks, per-token
            logprob, entropy and version, tool calls, rewards, advantages, ARPO
            trees) for `agentenv view` (`agentenv.training.rollout_log`).
        rollouts_every: Record a training step's groups every N steps.
        rollouts_groups: Groups recorded per recorded step (0: all of them).
        rollouts_eval_groups: Groups recorded per evaluation (0: all of them).
        rollouts_max_mb: Stop recording once `rollouts/` holds this many MB (the
            metrics go on; the viewer says where the record stops).
    """

    jsonl: bool = True
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "agentenv"
    progress: bool = True
    verbose: bool = False
    save_rollouts: bool = True
    rollouts_every: int = 1
    rollouts_groups: int = 4
    rollouts_eval_groups: int = 32
    rollouts_max_mb: float = 256.0

    def __post_init__(self) -> None:
        check_number("logging.rollouts_every", self.rollouts_every, low=1, low_ok=True, integer=True)
        for key in ("rollouts_groups", "rollouts_eval_groups"):
            check_number(f"logging.{key}", getattr(self, key), low_ok=True, integer=True)
        check_number("logging.rollouts_max_mb", self.rollouts_max_mb)


@dataclass(frozen=True)
class SFTConfig(OptimizerConfig):
    """Cold-start SFT (`agentenv sft CONFIG`): supervised fine-tuning on tool-use conversations, before RL.

    Each conversation is replayed through the run's env (`env`: its tools'
    schemas, tool-call format and chat template), so its tokens and loss mask
    are those of an RL trajectory: the policy's turns trained, prompt and tool
    results masked. The loss is the mean negative log-likelihood of the policy
    tokens of a batch.

    Attributes:
        data: A JSONL or parquet file of conversations (`{"messages": [...]}` per
            record: system and user, then assistant turns, each call answered by a
            `tool` message whose content is replayed as the result). None: `solver`.
        solver: `module:attr` of a scripted solver, `solver(task, tools, tool_format,
            **solver_options) -> list[str] | None`: the assistant turns that solve a
            training task of `env.tasks`; the env's real tools answer the calls.
        solver_options: Keyword arguments of the solver.
        examples: Conversations to train on (the first ones; with `solver`, of the
            training tasks that it solves correctly).
        epochs: Passes over the conversations (when `steps` is 0).
        steps: Optimizer steps (0: `epochs` passes).
        batch_size: Conversations per optimizer step.
        micro_batch_size: Conversations per forward/backward.
        output_dir: Checkpoints (the RL trainer's layout), `metrics.jsonl`, and the
            exported model in `model/` (what `model.path` of the RL stage names).

    The optimizer, its schedule and the checkpoints are `OptimizerConfig`'s fields
    (an optimizer update is an SFT step).
    """

    section: ClassVar[str] = "sft"

    data: str | None = None
    solver: str | None = None
    solver_options: Mapping[str, Any] = field(default_factory=dict)
    examples: int = 256
    epochs: int = 1
    steps: int = 0
    batch_size: int = 8
    micro_batch_size: int = 4
    lr: float = 1e-5
    output_dir: str = "runs/sft"
    checkpoint_every: int = 50
    keep_checkpoints: int = 1

    def __post_init__(self) -> None:
        for key in ("examples", "epochs", "batch_size", "micro_batch_size"):
            check_number(f"sft.{key}", getattr(self, key), low=1, low_ok=True, integer=True)
        check_number("sft.steps", self.steps, low_ok=True, integer=True)
        super().__post_init__()
        if self.data is not None and self.solver is not None:
            raise ConfigError("sft.data", f"give a file of conversations or sft.solver ({self.solver!r}), not both")
        if self.data is not None and not str(self.data).endswith((".jsonl", ".json", ".parquet")):
            raise ConfigError("sft.data", f"must be a .jsonl or .parquet file of conversations, got {self.data!r}")
        if not isinstance(self.solver_options, Mapping):
            raise ConfigError("sft.solver_options", f"expected a mapping, got {self.solver_options!r}")
        object.__setattr__(self, "solver_options", dict(self.solver_options))


@dataclass(frozen=True)
class RunConfig:
    """A whole run: one section per part, each the part's own config class."""

    model: ModelConfig = field(default_factory=ModelConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    env: AgentEnvConfig = field(default_factory=AgentEnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)

    def __post_init__(self) -> None:
        # Validate every named part now, so a typo or a bad option fails at load time.
        self.algorithm.config  # noqa: B018 - built (and so validated) now, once
        self.env.validate_parts()
        backends = self.policy.backend_configs(model=self.model.path, dtype=self.model.dtype, seed=self.trainer.seed)
        if self.policy.max_turn_tokens >= self.env.max_context_tokens:
            raise ConfigError(
                "policy.max_turn_tokens",
                f"{self.policy.max_turn_tokens} must be below env.max_context_tokens {self.env.max_context_tokens}",
            )
        backend = backends[self.policy.backend]
        model_len = backend.max_model_len if isinstance(backend, BoundsContext) else None
        if isinstance(model_len, int) and model_len < self.env.max_context_tokens:
            # Every episode whose context grows past the model's length would fail (a run of failed trajectories).
            raise ConfigError(
                f"policy.{self.policy.backend}.max_model_len",
                f"{model_len} is below env.max_context_tokens {self.env.max_context_tokens}: the policy must read "
                f"an episode's whole context; raise it to at least {self.env.max_context_tokens} or lower "
                "env.max_context_tokens",
            )
        if self.rollout.agent is not None:
            _check_agent(self)
            if self.env.env_spec().drives_client:
                raise ConfigError("rollout.agent", f"env.class {self.env.env_class!r} runs its own protocol against "
                                  "the endpoint; give either it or rollout.agent, not both")  # fmt: skip
        _check_forks(self)
        if self.rollout.placement == "ray":
            if self.env.env_spec().drives_client:
                raise ConfigError("rollout.placement", f"ray does not serve env.class {self.env.env_class!r} yet (it "
                                  "runs against the endpoint, which wraps a local policy); use local")  # fmt: skip
            for name in self.rollout.ray.tools:
                if name not in self.env.tools:
                    raise ConfigError(
                        f"rollout.ray.tools.{name}", f"names no tool of env.tools ({', '.join(self.env.tools) or 'none'})"
                    )

    # The algorithm's config is built once, at load (`AlgorithmSection.config`, cached beside the frozen
    # fields: `==` and `dataclasses.replace` see only the fields). The backend's is built on demand: the build
    # is cheap, pure and already validated above, so every call gives an equal value.

    @property
    def algorithm_config(self) -> Any:
        """The algorithm plugin's validated config."""
        return self.algorithm.config

    @property
    def backend_config(self) -> Any:
        """The chosen policy backend's validated settings (`model` is still `model.path`, unresolved)."""
        return self.policy.backend_config(
            self.policy.backend, model=self.model.path, dtype=self.model.dtype, seed=self.trainer.seed
        )

    def to_dict(self) -> dict[str, Any]:
        """The plain mapping `config_from_dict` reads back into an equal config."""
        return dump_dataclass(self)


def _check_agent(cfg: RunConfig) -> None:
    """`rollout.agent`: it imports as an async function, and the algorithm samples independently."""
    from agentenv.algorithms import get_algorithm
    from agentenv.rollout.endpoint.agent import TREE_REFUSAL, load_agent

    load_agent(cfg.rollout.agent)  # type: ignore[arg-type]  # set: the caller checks only when rollout.agent is
    if get_algorithm(cfg.algorithm.name).grows_trees:
        raise ConfigError("rollout.agent", f"cannot train with algorithm {cfg.algorithm.name!r}: {TREE_REFUSAL}")


def _check_forks(cfg: RunConfig) -> None:
    """A tree sampler forks episodes mid-way: refuse tools whose config says they cannot follow (`unforkable()`)."""
    from agentenv.algorithms import get_algorithm

    if not get_algorithm(cfg.algorithm.name).grows_trees:
        return
    spec = cfg.env.env_spec()
    if not spec.can_fork:
        raise ConfigError("env.class", f"env class {spec.name!r} ({spec.cls.__module__}.{spec.cls.__qualname__}) "
                          f"cannot fork an episode (can_fork is False), and algorithm {cfg.algorithm.name!r} forks "
                          "episodes at branch points; use an independent-sampler algorithm (grpo, dapo, rloo, ...)")  # fmt: skip
    for name, (_, tool_cfg) in cfg.env.tool_parts().items():
        for key, why in (tool_cfg.unforkable() if isinstance(tool_cfg, ForkLimited) else {}).items():
            raise ConfigError(f"env.tools.{name}.{key}", f"{why}, and algorithm {cfg.algorithm.name!r} forks "
                              "episodes at branch points; use an independent-sampler algorithm (grpo, ...) or a "
                              "stateless server")  # fmt: skip


# --------------------------------------------------------------------------- loading
_MOVED = {
    ("trainer", "rollout_timeout_s"): "rollout.episode_timeout_s (the limit of one trajectory)",
    ("policy", "max_batch_size"): "policy.hf.max_batch_size",
    ("policy", "gpu_memory_utilization"): "policy.vllm.gpu_memory_utilization",
    ("policy", "tensor_parallel_size"): "policy.vllm.tensor_parallel_size",
    ("policy", "max_model_len"): "policy.vllm.max_model_len (or policy.hf.max_model_len)",
    ("policy", "entropy_mode"): "policy.vllm.entropy_mode",
    ("policy", "entropy_topk"): "policy.vllm.entropy_topk",
    ("policy", "enforce_eager"): "policy.vllm.enforce_eager",
}
"""Keys an older config may still carry, and where they live now."""


def _check_moved(raw: Mapping[str, Any]) -> None:
    for (section, key), where in _MOVED.items():
        if isinstance(raw.get(section), Mapping) and key in raw[section]:
            raise ConfigError(f"{section}.{key}", f"moved: set {where}")
    env = raw.get("env")
    if isinstance(env, Mapping):
        from agentenv.tools.registry import TOOLS

        for key in env:
            if key not in AgentEnvConfig.__dataclass_fields__ and key in TOOLS:
                raise ConfigError(
                    f"env.{key}", f"moved: a tool's options go under env.tools.{key} (e.g. env.tools.{key}.<option>)"
                )


def config_from_dict(raw: dict[str, Any], overrides: list[str] | None = None) -> RunConfig:
    """Build a RunConfig from its sections and dotted overrides, validating every part."""
    raw = apply_overrides(raw or {}, list(overrides or []))
    _check_moved(raw)
    return build_dataclass(RunConfig, raw, "")


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
