"""Per-token logprob and entropy from what vLLM returns (pure numpy; no vLLM import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from agentenv.errors import InfraError
from agentenv.policies._vllm_worker import decode_entropies
from agentenv.policies.vllm.config import CallEntropyMode


@dataclass(frozen=True)
class EntropyEstimate:
    """Per-token entropy estimates (nats) with the interval that must hold the truth.

    Attributes:
        estimate: (n,) the value reported; the midpoint of [lower, upper].
        lower: (n,) a lower bound on the exact entropy.
        upper: (n,) an upper bound on the exact entropy.
    """

    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    @property
    def max_error(self) -> np.ndarray:
        """(n,) the bound on |estimate - exact|: half the interval."""
        half: np.ndarray = (self.upper - self.lower) / 2
        return half


def exact_entropy(logprobs: np.ndarray) -> np.ndarray:
    """Entropy (nats) of each row of full-vocabulary log-probabilities.

    Args:
        logprobs: (n, V); -inf where a token is impossible.

    Returns:
        (n,) entropies.
    """
    logprobs = np.asarray(logprobs, dtype=np.float64)
    finite = np.isfinite(logprobs)
    safe = np.where(finite, logprobs, 0.0)  # -inf * 0 would be nan
    entropy: np.ndarray = -(np.exp(safe) * safe * finite).sum(-1)
    return entropy


def topk_entropy(
    top_logprobs: np.ndarray, vocab_size: int, extra_logprobs: np.ndarray | None = None
) -> EntropyEstimate:
    """Estimate the entropy of each row from its k largest log-probabilities.

    With known tokens K (the top k, plus the sampled token where it is not
    among them) and their probabilities p_i, the rest of the vocabulary
    (M = V - |K| tokens) holds the mass r = 1 - sum p_i, and each of those
    tokens has probability at most p_(k), the k-th largest. The exact entropy
    is H = H_K + H_rest with H_K = -sum_K p_i log p_i and

        -r log min(r, p_(k))  <=  H_rest  <=  r log(M / r)

    (left: every tail probability is <= min(r, p_(k)); right: mass r spread
    uniformly over M tokens). We report H_K plus the midpoint, which minimizes
    the worst case: |estimate - H| <= (upper - lower) / 2, and the gap vanishes
    as r -> 0. On a peaked distribution r is tiny and so is the error.

    Args:
        top_logprobs: (n, k) the k largest log-probabilities of each row
            (-inf entries allowed, e.g. after top-k / top-p truncation).
        vocab_size: V, the size of the distribution's support.
        extra_logprobs: (n,) log-probability of one more known token outside
            the top k (the sampled one), -inf where there is none.

    Returns:
        The estimate with its lower and upper bounds, each (n,).
    """
    top = np.asarray(top_logprobs, dtype=np.float64)  # (n, k)
    n, k = top.shape
    p_top = np.where(np.isfinite(top), np.exp(np.where(np.isfinite(top), top, 0.0)), 0.0)  # (n, k)
    h_known = -(p_top * np.where(p_top > 0, top, 0.0)).sum(-1)  # (n,)
    mass = p_top.sum(-1)
    n_known = np.full(n, k, dtype=np.float64)
    if extra_logprobs is not None:
        extra = np.asarray(extra_logprobs, dtype=np.float64)  # (n,)
        has = np.isfinite(extra)
        p_extra = np.where(has, np.exp(np.where(has, extra, 0.0)), 0.0)
        h_known = h_known - np.where(p_extra > 0, p_extra * np.where(has, extra, 0.0), 0.0)
        mass = mass + p_extra
        n_known = n_known + has
    m = np.maximum(vocab_size - n_known, 0.0)  # (n,) tokens outside K
    r = np.where(m > 0, np.clip(1.0 - mass, 0.0, 1.0), 0.0)  # (n,) their total mass
    tiny = np.finfo(np.float64).tiny
    cap = np.maximum(np.minimum(r, p_top[:, -1]), tiny)  # largest probability a tail token can have
    r_safe = np.where(r > 0, r, 1.0)  # only used where r > 0
    lower_tail = np.where(r > 0, -r * np.log(cap), 0.0)
    upper_tail = np.where(r > 0, r * np.log(np.maximum(m, 1.0) / r_safe), 0.0)
    upper_tail = np.maximum(upper_tail, lower_tail)
    lower, upper = h_known + lower_tail, h_known + upper_tail
    return EntropyEstimate(estimate=(lower + upper) / 2, lower=lower, upper=upper)


def _token_logprobs_and_entropies(
    flat: Any, n: int, mode: CallEntropyMode, vocab_size: int
) -> tuple[list[float], list[float]]:
    """Read vLLM's per-position logprobs (a `FlatLogprobs`) of n sampled tokens.

    Position i holds entries [start_i, end_i): entry 0 is the sampled token
    (its rank slot holds the in-engine entropy on an `exact` engine), then the
    top-k (or, with logprobs=-1, the whole vocabulary) by rank.
    """
    if flat is None or len(flat) < n:
        got = 0 if flat is None else len(flat)
        raise InfraError(f"vLLM returned logprobs for {got} of {n} tokens; the engine must run with logprobs")
    if n == 0:
        return [], []
    starts = np.asarray(flat.start_indices[:n])
    if mode in ("exact", "none"):
        sampled = np.asarray(flat.logprobs, dtype=np.float64)[starts]  # (n,)
        if mode == "none":
            return sampled.tolist(), [float("nan")] * n
        try:
            entropies = decode_entropies([flat.ranks[i] for i in starts])
        except ValueError as exc:
            raise InfraError(
                "vLLM returned ranks where the in-engine entropies belong: its sampler runs without "
                "agentenv's entropy hook (the engine must start with entropy_mode=exact)"
            ) from exc
        return sampled.tolist(), entropies.tolist()
    ends = np.asarray(flat.end_indices[:n])
    widths = ends - starts
    width = int(widths.max())
    lps = np.asarray(flat.logprobs, dtype=np.float64)
    ids = np.asarray(flat.token_ids, dtype=np.int64)
    if (widths == width).all() and (starts[1:] == ends[:-1]).all():
        block = lps[starts[0] : ends[-1]].reshape(n, width)  # (n, 1 + k)
        block_ids = ids[starts[0] : ends[-1]].reshape(n, width)
    else:  # ragged: pad with -inf / -1
        block = np.full((n, width), -np.inf)
        block_ids = np.full((n, width), -1, dtype=np.int64)
        for i, (s, e) in enumerate(zip(starts, ends)):
            block[i, : e - s] = lps[s:e]
            block_ids[i, : e - s] = ids[s:e]
    sampled = block[:, 0]  # (n,)
    ranked, ranked_ids = block[:, 1:], block_ids[:, 1:]  # (n, k) or (n, V)
    if mode == "full":
        entropies = exact_entropy(ranked)
    else:
        in_top = (ranked_ids == block_ids[:, :1]).any(-1)  # (n,)
        extra = np.where(in_top, -np.inf, sampled)
        entropies = topk_entropy(ranked, vocab_size, extra).estimate
    return sampled.tolist(), entropies.tolist()
