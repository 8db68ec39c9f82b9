"""`agentenv sft`: cold-start SFT on tool-use conversations, with the RL trainer's tokens, mask and checkpoints.

The examples are trajectories (`agentenv.training.sft_data`: each conversation
replayed through the run's env), batched by the RL trainer's `collate`, so
the loss mask is the RL loss mask, token for token. The loss is the mean
negative log-likelihood of the policy tokens (`nll_loss`). Checkpoints are the
RL trainer's (`agentenv.training.checkpoint`: staged, manifest, atomic rename;
`--resume` continues from the newest intact one), and the last one is exported
to `sft.output_dir/model`, a transformers folder that `model.path` of the RL
stage names.

Why not TRL's `SFTTrainer`: it would take pre-tokenized `input_ids` with a
`completion_mask`, but it is a second training loop, with its own checkpoint
layout, resume and metrics; this loop is the RL trainer's parts (collate,
scoring, schedule, checkpoints, sharding) around one pure loss.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentenv.configs import RunConfig
from agentenv.errors import ConfigError
from agentenv.policies.models import resolve_model_path
from agentenv.registry import load_import_path
from agentenv.training import checkpoint as ckpt
from agentenv.training import sharding
from agentenv.training.batching import chunks, collate
from agentenv.training.build import build_tools, check_output_dir, first_line
from agentenv.training.data import TaskStream
from agentenv.training.metrics import MetricsLogger
from agentenv.training.packing import packing_enabled
from agentenv.training.schedule import adamw
from agentenv.training.scoring import token_logprobs
from agentenv.training.sft_data import SFTExamples, read_conversations, replay_all, solve_tasks
from agentenv.types import Trajectory

MODEL_EXPORT = "model"
"""The exported model's folder inside `sft.output_dir`."""


def nll_loss(logprobs: torch.Tensor, loss_mask: torch.Tensor, n_tokens: float) -> torch.Tensor:
    """Negative log-likelihood of the policy tokens, summed and divided by `n_tokens`.

    Args:
        logprobs: (B, T) log-probability of each predicted token.
        loss_mask: (B, T) 1 where the predicted token is the policy's.
        n_tokens: Policy tokens of the whole batch (over every micro-batch), so the
            micro-batch losses add up to the batch's token mean.
    """
    return -(logprobs * loss_mask).sum() / max(n_tokens, 1.0)


def sft_batch(trajectories: list[Trajectory], pad_id: int) -> Any:
    """The RL trainer's batch of these trajectories (advantages 0): `input_ids`, `attention_mask`, `loss_mask`."""
    return collate(trajectories, [torch.zeros(len(t)) for t in trajectories], pad_id)


def check_replayable(cfg: RunConfig) -> None:
    """SFT replays each conversation through an episode env of `env.class`: refuse a client env, which has none.

    Raises:
        ConfigError: (`env.class`) It names a client env (`verifiers`), which runs against the endpoint.
    """
    if cfg.env.env_spec().drives_client:
        raise ConfigError("env.class", f"{cfg.env.env_class!r} runs its own protocol against the endpoint, so agentenv "
                          "sft cannot replay conversations through it; use an episode env (e.g. agent)")  # fmt: skip


