"""ARPO's tree sampler with the real tiny model, toy two-hop tasks and the local search tool.

Token accounting on the same tasks: ARPO at M=16, N=8 against GRPO at G=16,
counting the tokens the policy generated (shared prefixes once), not the
lengths of the trajectories.
"""

from __future__ import annotations

import asyncio

import pytest

from agentenv.algorithms.arpo import ARPOConfig, TreeSampler
from agentenv.algorithms.base import group_generated_tokens
from agentenv.algorithms.grpo import IndependentSampler
from agentenv.configs import config_from_dict
from agentenv.types import SamplingParams

pytestmark = pytest.mark.slow

RUN = {
    "model": {"path": "tiny"},
    "policy": {"backend": "hf", "temperature": 1.0, "max_turn_tokens": 64},
    "env": {
        "tools": ["search"],
        "tasks": {"source": "toy", "kinds": ["twohop"], "seed": 0},
        "max_tool_calls": 3,
        "max_context_tokens": 768,
        "max_result_tokens": 160,
    },
    "algorithm": {"name": "arpo"},
}


@pytest.fixture(scope="module")
def runtime(tiny_model_path):
    from agentenv.training.build import build_runtime

    rt = build_runtime(config_from_dict(RUN), model_path=str(tiny_model_path))
    yield rt
    asyncio.run(rt.aclose())


def test_tiny_model_tree_and_token_accounting_against_grpo(runtime):
    params = SamplingParams(max_tokens=64, temperature=1.0)
    cfg = ARPOConfig(group_size=16, initial_rollouts=8, forks_per_branch=2, entropy_window=20)
    tasks = runtime.tasks.train[:1]

    async def both(task, seed):
        arpo = await TreeSampler(cfg).sample(runtime.policy, runtime.make_env, task, params, seed)
        grpo = await IndependentSampler(16).sample(runtime.policy, runtime.make_env, task, params, seed)
        return arpo, grpo

    rows = []
    for i, task in enumerate(tasks):
        arpo, grpo = asyncio.run(both(task, 100 + i))
        assert len(arpo) == len(grpo) == 16
        assert len({t.uid for t in arpo}) == 16
        assert not any(t.failed for t in arpo), [t.error for t in arpo if t.failed]
        by_uid = {t.uid: t for t in arpo}
        for t in arpo:
            if t.parent_uid is not None:
                assert t.token_ids[: t.branch_token] == by_uid[t.parent_uid].token_ids[: t.branch_token]
        # the sampler's own count (every generate call) and the tree's count agree up to
        # tokens generated past a stop string split by a probe (cut, but generated)
        assert arpo.info["generated_tokens"] >= group_generated_tokens(arpo)
        rows.append(
            (
                task.id,
                arpo.info["generated_tokens"],
                group_generated_tokens(grpo),
                sum(t.num_policy_tokens for t in arpo),
                arpo.info["branch_points"],
                arpo.info["branches"],
                arpo.info["fills"],
            )
        )
    print("\ntask | ARPO generated | GRPO generated | ARPO policy tokens in trajectories | branch points | branches | fills")
    for r in rows:
        print(" | ".join(map(str, r)))
    # the shared prefixes are not generated twice
    assert all(r[1] <= r[3] for r in rows)


def test_n_equal_m_with_the_tiny_model_is_grpos_sampling(runtime):
    """N = M (the GRPO end of the paper's ablation over N): the same trajectories as GRPO's sampler.

    Compared: token ids and rewards of every trajectory (equal), sampler logprobs (within 1e-4:
    measured 1.04e-5 at most; the forward pass's float rounding depends on the requests decoded
    beside it), same task and seed. Each generate call is seeded `derive_seed(episode seed, call
    index)`, and root path i gets GRPO's episode seed `derive_seed(seed, i)`.
    """
    params = SamplingParams(max_tokens=64, temperature=1.0)
    cfg = ARPOConfig(group_size=4, initial_rollouts=4, entropy_window=20)
    task = runtime.tasks.train[0]

    async def both():
        tree = await TreeSampler(cfg).sample(runtime.policy, runtime.make_env, task, params, 7)
        grpo = await IndependentSampler(4).sample(runtime.policy, runtime.make_env, task, params, 7)
        return tree, grpo

    tree, grpo = asyncio.run(both())
    assert not any(t.failed for t in tree) and not any(t.failed for t in grpo)
    assert tree.info["decisions"] == [] and tree.info["branches"] == 0
    assert [t.token_ids for t in tree] == [t.token_ids for t in grpo]
    assert [t.reward for t in tree] == [t.reward for t in grpo]
    for a, b in zip(tree, grpo):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert len({tuple(t.token_ids) for t in tree}) > 1  # distinct samples, not one repeated
