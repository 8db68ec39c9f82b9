"""The rollout tree: hard advantages over shared prefixes.

A branch shares its first `branch_token` tokens with its parent (they are
copies, generated once). Token j of trajectory i is *owned* by the first
trajectory on the chain i -> parent(i) -> ... whose own tokens start at or
before j; every trajectory that reaches the same (owner, j) shares that token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentenv.types import Trajectory


def _owners(lengths: Sequence[int], parents: Sequence[int | None], branch_tokens: Sequence[int | None]) -> list[torch.Tensor]:
    """Per trajectory, a (len,) tensor holding the index of the trajectory that owns each token."""
    n = len(lengths)
    owners: list[torch.Tensor | None] = [None] * n

    def build(i: int, seen: tuple[int, ...]) -> torch.Tensor:
        done = owners[i]
        if done is not None:
            return done
        if i in seen:
            raise ValueError(f"the parent links form a cycle through trajectory {i}")
        p, b = parents[i], branch_tokens[i]
        if p is None:
            own = torch.full((lengths[i],), i, dtype=torch.long)
        else:
            if not 0 <= p < n:
                raise ValueError(f"trajectory {i} has parent {p}, outside 0..{n - 1}")
            if b is None or not 0 <= b <= min(lengths[i], lengths[p]):
                raise ValueError(
                    f"trajectory {i} branches at token {b} but has {lengths[i]} tokens and its parent {lengths[p]}"
                )
            inherited = build(p, seen + (i,))[:b]  # (b,)
            own = torch.cat([inherited, torch.full((lengths[i] - b,), i, dtype=torch.long)])
        owners[i] = own
        return own

    return [build(i, ()) for i in range(n)]


def shared_token_mean(
    values: Sequence[float],
    lengths: Sequence[int],
    parents: Sequence[int | None],
    branch_tokens: Sequence[int | None],
    valid: Sequence[bool] | None = None,
) -> list[torch.Tensor]:
    """ARPO's hard advantage: a token shared by d trajectories gets the mean of their d values.

    Args:
        values: (G,) one advantage per trajectory.
        lengths: Tokens per trajectory.
        parents: Index of each trajectory's parent (None for a root).
        branch_tokens: Where each trajectory left its parent (None for a root).
        valid: Trajectories that take part in the means (failed ones do not);
            an invalid trajectory keeps its own value on every token.
    Returns:
        Per trajectory, a (len,) float32 tensor of per-token advantages.
    """
    n = len(values)
    if not (len(lengths) == len(parents) == len(branch_tokens) == n):
        raise ValueError(
            f"{n} values but {len(lengths)} lengths, {len(parents)} parents, {len(branch_tokens)} branch tokens"
        )
    valid = [True] * n if valid is None else list(valid)
    owners = _owners(lengths, parents, branch_tokens)
    sums = [torch.zeros(lengths[o], dtype=torch.float64) for o in range(n)]  # per owner, (len_o,)
    counts = [torch.zeros(lengths[o], dtype=torch.float64) for o in range(n)]
    for i in range(n):
        if not valid[i]:
            continue
        for o in owners[i].unique().tolist():
            pos = (owners[i] == o).nonzero().squeeze(-1)  # positions of i's tokens owned by o
            sums[o][pos] += float(values[i])
            counts[o][pos] += 1.0
    out = []
    for i in range(n):
        adv = torch.full((lengths[i],), float(values[i]), dtype=torch.float64)
        if valid[i]:
            for o in owners[i].unique().tolist():
                pos = (owners[i] == o).nonzero().squeeze(-1)
                adv[pos] = sums[o][pos] / counts[o][pos]
        out.append(adv.float())
    return out


def counted_once(
    lengths: Sequence[int],
    parents: Sequence[int | None],
    branch_tokens: Sequence[int | None],
    valid: Sequence[bool] | None = None,
) -> list[torch.Tensor]:
    """Where each token enters the loss when every shared token is counted once (`advantage: hard_once`).

    A token shared by several trajectories is kept in one row only, its
    carrier's: the owner (the trajectory that generated it) when the owner is
    valid, else the first valid trajectory that shares it (a failed owner's
    row is out of the loss, so its branches' copies must carry its tokens).
    A token nobody else shares stays where it is. Invalid rows are left all
    True (their loss mask is already 0).

    Args:
        lengths, parents, branch_tokens: The tree, as for `shared_token_mean`.
        valid: Trajectories in the loss (failed ones are not).
    Returns:
        Per trajectory, a (len,) bool tensor: True where that row counts the token.
    """
    n = len(lengths)
    valid = [True] * n if valid is None else list(valid)
    owners = _owners(lengths, parents, branch_tokens)
    # carrier[o][j]: the row that counts token j of owner o; -1 until a valid sharer is seen
    carrier = [torch.where(torch.tensor(valid[o]), o, -1).expand(lengths[o]).clone() for o in range(n)]
    for i in range(n):  # rows in order, so the first valid sharer wins where the owner failed
        if not valid[i]:
            continue
        for o in owners[i].unique().tolist():
            pos = (owners[i] == o).nonzero().squeeze(-1)  # i's tokens owned by o
            unset = pos[carrier[o][pos] < 0]
            carrier[o][unset] = i
    keep = []
    for i in range(n):
        if not valid[i]:
            keep.append(torch.ones(lengths[i], dtype=torch.bool))
            continue
        mine = torch.zeros(lengths[i], dtype=torch.bool)
        for o in owners[i].unique().tolist():
            pos = (owners[i] == o).nonzero().squeeze(-1)
            mine[pos] = carrier[o][pos] == i
        keep.append(mine)
    return keep


def tree_indices(trajectories: Sequence[Trajectory]) -> tuple[list[int | None], list[int | None]]:
    """Parent indices and branch tokens of a group; a parent outside the group makes the trajectory a root."""
    index = {t.uid: i for i, t in enumerate(trajectories)}
    if len(index) != len(trajectories):
        raise ValueError("trajectories in a group must have distinct uids")
    parents: list[int | None] = []
    branch: list[int | None] = []
    for t in trajectories:
        p = index.get(t.parent_uid) if t.parent_uid is not None else None
        parents.append(p)
        branch.append(t.branch_token if p is not None else None)
    return parents, branch