def build_examples(cfg: RunConfig, tokenizer: Any) -> tuple[SFTExamples, float]:
    """The SFT examples of `cfg.sft` (replayed through `cfg.env`), and the seconds it took.

    Raises:
        ConfigError: No data and no solver, a solver that does not import, no conversation survived, or a
            client env (`check_replayable`).
    """
    from agentenv.envs.parts import EnvInputs, build_env

    check_replayable(cfg)  # before the tools start
    sc = cfg.sft
    t0 = time.perf_counter()
    tools = build_tools(cfg.env)
    reward_fn = cfg.env.reward_fn()
    spec = cfg.env.env_spec()

    def make_env(prototypes: Any) -> Any:
        return build_env(spec, EnvInputs(cfg.env, spec.options, tuple(prototypes), tokenizer, reward_fn))

    params = cfg.policy.sampling_params()

    async def go() -> SFTExamples:
        from agentenv.envs.results import close_tool

        try:
            if sc.data is not None:
                convs = read_conversations(sc.data, sc.examples)
                return await replay_all(convs, make_env, tools, tokenizer, params, require_correct=False)
            if sc.solver is None:
                raise ConfigError("sft.data", "give a file of conversations (sft.data) or a scripted solver (sft.solver)")
            solver = load_import_path(sc.solver, "sft.solver", "solver")
            tasks = cfg.env.tasks.load().train
            # a few more than asked for: a solver's trace that the tools or the reward reject is dropped
            convs = solve_tasks(solver, tasks, tools, cfg.env.tool_format, sc.solver_options, sc.examples * 5 // 4 + 4)
            got = await replay_all(convs, make_env, tools, tokenizer, params, require_correct=True)
            got.trajectories = got.trajectories[: sc.examples]
            return got
        finally:
            for tool in tools.values():
                await close_tool(tool, 120.0)

    examples = asyncio.run(go())
    if not examples.trajectories:
        raise ConfigError("sft.data", f"no conversation could be replayed as an example (dropped: {examples.dropped})")
    return examples, time.perf_counter() - t0


@dataclass
class SFTResult:
    steps: int
    output_dir: Path
    model_dir: Path
    metrics: dict[str, float]


class SFTTrainer:
    """Cold-start SFT of `cfg.model` on `cfg.sft` (see the module docstring).

    Args:
        cfg: The run config (its `sft`, `model`, `env`, `policy`, `logging` sections).
        resume: Continue from the newest intact checkpoint in `sft.output_dir`.
        examples: Prebuilt examples (built from `cfg.sft` if None).
        log: Where progress lines go.
    """

    def __init__(self, cfg: RunConfig, *, resume: bool = False, examples: SFTExamples | None = None,
                 log: Any = None):  # fmt: skip
        if examples is None:
            check_replayable(cfg)  # before the output folder and the model's load
        from accelerate import Accelerator
        from accelerate.utils import set_seed
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        sc = cfg.sft
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.acc = Accelerator(cpu=not torch.cuda.is_available())
        if self.acc.num_processes != 1:
            raise ConfigError("sft", "runs in one process (launch it without torchrun/accelerate launch)")
        set_seed(cfg.trainer.seed)
        self.out = Path(sc.output_dir)
        check_output_dir(self.out)
        self.model_path = resolve_model_path(cfg.model.path)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, cfg.model.dtype))
        except (OSError, ValueError) as e:
            raise ConfigError("model.path", f"cannot load a model from {self.model_path!r}: {first_line(e)}") from None
        self.examples = examples
        self.data_s = 0.0
        if self.examples is None:
            self.examples, self.data_s = build_examples(cfg, self.tokenizer)
        self.trajs = self.examples.trajectories
        n = len(self.trajs)
        self.steps = sc.steps or max(1, math.ceil(sc.epochs * n / sc.batch_size))
        self.stream = TaskStream(list(range(n)), seed=cfg.trainer.seed)
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        # every conversation starts with the system prompt and the tools' schemas: computed once per micro-batch
        self.pack = packing_enabled(cfg.trainer.pack_prefixes, model, trees=True)
        self.strategy = sharding.Strategy(self.acc, "ddp", cfg.model.lora)
        self.model, self.opt, self.sched = self.strategy.prepare(model, *adamw(sc, self.steps))
        tok = self.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        self.checkpointer = ckpt.Checkpointer(self.out, self.acc, self.strategy, self.model, self.opt, self.tokenizer,
                                              sc.keep_checkpoints, say=lambda line: self.log(f"[sft] {line}"))  # fmt: skip
        self.start_step = 0
        if resume:
            chosen, state, _ = self.checkpointer.resume(lambda state: self.stream.load_state_dict(state["stream"]))
            if chosen is not None:
                self.start_step = int(state["step"])
                self.log(f"[sft] resumed from {chosen} (step {self.start_step})")
        purge = (self.start_step + 1 if self.start_step else 0) if resume else None
        self.logger = MetricsLogger(self.out, cfg.logging, cfg.to_dict(), purge)
        (self.out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))

    def step(self) -> dict[str, float]:
        """One optimizer step on the next `sft.batch_size` examples."""
        sc = self.cfg.sft
        t0 = time.perf_counter()
        rows = [self.trajs[i] for i in self.stream.next_batch(min(sc.batch_size, len(self.trajs)))]
        batch = sft_batch(rows, self.pad_id)
        n_tokens = float(batch.loss_mask.sum())
        self.model.train()
        total = 0.0
        for s in chunks(len(batch), sc.micro_batch_size):
            part = batch.select(s).trimmed().to(self.acc.device)
            lp = token_logprobs(self.model, part.input_ids, part.attention_mask, 1.0, pack=self.pack)  # (b, t)
            loss = nll_loss(lp, part.loss_mask, n_tokens)
            self.acc.backward(loss)
            total += float(loss.detach())
        grad_norm = self.strategy.clip_grad_norm_(self.model, sc.max_grad_norm)
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        return {
            "sft/loss": total,
            "sft/policy_tokens": n_tokens,
            "sft/tokens": float(batch.attention_mask.sum()),
            "sft/grad_norm": float(grad_norm),
            "sft/skipped_updates": float(skipped),
            "sft/lr": float(self.sched.get_last_lr()[0]),
            "time/step_s": time.perf_counter() - t0,
        }

    def save(self, step: int) -> Path:
        """The RL trainer's checkpoint of `step` (staged, manifest, renamed into place)."""
        return self.checkpointer.save(step, lambda: {"stream": self.stream.state_dict()})

    def train(self) -> SFTResult:
        from agentenv.training.export import export

        sc = self.cfg.sft
        t0 = time.perf_counter()
        last: dict[str, float] = {}
        self.log(f"[sft] {len(self.trajs)} examples (dropped: {self.examples.dropped if self.examples else {}}), "
                 f"{sum(t.num_policy_tokens for t in self.trajs)} policy tokens; {self.steps} steps")  # fmt: skip
        try:
            for step in range(self.start_step, self.steps):
                last = self.step()
                done = step + 1
                self.logger.log(done, last)
                if done % 10 == 0 or done == self.steps or done == self.start_step + 1:
                    self.log(f"[sft] step {done}/{self.steps} loss {last['sft/loss']:.4f} "
                             f"lr {last['sft/lr']:.2e} {last['time/step_s']:.1f} s")  # fmt: skip
                if done % sc.checkpoint_every == 0 or done == self.steps:
                    self.save(done)
        finally:
            self.logger.close()
        model_dir = self.out / MODEL_EXPORT
        if model_dir.exists():  # a finished run's export, or one resumed past its end: replace it
            import shutil

            shutil.rmtree(model_dir)
        export(self.out, model_dir)
        summary = {"train_s": round(time.perf_counter() - t0, 1), "data_s": round(self.data_s, 1),
                   "examples": len(self.trajs), **last}  # fmt: skip
        (self.out / "sft.json").write_text(json.dumps(summary, indent=1))
        return SFTResult(self.steps, self.out, model_dir, summary)
