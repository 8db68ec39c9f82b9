"""The bench's entropy probe of a run with `rollout.agent` rolls out through the user's agent (the endpoint), as
its training and evaluation do, not through agentenv's own episode env."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentenv.bench.config import ProbeConfig
from agentenv.bench.runner import run_probe
from agentenv.configs import config_from_dict

AGENTS = Path(__file__).resolve().parents[1] / "rollout"  # endpoint_agents.py: agents as a user writes them

AGENT_RUN = [
    "policy.backend=hf",
    "policy.max_turn_tokens=8",
    "env.tools=[]",
    "env.tasks.kinds=[arith]",
    "env.chat_template=chatml_hermes",
    "env.max_context_tokens=768",
    "env.max_result_tokens=128",
    "rollout.agent=endpoint_agents:calc_agent",
    "algorithm.name=grpo",
    "logging.tensorboard=false",
    "logging.progress=false",
]


@pytest.fixture
def endpoint_agents():
    sys.path.insert(0, str(AGENTS))
    try:
        import endpoint_agents

        endpoint_agents.LOG.clear()
        yield endpoint_agents
    finally:
        sys.path.remove(str(AGENTS))


def test_the_probe_rolls_out_through_the_users_agent(tiny_model_path, endpoint_agents, tmp_path):
    cfg = config_from_dict({}, [*AGENT_RUN, f"trainer.output_dir={tmp_path / 'run'}"])
    probe = run_probe(cfg, tiny_model_path, ProbeConfig(tasks=2, samples=2, positions=4), tmp_path)
    assert probe.episodes == 4
    # every episode is one of the agent's conversations (it logs each request under the endpoint's trajectory)
    assert len(endpoint_agents.LOG) == 4
    assert all(len(turns) >= 2 for turns in endpoint_agents.LOG.values())
    assert probe.after_prompt.counts[0] == 4  # none failed: each has its first policy tokens' entropy
