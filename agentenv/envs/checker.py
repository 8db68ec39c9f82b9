"""`check_agent_env`: agentenv's own contract checks, beyond gymnasium's `check_env`.

Checks reset/step order, the loss mask (prompt and tool tokens 0, policy tokens
1), that the context is exactly the concatenation of the segments, that forks
are independent both ways, and that the same seed and actions give the same
episode. Synchronous: call it outside a running event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np

from agentenv.envs.agent_env import AgentEnv
from agentenv.envs.results import encode_text
from agentenv.tasks.task import Task


def default_actions(env: AgentEnv) -> list[list[int]]:
    """One call of each tool, then an answer: the turns the checker plays by default."""
    tok = env.tokenizer
    turns = [f"<think>check</think><{name}>test</{name}>" for name in env.tool_names]
    turns.append("<think>done</think><answer>\\boxed{0}</answer>")
    return [encode_text(tok, t) for t in turns]


def _snapshot(env: AgentEnv) -> dict[str, Any]:
    traj = env.trajectory()
    return {
        "context": env.context,
        "segments": [(s.source, list(s.token_ids)) for s in traj.segments],
        "tool_calls": dict(traj.tool_calls),
        "turns": traj.info["turns"],
        "finish_reason": traj.finish_reason,
        "done": env.done,
    }


def _check_structure(env: AgentEnv, where: str) -> None:
    traj = env.trajectory()
    concat = [t for s in traj.segments for t in s.token_ids]
    assert env.context == concat, (
        f"{where}: context ({len(env.context)} tokens) is not the concatenation of the segments ({len(concat)} tokens)"
    )
    assert traj.segments and traj.segments[0].source == "prompt", f"{where}: the first segment must be the prompt"
    mask = traj.loss_mask
    expected = [1 if s.source == "policy" else 0 for s in traj.segments for _ in s.token_ids]
    assert mask == expected, f"{where}: loss mask is not 1 exactly on policy tokens"
    for i, s in enumerate(traj.segments):
        if s.source == "policy":
            assert s.logprobs is not None and len(s.logprobs) == len(s), f"{where}: policy segment {i} lacks logprobs"
        else:
            assert s.mask_value == 0, f"{where}: {s.source} segment {i} has mask 1"
    assert env.remaining_tokens == max(0, env.config.max_context_tokens - len(env.context)), (
        f"{where}: remaining_tokens {env.remaining_tokens} disagrees with the context length {len(env.context)}"
    )


def _play(env: AgentEnv, task: Task, seed: int, actions: Sequence[Sequence[int]], label: str) -> list[tuple[Any, ...]]:
    """Reset and play `actions` until the episode ends; check structure after every step."""
    obs, _ = env.reset(seed=seed, options={"task": task})
    assert isinstance(obs, np.ndarray) and obs.dtype == np.int64, f"{label}: reset must return an int64 array"
    assert list(obs) == env.context, f"{label}: reset's observation is not the prompt context"
    _check_structure(env, f"{label} after reset")
    record: list[tuple[Any, ...]] = [("reset", list(obs))]
    for i, action in enumerate(actions):
        before = len(env.context)
        obs, reward, terminated, truncated, info = env.step(list(action))
        where = f"{label} step {i}"
        _check_structure(env, where)
        ctx = env.context
        assert ctx[before : before + len(action)] == list(action), f"{where}: the action was not appended verbatim"
        if len(obs):
            assert ctx[-len(obs) :] == list(obs), f"{where}: the observation is not the tail of the context"
            assert env.trajectory().segments[-1].source == "tool", f"{where}: a result must be a tool segment"
        if not (terminated or truncated):
            assert reward == 0.0, f"{where}: reward {reward} before the episode ended (must be 0)"
        record.append((list(obs), float(reward), bool(terminated), bool(truncated), info.get("finish_reason")))
        if terminated or truncated:
            break
    return record


def check_agent_env(
    env: AgentEnv, task: Task, seed: int = 0, actions: Sequence[Sequence[int]] | None = None
) -> None:
    """Check an AgentEnv's contract on one task.

    Args:
        env: A fresh or used `AgentEnv` (the unwrapped env, not a gymnasium wrapper).
        task: The task to play.
        seed: Reset seed.
        actions: Policy turns as token ids (default: call each tool once with
            `test`, then answer). At least two are needed for the fork check.
            The tools must answer them deterministically.

    Raises:
        AssertionError: With a message naming the check that failed.
    """
    inner = env.unwrapped if isinstance(env, gymnasium.Env) else env  # a wrapper given by mistake is looked through
    assert isinstance(inner, AgentEnv), f"check_agent_env needs an AgentEnv, got {type(env).__name__}"
    env = inner
    actions = [list(a) for a in (actions if actions is not None else default_actions(env))]
    assert len(actions) >= 2, "check_agent_env needs at least two actions (one before and one after a fork)"

    # Order: a never-reset env must refuse to step, clearly.
    fresh = env.fork()
    try:
        fresh.step(actions[0])
    except Exception as e:  # noqa: BLE001 - the type is checked below
        assert "reset" in str(e), f"step before reset raised {type(e).__name__} without telling to reset: {e}"
    else:
        raise AssertionError("step before reset must raise; it returned")
    finally:
        fresh.close()

    # Masks and structure along a whole episode; then stepping after the end must raise.
    first = _play(env, task, seed, actions, "episode")
    if env.done:
        try:
            env.step(actions[-1])
        except Exception as e:  # noqa: BLE001 - any type will do; the message is checked below
            assert "reset" in str(e), f"step after the end raised {type(e).__name__} without telling to reset: {e}"
        else:
            raise AssertionError("step after the episode ended must raise; it returned")

    # Determinism: same seed and actions give the same episode.
    again = _play(env, task, seed, actions, "replay")
    assert again == first, "same seed and actions gave a different episode (observations, rewards or flags differ)"

    # Fork independence, both ways.
    env.reset(seed=seed, options={"task": task})
    env.step(actions[0])
    if env.done:
        return
    before = _snapshot(env)
    child = env.fork()
    try:
        assert _snapshot(child) == before, "a fork does not start from its parent's state"
        child.step(actions[1])
        assert _snapshot(env) == before, "stepping a fork changed the original env"
        child_state = _snapshot(child)
        env.step(actions[1])
        assert _snapshot(child) == child_state, "stepping the original env changed its fork"
        assert env.context == child_state["context"], "the same action from the same state gave different contexts"
        _check_structure(child, "fork")
        ctraj = child.trajectory()
        assert ctraj.parent_uid == env.trajectory().uid, "a fork's trajectory must name its parent"
        assert ctraj.branch_token == len(before["context"]), "a fork's branch_token must be the context length at the fork"
    finally:
        child.close()
