"""What ARPO's sampler did in one step: trees, branches, branch points, ΔH, the budget.

Read off the groups `TreeSampler` grew (`Group.info["decisions"]`, each
trajectory's `info["arpo"]["role"]`), summed over the step's trees (and over
processes, through `reduce`), then turned into means:

    arpo/trees                   trees grown this step (every process's)
    arpo/branches_per_tree       trajectories grown by branching, per tree
    arpo/branch_points_per_tree  nodes after a tool result where >= 1 fork started, per tree
    arpo/branch_points_per_traj  the same per trajectory (M per tree)
    arpo/fills_per_tree          fresh independent trajectories that took unused branch slots
    arpo/probes_per_tree         tool results probed (k tokens, ΔH, a decision)
    arpo/delta_h_after_tool      mean ΔH_t = (H_t - H_initial) / scale over every probe: the paper's
                                 entropy change after a tool result (left out when nothing was probed)
    arpo/delta_h_at_branch       mean ΔH_t over the probes where forks started (left out without one)
    arpo/branch_share_of_tools   tool results the branches paid for (their own, after the branch
                                 point) over every tool result of the trees: the share of the
                                 tool-call budget spent on branches
    arpo/budget_out              share of trees whose branch slots (M - N) all went to branches
    arpo/forks_refused           share of the forks the rule asked for that found no slot left

A mean with nothing to average (no probe, no fork asked for) is left out of
the step's metrics rather than logged as nan. A probe happens only while slots remain, so ΔH after a tool result is
measured over the tool results met before the budget ran out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from agentenv.algorithms.base import Reduce, own_tool_results
from agentenv.types import Group

# the sums, in the order they are reduced over processes
_SUMS = (
    "trees", "trajs", "branches", "branch_points", "fills", "probes", "delta_h", "branch_probes", "branch_delta_h",
    "tool_results", "branch_tool_results", "budget_out", "forks_wanted", "forks_refused",
)  # fmt: skip


def tree_sums(groups: Sequence[Group], branch_budget: int) -> dict[str, float]:
    """The sums over `groups` (trees grown by `TreeSampler` with M - N = `branch_budget`) that `tree_metrics` averages."""
    s = dict.fromkeys(_SUMS, 0.0)
    for g in groups:
        roles = [t.info.get("arpo", {}).get("role") for t in g.trajectories]
        decisions = g.info.get("decisions", [])
        s["trees"] += 1
        s["trajs"] += len(g.trajectories)
        branches = roles.count("branch")
        s["branches"] += branches
        s["fills"] += roles.count("fill")
        s["branch_points"] += sum(d["forks"] > 0 for d in decisions)
        for d in decisions:
            if math.isfinite(d["delta_h"]):
                s["probes"] += 1
                s["delta_h"] += d["delta_h"]
                if d["forks"] > 0:
                    s["branch_probes"] += 1
                    s["branch_delta_h"] += d["delta_h"]
            s["forks_wanted"] += d["forks_wanted"]
            s["forks_refused"] += d["forks_wanted"] - d["forks"]
        for t, role in zip(g.trajectories, roles):
            n = own_tool_results(t)
            s["tool_results"] += n
            s["branch_tool_results"] += n if role == "branch" else 0
        s["budget_out"] += float(branch_budget > 0 and branches >= branch_budget)
    return s


def tree_metrics(groups: Sequence[Group], branch_budget: int, reduce: Reduce | None = None) -> dict[str, float]:
    """The step's `arpo/*` metrics (see the module docstring), over every process when `reduce` sums over them."""
    s = tree_sums(groups, branch_budget)
    if reduce is not None:
        total = reduce(torch.tensor([s[k] for k in _SUMS], dtype=torch.float64))
        s = dict(zip(_SUMS, (float(v) for v in total.tolist())))
    def per(num: str, den: str) -> float:
        return s[num] / s[den] if s[den] else math.nan

    out = {
        "arpo/trees": s["trees"],
        "arpo/branches_per_tree": per("branches", "trees"),
        "arpo/branch_points_per_tree": per("branch_points", "trees"),
        "arpo/branch_points_per_traj": per("branch_points", "trajs"),
        "arpo/fills_per_tree": per("fills", "trees"),
        "arpo/probes_per_tree": per("probes", "trees"),
        "arpo/delta_h_after_tool": per("delta_h", "probes"),
        "arpo/delta_h_at_branch": per("branch_delta_h", "branch_probes"),
        "arpo/branch_share_of_tools": per("branch_tool_results", "tool_results"),
        "arpo/budget_out": per("budget_out", "trees"),
        "arpo/forks_refused": per("forks_refused", "forks_wanted"),
    }
    return {k: v for k, v in out.items() if math.isfinite(v)}  # an undefined mean is left out, not logged as nan
