"""The tool-call budget of a group: each call the env answered counts once, a tree's shared prefix included once."""

from __future__ import annotations

from agentenv.algorithms.base import own_tool_results
from agentenv.types import Segment, Trajectory


def seg(source: str, n: int) -> Segment:
    if source == "policy":
        return Segment("policy", [1] * n, logprobs=[0.0] * n, entropies=[0.0] * n)
    return Segment(source, [1] * n)


def test_a_branch_pays_only_for_the_calls_after_its_branch_point():
    # a: prompt 3, policy 4, tool 2 (tokens 7-8), policy 3, tool 2 (tokens 12-13), policy 1: two calls
    a = Trajectory("t", [seg("prompt", 3), seg("policy", 4), seg("tool", 2), seg("policy", 3), seg("tool", 2),
                         seg("policy", 1)])  # fmt: skip
    # b branched off a after its first result (token 9): its first call is a's, its second its own
    b = Trajectory("t", [seg("prompt", 3), seg("policy", 4), seg("tool", 2), seg("policy", 2), seg("tool", 2)],
                   parent_uid=a.uid, branch_token=9)  # fmt: skip
    # c branched after a's second result (token 14): no call of its own
    c = Trajectory("t", [*a.segments[:5], seg("policy", 2)], parent_uid=a.uid, branch_token=14)
    independent = Trajectory("t", [seg("prompt", 3), seg("policy", 4), seg("tool", 2), seg("policy", 1)])
    assert [own_tool_results(t) for t in (a, b, c, independent)] == [2, 1, 0, 1]
    # 3 calls answered for the tree's 3 trajectories; sampled alone, the same three would have made 2 + 2 + 2
    assert sum(own_tool_results(t) for t in (a, b, c)) == 3
