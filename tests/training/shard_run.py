"""Run under torchrun (or alone): a sharded or LoRA run, checked from inside, for tests/training/test_sharding.py.

    shard_run.py CONFIG OUT first   train; after checkpoint 1 record what the run holds, then wait to be killed
    shard_run.py CONFIG OUT resume  resume from the newest checkpoint, record what was loaded, train to the end

Each rank writes OUT/<phase>.rank<r>.pt: the gathered weights, the gathered optimizer state, the
rollout policy's weights and its greedy logprobs of a fixed prompt before and after the step, and
the trainer's own logprobs of those tokens.
"""

import sys
import time
from pathlib import Path

import torch
import yaml

from agentenv.configs import config_from_dict
from agentenv.training import sharding
from agentenv.training.scoring import sequence_logprobs
from agentenv.training.trainer import Trainer
from agentenv.types import SamplingParams


def gathered_optimizer(trainer: Trainer) -> dict:
    """The full optimizer state by parameter name (collective under fsdp2)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opt = getattr(trainer.opt, "optimizer", trainer.opt)
    model = trainer.model
    if trainer.strategy.sharded:
        osd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, ignore_frozen_params=True))
        return {k: {n: v.clone() for n, v in s.items()} for k, s in osd["state"].items()}
    names = [n for n, p in trainer.unwrapped().named_parameters() if p.requires_grad]
    return {names[i]: {n: v.clone() for n, v in s.items()} for i, s in enumerate(opt.state_dict()["state"].values())}


def greedy(trainer: Trainer, prompt: list[int]) -> tuple[list[int], list[float]]:
    gen = trainer.rt.policy.generate_sync(prompt, SamplingParams(max_tokens=8, temperature=0.0, seed=0))
    return list(gen.token_ids), list(gen.logprobs)


def trainer_logprobs(trainer: Trainer, ids: list[int]) -> torch.Tensor:
    """The trained model's logprobs of `ids` (a forward through the sharded model: collective)."""
    trainer.model.eval()
    with torch.no_grad():
        lp, _ = sequence_logprobs(trainer.unwrapped(), torch.tensor([ids], device=trainer.acc.device))
    return lp[0].float().cpu()


def snapshot(trainer: Trainer) -> dict:
    weights = {n: t.detach().cpu().clone() for n, t in sharding.full_weights(trainer.unwrapped())}
    policy = {n: t.detach().cpu().clone() for n, t in trainer.rt.policy.model.state_dict().items()}
    devices = {"trainer": str(trainer.acc.device), "policy": str(next(trainer.rt.policy.model.parameters()).device)}
    return {"weights": weights, "policy": policy, "optimizer": gathered_optimizer(trainer), "devices": devices}


class Recording(Trainer):
    """Records the run after its checkpoint 1 (first phase), then waits for the test to kill it."""

    phase = "first"
    record_dir: Path
    prompt: list[int]
    before: tuple[list[int], list[float]]
    record: dict

    def save(self, step: int) -> Path:
        path = super().save(step)
        if self.phase == "resume" and step == self.cfg.trainer.steps:
            probe = self.prompt + greedy(self, self.prompt)[0]
            self.record |= {"probe": probe, "final_lp": trainer_logprobs(self, probe)}
        if self.phase == "first" and step == 1:
            rank = self.acc.process_index
            tokens, lps = greedy(self, self.prompt)
            rec = snapshot(self) | {
                "before": self.before, "after": (tokens, lps),
                "trainer_lp": trainer_logprobs(self, self.prompt + tokens)[len(self.prompt) - 1 :],
                "next_batch": [t.id for t in self.stream.peek(self.cfg.trainer.tasks_per_step)],
            }  # fmt: skip
            torch.save(rec, self.record_dir / f"first.rank{rank}.pt")
            self.acc.wait_for_everyone()
            if rank == 0:
                (self.record_dir / "killme").write_text("ok")
            time.sleep(600)  # the test kills the run here, between checkpoint 1 and step 2
        return path


if __name__ == "__main__":
    cfg = config_from_dict(yaml.safe_load(Path(sys.argv[1]).read_text()))
    out, phase = Path(sys.argv[2]), sys.argv[3]
    trainer = Recording(cfg, resume=phase == "resume")
    trainer.phase, trainer.record_dir = phase, out
    trainer.prompt = list(trainer.rt.tokenizer.encode("Question: who wrote the book?"))
    rank = trainer.acc.process_index
    if phase == "first":
        trainer.before = greedy(trainer, trainer.prompt)
        trainer.train()
    else:
        trainer.record = snapshot(trainer) | {
            "start_step": trainer.start_step,
            "next_batch": [t.id for t in trainer.stream.peek(cfg.trainer.tasks_per_step)],
        }  # fmt: skip
        trainer.train()
        torch.save(trainer.record, out / f"resume.rank{rank}.pt")
