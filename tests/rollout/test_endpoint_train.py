"""A user's agent, written with the plain `openai` client, trains GRPO on the tiny model through the endpoint."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from agentenv.configs import config_from_dict
from agentenv.envs.chat import ChatTemplate, check_from_scratch

HERE = Path(__file__).resolve().parent

AGENT_RUN = [
    "policy.backend=hf",
    "policy.max_turn_tokens=24",
    "policy.temperature=1.0",
    "env.tools=[]",
    "env.tasks.kinds=[arith]",
    "env.chat_template=chatml_hermes",
    "env.max_context_tokens=768",
    "env.max_result_tokens=128",
    "rollout.agent=endpoint_agents:graded_calc_agent",
    "algorithm.name=grpo",
    "algorithm.group_size=2",
    "trainer.steps=2",
    "trainer.tasks_per_step=2",
    "trainer.mini_batch_tasks=2",
    "trainer.micro_batch_size=8",
    "trainer.lr=0.001",
    "trainer.eval_tasks=2",
    "trainer.checkpoint_every=2",
    "logging.tensorboard=false",
    "logging.progress=false",
]


@pytest.fixture(scope="module")
def agents_on_path():
    sys.path.insert(0, str(HERE))
    yield
    sys.path.remove(str(HERE))


@pytest.fixture(scope="module")
def trained(agents_on_path, tiny_model_path, tmp_path_factory):
    """Two GRPO steps of `graded_calc_agent`, the groups each step rolled out kept (a spy on the real runner)."""
    import endpoint_agents

    from agentenv.training.trainer import Trainer

    endpoint_agents.LOG.clear()
    cfg = config_from_dict({}, AGENT_RUN + [f"trainer.output_dir={tmp_path_factory.mktemp('agent') / 'run'}"])
    trainer = Trainer(cfg)
    groups: list = []
    real = trainer.rt.agent.run_group

    async def keep(*args, **kwargs):
        g = await real(*args, **kwargs)
        groups.append(g)
        return g

    trainer.rt.agent.run_group = keep
    before = {k: v.detach().clone() for k, v in trainer.unwrapped().state_dict().items()}
    try:
        metrics = [trainer.train_step(s) for s in range(2)]
        after = trainer.unwrapped().state_dict()
        changed = [k for k in before if not torch.equal(before[k], after[k])]
        report = trainer.evaluate(2)
        chat = ChatTemplate.from_config(trainer.rt.tokenizer, "chatml_hermes", {})
    finally:
        trainer.close()
    return metrics, groups, changed, report, chat, dict(endpoint_agents.LOG)


def test_two_grpo_steps_train_the_agent(trained):
    metrics, groups, changed, report, _, _ = trained
    for m in metrics:
        assert m["rollout/failed"] == 0
        assert m["rollout/trajectories"] >= 4  # 2 tasks x 2 episodes, each at least one trajectory
        assert m["rollout/endpoint_requests"] >= 2 * m["rollout/trajectories"]  # every conversation has 2+ requests
        assert m["rollout/prefix_breaks"] == 0 and m["rollout/endpoint_errors"] == 0
        assert m["train/logprob_gap_mean"] < 1e-3  # the endpoint's logprobs are the policy's (same fp32 weights)
    assert any(m["train/grad_norm"] > 0 for m in metrics) and changed, "no update moved the weights"
    for s, m in enumerate(metrics):  # the logged reward counts episodes, however many trajectories each recorded
        rewards = {t.episode: t.reward for g in groups[2 * s : 2 * s + 2] for t in g}
        assert m["rollout/episodes"] == len(rewards) == 4
        assert m["rollout/reward"] == pytest.approx(sum(rewards.values()) / 4)
    assert report is not None and report.n_tasks == 2 and report.failed == 0


def test_trajectories_equal_the_conversation_rendered_from_scratch(trained):
    _, groups, _, _, chat, log = trained
    trajs = [t for g in groups for t in g]
    assert len(trajs) >= 4
    for traj in trajs:
        turns = log[traj.uid]  # what the agent sent and got back, request by request
        policy = [s.token_ids for s in traj.segments if s.source == "policy"]
        assert policy == [t["token_ids"] for t in turns]  # exactly the ids the endpoint returned, in order
        # the conversation as the agent last sent it, its assistant turns as the model wrote them
        final, msgs, k = turns[-1], [], 0
        for m in final["messages"]:
            if m["role"] == "assistant":
                msgs.append({"role": "assistant", "content": _written(chat, policy[k])})
                k += 1
            else:
                msgs.append({k2: v for k2, v in m.items() if k2 in ("role", "content")})
        msgs.append({"role": "assistant", "content": _written(chat, policy[-1])})
        from endpoint_agents import TOOLS

        tools_chat = dataclasses.replace(chat, tools=TOOLS)
        rendered = tools_chat.render(msgs, add_generation_prompt=False)
        check_from_scratch(tools_chat, traj.segments, rendered)  # every piece in place; prompt/tool pieces as tokenized alone
        text = chat.decode(traj.token_ids)
        assert rendered.startswith(text) and rendered[len(text):] in ("", "<|im_end|>\n", "\n")


def _written(chat: ChatTemplate, ids: list[int]) -> str:
    eos = chat.tokenizer.eos_token_id
    return chat.decode(ids[:-1] if ids and ids[-1] == eos else ids)
