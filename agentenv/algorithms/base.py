"""What an algorithm plugin is made of: a sampler, an advantage estimator, a loss, token accounting."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from agentenv.envs.episode import MakeEnv
from agentenv.policies.base import Policy
from agentenv.rollout.config import RolloutConfig
from agentenv.tasks.task import Task
from agentenv.types import Group, SamplingParams, Trajectory


@dataclass
class TrainBatch:
    """Padded tensors for one micro-batch. Per-token tensors are aligned with the
    *predicted* tokens: column t describes `input_ids[:, t + 1]`, so T = L - 1.

    Attributes:
        input_ids: (B, L) token ids, right-padded.
        attention_mask: (B, L) 1 on real tokens.
        loss_mask: (B, T) 1.0 exactly on policy tokens of non-failed trajectories.
        advantages: (B, T) per-token advantages (0 where masked).
        old_logprobs: (B, T) logprobs under the weights that sampled, recomputed
            by the trainer before the update.
        sampler_logprobs: (B, T) what the policy backend reported while sampling.
        ref_logprobs: (B, T) under the reference model, when a KL penalty is on.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    sampler_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> TrainBatch:
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return TrainBatch(**moved)

    def select(self, rows: slice | torch.Tensor) -> TrainBatch:
        picked = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return TrainBatch(**picked)

    def trimmed(self) -> TrainBatch:
        """The same rows without the trailing columns that are padding in every row.

        A batch is padded to its longest trajectory; a micro-batch of shorter ones
        need not carry that width through attention. Nothing real is dropped.
        """
        L = max(2, int(self.attention_mask.sum(dim=1).max()))  # longest row
        if L == self.input_ids.shape[1]:
            return self
        cut = {}
        for k, v in self.__dict__.items():
            if not isinstance(v, torch.Tensor):
                cut[k] = v
            elif k in ("input_ids", "attention_mask"):
                cut[k] = v[:, :L]  # (B, L)
            else:
                cut[k] = v[:, : L - 1]  # (B, L - 1)
        return TrainBatch(**cut)

    def __len__(self) -> int:
        return self.input_ids.shape[0]


@dataclass(frozen=True)
class LossNorm:
    """The denominators of one mini-batch's loss, counted over all its micro-batches and processes.

    A loss divides its micro-batch's sum by these, so that the losses of a
    mini-batch's micro-batches add up (the trainer's gradient accumulation sums
    them) to the mini-batch's mean, whatever the micro-batch size. Data-parallel
    backends (DDP, FSDP) average gradients over processes, so each process
    divides by its share, count / world.

    Attributes:
        tokens: Policy tokens (the loss mask's sum) of the mini-batch.
        sequences: Its rows with at least one policy token (failed
            trajectories have none).
        world: Processes whose gradients are averaged.
    """

    tokens: float
    sequences: float
    world: int = 1

    @classmethod
    def of(cls, loss_mask: torch.Tensor) -> LossNorm:
        """The counts of one (B, T) mask on one process."""
        per_row = loss_mask.detach().sum(dim=1)  # (B,)
        return cls(tokens=float(per_row.sum()), sequences=float((per_row > 0).sum()))

    @property
    def token_denominator(self) -> float:
        return max(self.tokens, 1.0) / self.world

    @property
    def sequence_denominator(self) -> float:
        return max(self.sequences, 1.0) / self.world



# Sums a tensor over every process of the run (the identity on one process); a
# batch-level hook calls it the same number of times on every process.
Reduce = Callable[[torch.Tensor], torch.Tensor]


@runtime_checkable
class HasKLCoef(Protocol):
    """An algorithm config with a KL penalty to a reference model (`TokenLossConfig` and the configs under it;
    GSPO's fixes it at 0): `kl_coef` > 0 loads the reference model."""

    kl_coef: float


