"""DAPO's dynamic sampling with a scripted policy that decides which groups have equal rewards; under
torchrun, each rank's view of one step.

Run as `torchrun --nproc_per_node 2 dynamic_sampling_run.py RUN.yaml OUT_DIR`: the first batch's tasks of
process 0 get equal rewards, process 1's differ, so only process 0 is short of groups; each rank saves its
step's metrics, its task stream's cursor, the groups it trained on and the seeds it sampled with.
"""

import collections
import sys
from pathlib import Path

import torch
import yaml

from agentenv.configs import RunConfig, config_from_dict
from agentenv.policies.models import resolve_model_path
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.training.build import build_runtime
from agentenv.training.trainer import Trainer

DAPO = ["algorithm.name=dapo", "algorithm.overlong_filter=false"]


def scripted_dapo_trainer(cfg: RunConfig, uniform: str) -> tuple[Trainer, list[int]]:
    """A trainer for `cfg` whose policy searches once, then answers wrongly (a group with equal rewards) for
    the tasks `uniform` names: `all`, the `first` batch's, or `first_rank0` (the first batch's share of
    process 0); for the other tasks right and wrong in turn (a group of 2 with differing rewards). Returns
    it and the list the sampler's seeds go to."""
    rt = build_runtime(cfg, resolve_model_path(cfg.model.path))
    truth = {t.messages[-1]["content"]: t.ground_truth for t in rt.tasks.train}
    answers: collections.Counter = collections.Counter()
    wrong: set[str] = set()

    def turn(prompt_ids: list[int]) -> str:
        text = rt.tokenizer.decode(prompt_ids)
        question = next(q for q in truth if q in text)
        if text.count("<result>") < 2:  # the system prompt names the tag once; no result yet
            return "<search>fact</search>"
        answers[question] += 1
        right = uniform != "all" and question not in wrong and answers[question] % 2 == 1
        return f"<answer>\\boxed{{{truth[question] if right else 'nothing'}}}</answer>"

    rt.policy = ScriptedPolicy(rt.tokenizer, turn)
    trainer = Trainer(cfg, runtime=rt)
    first = trainer.stream.peek(cfg.trainer.tasks_per_step)
    share = first[0 :: trainer.acc.num_processes] if uniform == "first_rank0" else first
    wrong.update(t.messages[-1]["content"] for t in share)
    seeds: list[int] = []
    real = trainer.algorithm.sampler

    class Recording:
        def __init__(self, inner):
            self.inner = inner

        async def sample(self, policy, make_env, task, params, seed):
            seeds.append(seed)
            return await self.inner.sample(policy, make_env, task, params, seed)

    trainer.algorithm.sampler = lambda *args: Recording(real(*args))
    return trainer, seeds


if __name__ == "__main__":
    trainer, seeds = scripted_dapo_trainer(config_from_dict(yaml.safe_load(Path(sys.argv[1]).read_text())), "first_rank0")
    try:
        rank = trainer.acc.process_index
        metrics = trainer.train_step(0)
        torch.save(
            {"world": trainer.acc.num_processes, "metrics": metrics, "cursor": trainer.stream.cursor,
             "batch_ids": trainer.last_batch_ids, "seeds": seeds},
            Path(sys.argv[2]) / f"rank{rank}.pt",
        )  # fmt: skip
    finally:
        trainer.close()
