"""Shared prefixes computed once: the rows of a batch packed into prefix trees.

The trajectories of an ARPO tree share their prefix with their parent (and
every trajectory of a group shares its prompt). Unpacked, the update computes a
shared token once per trajectory that holds it. Packed, each token of a prefix
tree is one position of one packed sequence: a row's own tokens (those after
the point where it leaves the deepest earlier row it shares a prefix with) are
appended to that row's pack, positions restart at the branch point, and a 4D
attention mask lets each token see exactly its own ancestors. The logits at a
packed position are then the logits the unpacked row computes at that
position, so the (B, T) logprobs are gathered back per row (the same values,
the same gradients) and the losses stay unchanged.

The sharing is found from the token ids themselves (a token is shared when the
whole prefix up to it is identical), so it needs no tree metadata and is
exact whatever the sampler recorded.

Works with attention implementations that take a 4D additive mask (`eager`,
`sdpa`: transformers passes a 4D mask through as is); FlashAttention ignores
such masks, so packing refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agentenv.errors import ConfigError

MAX_LEN_FACTOR = 2
"""A pack holds at most this many times the longest row's tokens: attention over a pack costs its length
squared (the 4D mask is dense), so one long pack of a whole tree can cost more than its rows unpacked."""

PACKABLE_ATTENTION = ("eager", "sdpa")
"""Attention implementations that honour a custom 4D attention mask."""


@dataclass
class PackPlan:
    """Where every row's tokens live in the packed sequences.

    Attributes:
        input_ids: (R, P) packed token ids (right-padded with the first row's first token).
        position_ids: (R, P) each packed token's position in its own row.
        allowed: (R, P, P) bool, True where query token p may attend key token q.
        src: (B, T) index into the flattened (R * P) packed positions whose logits
            predict column t of row b (token t + 1); 0 on padding columns.
        targets: (B, T) the token each column predicts (`input_ids[:, 1:]`).
        tokens: Real tokens in the rows (what the unpacked computation processes, padding aside).
        packed_tokens: Positions of the packed sequences that hold a token.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    allowed: torch.Tensor
    src: torch.Tensor
    targets: torch.Tensor
    tokens: int
    packed_tokens: int

    @property
    def saving(self) -> float:
        """The fraction of the tokens that packing does not compute again."""
        return 1.0 - self.packed_tokens / self.tokens if self.tokens else 0.0


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two 1-D int arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def plan_packing(input_ids: torch.Tensor, attention_mask: torch.Tensor, max_len: int | None = None) -> PackPlan:
    """Pack the rows of a batch into prefix trees.

    Each row shares the longest prefix it has with any earlier row (the
    deepest node of the prefix tree so far) and joins that row's pack, unless
    the pack would grow past `max_len`; then it starts a new pack.

    Args:
        input_ids: (B, L) token ids, left or right padded.
        attention_mask: (B, L) 1 on real tokens (contiguous in each row).
        max_len: Most positions of one packed sequence (bounds the (P, P) mask);
            default: `MAX_LEN_FACTOR` times the longest row.

    Returns:
        The plan; `plan.saving` says how much it saves.
    """
    B, L = input_ids.shape
    ids_np = input_ids.cpu().numpy()
    real = attention_mask.cpu().numpy().astype(bool)
    rows = [ids_np[b][real[b]] for b in range(B)]  # each (n_b,)
    cols = [np.flatnonzero(real[b]) for b in range(B)]  # column of each real token
    longest = max((len(r) for r in rows), default=0)
    cap = max(longest, max_len if max_len is not None else MAX_LEN_FACTOR * longest)

    pack_of: list[int] = []  # row -> pack
    loc: list[np.ndarray] = []  # row -> (n_b,) position in its pack of each of its tokens
    packs: list[list[np.ndarray]] = []  # pack -> chunks of (token ids)
    pos_chunks: list[list[np.ndarray]] = []  # pack -> chunks of position ids
    sizes: list[int] = []
    own_start: list[int] = []  # row -> first token it computes itself
    for b, ids in enumerate(rows):
        if not len(ids):  # a failed trajectory without tokens: nothing to compute
            pack_of.append(0)
            loc.append(np.empty(0, dtype=np.int64))
            own_start.append(0)
            continue
        best, share = -1, 0
        for a in range(b):
            n = _lcp(rows[a], ids)
            if n > share:
                best, share = a, n
        if best >= 0 and sizes[pack_of[best]] + len(ids) - share > cap:
            best, share = -1, 0
        if best < 0:
            packs.append([])
            pos_chunks.append([])
            sizes.append(0)
            r = len(packs) - 1
            here = np.empty(0, dtype=np.int64)
        else:
            r = pack_of[best]
            here = loc[best][:share]
        start = sizes[r]
        own = np.arange(start, start + len(ids) - share, dtype=np.int64)
        packs[r].append(ids[share:])
        pos_chunks[r].append(np.arange(share, len(ids), dtype=np.int64))
        sizes[r] += len(ids) - share
        pack_of.append(r)
        loc.append(np.concatenate([here, own]))
        own_start.append(share)

    R, P = max(1, len(packs)), max(2, max(sizes, default=0))
    fill = int(rows[0][0]) if rows and len(rows[0]) else 0
    packed_ids = torch.full((R, P), fill, dtype=torch.long)
    positions = torch.zeros((R, P), dtype=torch.long)
    allowed = torch.zeros((R, P, P), dtype=torch.bool)
    for r in range(len(packs)):
        if sizes[r]:
            packed_ids[r, : sizes[r]] = torch.from_numpy(np.concatenate(packs[r]))
            positions[r, : sizes[r]] = torch.from_numpy(np.concatenate(pos_chunks[r]))
    diag = torch.arange(P)
    allowed[:, diag, diag] = True  # padding positions see themselves (no empty softmax row)
    src = torch.zeros((B, max(1, L - 1)), dtype=torch.long)
    for b, ids in enumerate(rows):
        n, s, r = len(ids), own_start[b], pack_of[b]
        where = torch.from_numpy(loc[b])  # (n,)
        if n > s:
            # own token j (s <= j < n) sees the row's tokens 0..j, wherever they live
            j = torch.arange(s, n)
            causal = torch.arange(n)[None, :] <= j[:, None]  # (n - s, n)
            allowed[r][where[s:, None], where[None, :]] = causal
        if n > 1:
            src[b, torch.from_numpy(cols[b][:-1])] = r * P + where[:-1]
    return PackPlan(
        input_ids=packed_ids,
        position_ids=positions,
        allowed=allowed,
        src=src,
        targets=input_ids[:, 1:].cpu() if L > 1 else torch.zeros((B, 1), dtype=torch.long),
        tokens=int(real.sum()),
        packed_tokens=int(sum(sizes)),
    )


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(R, P, P) bool -> (R, 1, P, P) additive mask: 0 where allowed, the dtype's minimum elsewhere."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def attention_of(model: object) -> str | None:
    """The attention implementation of a (possibly wrapped) transformers model."""
    config = getattr(getattr(model, "module", model), "config", None)
    return getattr(config, "_attn_implementation", None)


def packing_enabled(mode: str, model: object, trees: bool = True) -> bool:
    """Whether the trainer packs (`trainer.pack_prefixes`: auto, on, off) for this model.

    `auto` packs the groups of an algorithm that grows trees (`trees`), where the
    model's attention takes a 4D mask. (A GRPO group shares only its prompt:
    packed, its update measured no faster; `benchmarks/packing.py`.)

    Raises:
        ConfigError: `on` with an attention that ignores 4D masks.
    """
    packable = attention_of(model) in PACKABLE_ATTENTION + (None,)
    if mode == "on" and not packable:
        raise ConfigError(
            "trainer.pack_prefixes",
            f"'on' needs an attention that takes a 4D mask ({', '.join(PACKABLE_ATTENTION)}), "
            f"the model uses {attention_of(model)!r}; use auto or off",
        )
    return mode == "on" or (mode == "auto" and packable and trees)


def check_packable(model: object) -> None:
    """Raise when the model's attention would ignore the packed 4D mask."""
    impl = attention_of(model)
    if impl is not None and impl not in PACKABLE_ATTENTION:
        raise ValueError(
            f"packing shared prefixes needs an attention that takes a 4D mask ({', '.join(PACKABLE_ATTENTION)}), "
            f"the model uses {impl!r}; set trainer.pack_prefixes=off or load the model with attn_implementation='sdpa'"
        )
