"""agentenv's GiGPO against the paper's code: verl-agent's `compute_gigpo_outcome_advantage` on the same inputs.

verl-agent's outputs on every layout of `gigpo_layouts.py` (shared and
singleton anchor groups, all-equal and all-zero rewards, the env's own keys,
similarity anchors, trajectories of 1 to 4 steps) and both of its modes are
recorded in data/gigpo_verl_agent.json by `record_gigpo_reference.py`, which
runs verl-agent's file unmodified (its source is named in the file). Its code
is not vendored: this workplace keeps third-party code out of the repository.

agentenv matches it with `episode_weighting: step` (verl-agent's episode mean
and std are over steps). The one difference on these inputs: a task whose
only row is one trajectory of one step (`one_row`), where verl-agent returns the
raw reward (mean 0, std 1 for a group of one) and agentenv 0, as GRPO does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentenv.algorithms.gigpo import GiGPO, GiGPOConfig

from .gigpo_layouts import GAMMA, LAYOUTS, MODES, agentenv_groups, agentenv_rows

REF = json.loads((Path(__file__).parent / "data" / "gigpo_verl_agent.json").read_text())
F32 = torch.finfo(torch.float32).eps


def ours(name: str, mode: str, weighting: str = "step") -> list[float]:
    layout = LAYOUTS[name]
    normalize_std, w = MODES[mode]
    sim = layout.get("similarity")
    cfg = GiGPOConfig(
        normalize_std=normalize_std, step_advantage_weight=w, gamma=GAMMA, episode_weighting=weighting,
        anchors="similarity" if sim else "key", similarity_threshold=sim or 0.95,
    )  # fmt: skip
    algo = GiGPO(cfg)
    groups = agentenv_groups(layout)
    return agentenv_rows(groups, [algo.advantages(g) for g in groups])


def close(a: list[float], b: list[float]) -> bool:
    # verl-agent computes in float32: a few roundings of values of order 1 (the std's sqrt, a division)
    return len(a) == len(b) and all(abs(x - y) <= 16 * F32 * max(1.0, abs(y)) for x, y in zip(a, b))


CASES = [(n, m) for n in LAYOUTS if n != "one_row" for m in MODES]


@pytest.mark.parametrize(("name", "mode"), CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_equals_verl_agent(name, mode):
    want = REF["advantages"][f"{name}/{mode}"]
    got = ours(name, mode)
    assert close(got, want), (got, want)


def test_the_layouts_exercise_what_they_name():
    assert all(x == 0.0 for x in REF["advantages"]["all_zero/mean_std_norm"])
    # equal rewards: no episode-level signal, yet the discount separates the steps
    assert any(abs(x) > 0.1 for x in REF["advantages"]["equal_rewards/mean_std_norm"])
    # singletons: the step part is 0, so ω does not matter
    assert REF["advantages"]["singletons/mean_std_norm"] == REF["advantages"]["singletons/mean_std_norm_w0.5"]
    assert REF["advantages"]["mixed/mean_std_norm"] != REF["advantages"]["mixed/mean_std_norm_w0.5"]


def test_one_row_group_differs():
    """verl-agent: a group of one row keeps its raw score, (1 - 0) / (1 + 1e-6); agentenv: 0, GRPO's advantage of a
    group of one."""
    assert close(REF["advantages"]["one_row/mean_std_norm"], [1.0 / (1.0 + 1e-6)])
    assert ours("one_row", "mean_std_norm") == [0.0]


def test_the_papers_trajectory_weighting_differs_where_lengths_differ():
    """Eq. 3 over trajectories (the default) vs verl-agent's mean and std over steps: equal only where every
    trajectory has as many steps and the std is not taken."""
    assert not close(ours("mixed", "mean_std_norm", "trajectory"), REF["advantages"]["mixed/mean_std_norm"])
    assert close(ours("all_zero", "mean_norm", "trajectory"), REF["advantages"]["all_zero/mean_norm"])
