"""Hand-built GiGPO inputs, as agentenv Groups and as the arrays verl-agent's `compute_gigpo_outcome_advantage` takes.

A layout is a list of tasks; a task a list of trajectories; a trajectory a
prompt, its steps (the policy's action text, then the tool's result text; the
last step has none) and its reward at the end. Text is tokenized one character
a token (`ord`), so the context before a step is the same sequence as an
agentenv token list and as verl-agent's anchor observation string: exact
anchors (equal strings, equal context hashes) and similarity anchors
(`difflib` ratios on strings or on token lists) see the same thing.

verl-agent's inputs, one row per step (its batch layout): `index` the task,
`traj_index` the trajectory, `anchor_obs` the context after the prompt before the
step (or the env's key, where the layout gives keys), `token_level_rewards` the episode's
reward on every row of the episode (its `EpisodeRewardManager`), and
`step_rewards` the discounted returns its `compute_step_discounted_returns`
makes from per-step rewards (the reward on the last step, 0 before).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agentenv.tasks.task import Task
from agentenv.types import Group, Segment, Trajectory

ROW_TOKENS = 3  # verl-agent's response length per row (each row's tokens carry the row's value)

# name -> {"tasks": [[{"prompt", "steps": [[action, result], ...], "reward", "keys"?}]], "similarity"?: threshold}
LAYOUTS: dict[str, dict[str, Any]] = {
    # two tasks, trajectories of 1 to 4 steps, shared and singleton anchor groups
    "mixed": {"tasks": [
        [
            {"prompt": "Q1", "steps": [["a", "x"], ["b", "y"], ["c", ""]], "reward": 1.0},
            {"prompt": "Q1", "steps": [["a", "x"], ["b", "y"], ["d", ""]], "reward": 0.0},
            {"prompt": "Q1", "steps": [["a", "x"], ["e", ""]], "reward": 1.0},
            {"prompt": "Q1", "steps": [["f", "z"], ["b", ""]], "reward": 0.0},
        ],
        [
            {"prompt": "Q2", "steps": [["a", ""]], "reward": 0.0},
            {"prompt": "Q2", "steps": [["a", "x"], ["b", ""]], "reward": 1.0},
            {"prompt": "Q2", "steps": [["g", "x"], ["h", "y"], ["i", "w"], ["j", ""]], "reward": 0.5},
        ],
    ]},
    # the env names every state apart: every anchor group is a singleton (step advantage 0)
    "singletons": {"tasks": [[
        {"prompt": "Q", "steps": [["a", "x"], ["b", ""]], "reward": 1.0, "keys": ["s0", "s1"]},
        {"prompt": "Q", "steps": [["a", "x"], ["c", ""]], "reward": 0.0, "keys": ["s2", "s3"]},
        {"prompt": "Q", "steps": [["d", ""]], "reward": 0.5, "keys": ["s4"]},
    ]]},
    # equal rewards: no episode-level signal, but the discount tells a short success from a long one
    "equal_rewards": {"tasks": [[
        {"prompt": "Q", "steps": [["a", "x"], ["b", ""]], "reward": 1.0},
        {"prompt": "Q", "steps": [["a", "x"], ["c", "y"], ["b", ""]], "reward": 1.0},
        {"prompt": "Q", "steps": [["d", "x"], ["c", "y"], ["b", ""]], "reward": 1.0},
    ]]},
    # every reward 0: every advantage 0
    "all_zero": {"tasks": [[
        {"prompt": "Q", "steps": [["a", "x"], ["b", ""]], "reward": 0.0},
        {"prompt": "Q", "steps": [["a", "x"], ["c", ""]], "reward": 0.0},
    ]]},
    # the env's own keys merge states whose contexts differ (a state revisited, a coarser env state)
    "env_keys": {"tasks": [[
        {"prompt": "Q", "steps": [["a", "x"], ["b", "y"], ["c", ""]], "reward": 1.0, "keys": ["S", "A", "S"]},
        {"prompt": "Q", "steps": [["d", "x"], ["e", ""]], "reward": 0.0, "keys": ["S", "A"]},
        {"prompt": "Q", "steps": [["f", ""]], "reward": 0.25, "keys": ["S"]},
    ]]},
    # similarity anchors at 0.9: contexts that differ in one character of a long result share a group
    "similarity": {"similarity": 0.9, "tasks": [[
        {"prompt": "Find the capital of the country north of X.", "steps": [
            ["search(north of X)", "Y lies north of X; its capital is Z."], ["answer Z", ""]], "reward": 1.0},
        {"prompt": "Find the capital of the country north of X.", "steps": [
            ["search(north of X)", "Y lies north of X; its capital is Q."], ["answer Q", ""]], "reward": 0.0},
        {"prompt": "Find the capital of the country north of X.", "steps": [
            ["search(capital)", "no result"], ["search(north of X)", "Y lies north of X; its capital is Z."],
            ["answer Z", ""]], "reward": 1.0},
    ]]},
    # one trajectory of one step: verl-agent's group of one row (see test_one_row_group_differs)
    "one_row": {"tasks": [[{"prompt": "Q", "steps": [["a", ""]], "reward": 1.0}]]},
}

# (verl-agent mode, step_advantage_w) -> agentenv's (normalize_std, step_advantage_weight)
MODES: dict[str, tuple[bool, float]] = {"mean_std_norm": (True, 1.0), "mean_norm": (False, 1.0), "mean_std_norm_w0.5": (True, 0.5)}
GAMMA = 0.95


def _tokens(text: str) -> list[int]:
    return [ord(c) for c in text]


def contexts(traj: dict[str, Any]) -> list[str]:
    """The context after the prompt before each step, as text (what `anchors: similarity` compares)."""
    out, ctx = [], ""
    for action, result in traj["steps"]:
        out.append(ctx)
        ctx += action + result
    return out


def agentenv_groups(layout: dict[str, Any]) -> list[Group]:
    groups = []
    for k, task in enumerate(layout["tasks"]):
        trajs = []
        for spec in task:
            segs = [Segment("prompt", _tokens(spec["prompt"]))]
            for action, result in spec["steps"]:
                ids = _tokens(action)
                segs.append(Segment("policy", ids, [0.0] * len(ids), [0.0] * len(ids)))
                if result:
                    segs.append(Segment("tool", _tokens(result)))
            trajs.append(Trajectory(task_id=f"task{k}", segments=segs, reward=spec["reward"], state_keys=list(spec.get("keys", []))))
        groups.append(Group(task=Task(id=f"task{k}", messages=({"role": "user", "content": "q"},), ground_truth=""), trajectories=trajs))
    return groups


def verl_rows(layout: dict[str, Any]) -> dict[str, Any]:
    """verl-agent's per-step inputs (numpy / torch), rows in task, trajectory, step order."""
    index, traj_index, obs, episode, rewards = [], [], [], [], []
    for k, task in enumerate(layout["tasks"]):
        for j, spec in enumerate(task):
            keys = spec.get("keys") or contexts(spec)
            for t, key in enumerate(keys):
                index.append(f"task{k}")
                traj_index.append(f"task{k}/traj{j}")
                obs.append(key)
                episode.append(spec["reward"])
                rewards.append(spec["reward"] if t == len(keys) - 1 else 0.0)
    n = len(index)
    token_level_rewards = torch.zeros(n, ROW_TOKENS)
    token_level_rewards[:, -1] = torch.tensor(episode)
    return {
        "index": np.array(index, dtype=object),
        "traj_index": np.array(traj_index, dtype=object),
        "anchor_obs": np.array(obs, dtype=object),
        "rewards": np.array(rewards, dtype=np.float32),
        "token_level_rewards": token_level_rewards,
        "response_mask": torch.ones(n, ROW_TOKENS),
    }


def agentenv_rows(groups: list[Group], advantages: list[list[torch.Tensor]]) -> list[float]:
    """agentenv's advantage of each step (on its first token), in verl_rows' order."""
    out = []
    for g, advs in zip(groups, advantages):
        for traj, adv in zip(g.trajectories, advs):
            pos = 0
            for seg in traj.segments:
                if seg.source == "policy":
                    span = adv[pos : pos + len(seg)]
                    assert torch.all(span == span[0]), "a step's tokens carry one advantage"
                    out.append(float(span[0]))
                pos += len(seg)
    return out
