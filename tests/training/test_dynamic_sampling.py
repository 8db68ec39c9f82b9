"""DAPO's dynamic sampling on the real trainer (tiny model's weights, hf backend's trainer side): a batch whose
groups all had equal rewards is refilled with new tasks' groups, and the refill stops at its cap, filling the
slots left with dropped groups. A scripted policy decides which groups have equal rewards."""

from __future__ import annotations

import collections

from agentenv.configs import config_from_dict
from agentenv.policies.models import resolve_model_path
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.training.build import build_runtime
from agentenv.training.trainer import Trainer


def _trainer(overrides: list[str], every_task_uniform: bool) -> tuple[Trainer, list[int]]:
    """A DAPO trainer whose policy searches once, then answers: wrongly for every task of the first batch
    (every task, with `every_task_uniform`): a group with equal rewards; for later tasks right and wrong in
    turn: a group of 2 with differing rewards. Returns it and the list the sampler's seeds go to."""
    cfg = config_from_dict({}, overrides + ["algorithm.name=dapo", "algorithm.overlong_filter=false"])
    rt = build_runtime(cfg, resolve_model_path(cfg.model.path))
    truth = {t.messages[-1]["content"]: t.ground_truth for t in rt.tasks.train}
    answers: collections.Counter = collections.Counter()
    uniform: set[str] = set()

    def turn(prompt_ids: list[int]) -> str:
        text = rt.tokenizer.decode(prompt_ids)
        question = next(q for q in truth if q in text)
        if text.count("<result>") < 2:  # the system prompt names the tag once; no result yet
            return "<search>fact</search>"
        answers[question] += 1
        right = not every_task_uniform and question not in uniform and answers[question] % 2 == 1
        return f"<answer>\\boxed{{{truth[question] if right else 'nothing'}}}</answer>"

    rt.policy = ScriptedPolicy(rt.tokenizer, turn)
    trainer = Trainer(cfg, runtime=rt)
    uniform.update(t.messages[-1]["content"] for t in trainer.stream.peek(cfg.trainer.tasks_per_step))
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


def _one_step(trainer: Trainer) -> dict[str, float]:
    try:
        return trainer.train_step(0)
    finally:
        trainer.close()


def test_a_batch_of_equal_reward_groups_is_refilled_with_new_tasks(fast_overrides):
    trainer, seeds = _trainer(fast_overrides + ["algorithm.max_resample_rounds=3"], every_task_uniform=False)
    m = _one_step(trainer)
    assert m["rollout/resample_rounds"] == 1.0  # one extra round filled both slots
    assert m["rollout/dropped_groups"] == 2.0 and m["rollout/filled_groups"] == 0.0
    assert m["rollout/accuracy"] == 0.5  # the trained groups are the new, informative ones (1 of 2 right)
    assert m["train/grad_norm"] > 0
    assert len(trainer.last_batch_ids) == 4 and trainer.stream.cursor == 4  # the stream moved past the extra tasks
    assert len(seeds) == 4 and len(set(seeds)) == 4  # the extra round's seeds differ from the first's


def test_the_refill_stops_at_its_cap_and_fills_with_dropped_groups(fast_overrides):
    trainer, seeds = _trainer(fast_overrides + ["algorithm.max_resample_rounds=2"], every_task_uniform=True)
    m = _one_step(trainer)
    assert m["rollout/resample_rounds"] == 2.0
    assert m["rollout/dropped_groups"] == 6.0  # 2 groups in each of 3 rounds, all with equal rewards
    assert m["rollout/filled_groups"] == 2.0  # both slots took dropped groups: the step still trains on 2 groups
    assert m["rollout/trajectories"] == 4.0 and m["rollout/accuracy"] == 0.0
    assert m["train/grad_norm"] == 0.0  # zero advantage everywhere
    assert trainer.stream.cursor == 6 and len(set(seeds)) == 6