class StepRollout(Protocol):
    """What dynamic sampling may ask of the trainer in one step (`Algorithm.resample`)."""

    @property
    def rank(self) -> int:
        """This process's index."""
        ...

    @property
    def world(self) -> int:
        """The number of processes."""
        ...

    def rollout(self, tasks: list[Task], indices: list[int], round_: int) -> list[Group]:
        """This process's `tasks` rolled out in an extra sampling round: one group per task. `indices` are the
        tasks' positions in the round's global draw and `round_` the round's number from 1 (both seed the samples)."""
        ...

    def draw(self, n: int) -> list[Task]:
        """The next `n` tasks of the run's task stream (the same on every process); the step trains on them."""
        ...

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over every process (a collective: every process calls it alike)."""
        ...


@runtime_checkable
class Sampler(Protocol):
    """Grows the Group of one task (independently for GRPO, as a tree for ARPO)."""

    async def sample(
        self, policy: Policy, make_env: MakeEnv, task: Task, params: SamplingParams, seed: int
    ) -> Group: ...


class Algorithm(ABC):
    """An RL algorithm plugin, and the base of every registered one: each hook the trainer calls, with its default.

    `config_cls` is a validated dataclass; the trainer builds it from the
    `algorithm` section of the run config (minus `name`) and passes it to the
    constructor (kept as `self.cfg`). The trainer calls every hook below on
    every step, and nothing else of a plugin. Register one by name
    (`agentenv.algorithms.register`), name it as `module:attr`, or ship it in
    the `agentenv.algorithms` entry-point group. A plugin must define
    `config_cls`, `sampler`, `advantages` and `loss`; the others have
    defaults here. A plugin class that does not subclass
    `Algorithm` is given these defaults by the registry (see
    `agentenv.algorithms.as_algorithm`). The required hooks are abstract: a
    subclass that lacks one cannot be instantiated, and says which.

    Attributes:
        grows_trees: A group's trajectories share long prefixes (a tree's
            branches), which `trainer.pack_prefixes=auto` then computes once.
    """

    config_cls: ClassVar[type]
    grows_trees: ClassVar[bool] = False

    def __init__(self, cfg: Any = None):
        self.cfg = cfg if cfg is not None else self.config_cls()

    # ---------------------------------------------------------------- required
    @abstractmethod
    def sampler(self, rollout: RolloutConfig | None = None) -> Sampler:
        """A sampler for one training step, within the run's `rollout` limits (per-trajectory
        timeout, concurrency over the step's groups)."""

    @abstractmethod
    def advantages(self, group: Group) -> list[torch.Tensor]:
        """Per trajectory, a (len(trajectory),) tensor of per-token advantages."""

    @abstractmethod
    def loss(
        self, batch: TrainBatch, new_logprobs: torch.Tensor, norm: LossNorm | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch and its metrics (means over this micro-batch).

        `new_logprobs` is (B, T), with gradients. The trainer passes `norm`, the
        mini-batch's counts: divide by them (not by this micro-batch's), since the
        trainer sums the micro-batch losses of a mini-batch before each update.
        """

    # ---------------------------------------------------------------- defaults
    def generated_tokens(self, group: Group) -> int:
        """Policy tokens the sampler generated for `group`; default: `group_generated_tokens` (a shared
        prefix counts once: it reads the branch points every trajectory records)."""
        return group_generated_tokens(group)

    def group_size(self) -> int:
        """Trajectories per task (G for GRPO, M for ARPO); default: the config's `group_size`."""
        return int(self.cfg.group_size)

    def needs_reference(self) -> bool:
        """Whether the trainer loads a reference model (its logprobs land in `batch.ref_logprobs`);
        default: the config's `kl_coef` is above 0 (a config without one, not `HasKLCoef`: no)."""
        return isinstance(self.cfg, HasKLCoef) and self.cfg.kl_coef > 0

    def keep_group(self, group: Group) -> bool:
        """Dynamic sampling's group filter (DAPO); default: every group is kept."""
        return True

    def max_resample_rounds(self) -> int:
        """Extra rounds of sampling per step for groups that `keep_group` rejects; default 0."""
        return 0

    def resample(self, groups: list[Group], rollout: StepRollout) -> tuple[list[Group], dict[str, float]]:
        """The step's groups after dynamic sampling, and its metrics (logged as they are).

        The trainer calls it once per step on every process with this process's
        groups and the step's `rollout` (extra rounds, the task stream, the sum
        over processes). Default: `groups` as they are, no metrics. An algorithm
        with a group filter returns `DynamicSampling(...).refill(groups, rollout)`
        (`agentenv.algorithms.dynamic_sampling`), which keeps the processes in lockstep.
        """
        return groups, {}

    def finalize(self, batch: TrainBatch, trajectories: Sequence[Trajectory], reduce: Reduce) -> dict[str, float]:
        """The batch-level step, for what a group cannot decide alone; default: nothing, no metrics.

        The trainer calls it once per step on every process, after the old (and
        reference) logprobs are in `batch` and before any update; row i of `batch`
        is `trajectories[i]`. It may rewrite `batch.advantages` and `batch.loss_mask`
        in place (a token whose mask it zeroes leaves the loss and its normalizer),
        e.g. a KL penalty folded into the return, advantages normalized over the
        global batch with `reduce` (called the same number of times on every
        process), or trajectories filtered out. It returns metrics (means,
        logged under `train/`).
        """
        return {}

    def rollout_metrics(self, groups: Sequence[Group], reduce: Reduce) -> dict[str, float]:
        """What the sampler did this step, logged as they are (ARPO: its trees' branches and ΔH); default: none.

        The trainer calls it once per step on every process with this process's
        groups; `reduce` sums a tensor over processes (call it the same number of
        times on every process).
        """
        return {}


def generated_tokens(traj: Trajectory) -> int:
    """Policy tokens this trajectory generated itself (those before `branch_token` are copies)."""
    start = traj.branch_token if traj.parent_uid is not None and traj.branch_token is not None else 0
    n, pos = 0, 0
    for seg in traj.segments:
        if seg.source == "policy":
            n += max(0, pos + len(seg) - max(pos, start))
        pos += len(seg)
    return n


def own_tool_results(traj: Trajectory) -> int:
    """Tool results (one per call the env answered, malformed calls and limit messages included) this
    trajectory got itself.

    A branch's results before `branch_token` were its parent's: a tree pays
    for each call once. The tool-call budget that the ARPO paper compares.
    """
    start = traj.branch_token if traj.parent_uid is not None and traj.branch_token is not None else 0
    n, pos = 0, 0
    for seg in traj.segments:
        n += seg.source == "tool" and pos >= start
        pos += len(seg)
    return n


def group_generated_tokens(group: Group) -> int:
    """Policy tokens generated for a group, each shared prefix counted once (independent groups too)."""
    return sum(generated_tokens(t) for t in group.trajectories)
