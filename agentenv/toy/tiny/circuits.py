"""A copy circuit written into the tiny model's initial weights.

Every toy task needs copying: operands from the question into the code,
numbers and names from a tool result into the next query and the answer. A
transformer learns to copy with an induction head (Olsson et al., 2022), which
forms only after a long loss plateau: far more tokens than a 5-minute CPU
build can afford (a cold start from random weights stalls with every digit
unpredicted). So the build starts from weights that already hold the circuit,
and the SFT learns when to use it:

- layer 0, query heads 0 and 1 (key/value head 0): attend to positions t-1 and
  t-2. Their scores come from RoPE alone (zero q/k weights, constant q/k
  biases whose phase difference peaks at that offset); these q/k rows stay
  frozen during SFT. They copy the token identity (subspace A of the residual)
  of t-1 into subspace B and of t-2 into subspace C.
- layer 1, query head 2 (key/value head 1): an induction head. Its query is
  (current token, previous token) and its key (previous token, the one before)
  at each earlier position s, read through the slowest RoPE pairs (which barely
  rotate over the context), so it attends to where the last two tokens
  occurred before and copies the token that followed there into A, which the
  tied LM head reads as a logit boost.
- layer 1, query heads 0, 1 and 3: pointer heads. Their keys are the induction
  head's (the two tokens before s) and their values the token at s, copied into
  A; their queries start at zero and are left to the SFT, which teaches them
  where to copy from where no bigram repeats: the first token of a name after
  `<search>`, of a number after `<result>`, of the answer after `\boxed{`.
  Head 3 also prefers recent positions (a fixed term on one mid-speed RoPE
  pair that falls with distance): the entity an answer or a follow-up query
  copies was most often just written in the think before it, while the same
  relation ("was born in") also stands in older result lines about other
  entities. Heads 0 and 1 match on content alone, for what lies far back (an
  operand in the question).
- Token embeddings start in A (dims 0-63); every other residual branch
  (o_proj and MLP down_proj) starts at zero, so at init the network is exactly
  this circuit.
- A byte-level BPE spells most words two ways: `ĠMask` mid-sentence, `Mask`
  at the start of a line or right after a tag. A name read from a result line
  ("Maskmere is a city ...") must be written mid-sentence in the answer, and a
  name from the question must open a query after `<search>`. Twins
  (`space_twins`) therefore share their identity in A, so the induction head
  matches and copies a word whichever way it was spelled, and the spaced twin
  adds a common "leading space" direction in subspace D (dims 192-255) that
  the SFT uses to pick the spelling the position needs.

The SFT keeps the circuit's token matching and copying fixed (gradient hooks
zero the previous-token heads and the induction head's q/k/v rows and output
columns) and trains everything around it. Left trainable, the circuit was
worn down in the first steps at the SFT's learning rate (the loss rose above
its starting value, then sat near 3 for ~100 steps) and the model learned to
write train-world names where held-out names had to be copied. Frozen, the
same 480-step SFT reached loss 1.5 by step 81 instead of ~230, ended at 0.14
instead of 0.18, and solved held-out two-hop tasks (0% -> 17% greedy).

The result is a plain `Qwen2ForCausalLM` (transformers and vLLM need nothing
special); only the starting point differs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

_A, _B, _C, _D = slice(0, 64), slice(64, 128), slice(128, 192), slice(192, 256)


def space_twins(tokenizer: Any) -> list[tuple[int, int]]:
    """(id of `w`, id of `Ġw`) for every word piece the vocabulary has in both spellings."""
    vocab = tokenizer.get_vocab()
    return sorted((vocab[t[1:]], i) for t, i in vocab.items() if t.startswith("Ġ") and len(t) > 1 and t[1:] in vocab)


def _rope_base(cfg: Any) -> float:
    params = getattr(cfg, "rope_parameters", None)
    if params and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(cfg.rope_theta)


def install_copy_circuit(
    model: Any,
    *,
    embed_std: float = 0.05,
    prev_gain: float = 1.0,
    match_gain: float = 16.0,
    copy_gain: float = 10.0,
    pointer_gain: float = 10.0,
    position_logit: float = 100.0,
    position_pairs: int = 6,
    static_pair_from: int = 20,
    twins: Sequence[tuple[int, int]] = (),
    space_gain: float = 1.0,
    pointer_recency: float = 20.0,
    recency_pair: int = 11,
    freeze: bool = True,
    seed: int = 0,
) -> list[Any]:
    """Write the copy circuit into a freshly initialised model (in place).

    Args:
        model: A `Qwen2ForCausalLM` with hidden 256, 4 heads of 64, 2 key/value heads, >= 2 layers.
        embed_std: Std of the token embeddings (in subspace A).
        prev_gain: Scale of the previous-token copies written into B and C.
        match_gain: Sharpness of the induction head's token matching.
        copy_gain: Scale of the induction head's output into A.
        pointer_gain: Scale of the pointer heads' output into A (their queries are learned).
        position_logit: Attention logit of the previous-token heads at their offset.
        position_pairs: Fastest RoPE pairs the previous-token heads use.
        static_pair_from: First (slowest) RoPE pair the induction head matches on.
        twins: (plain id, spaced id) pairs that share their identity in A (`space_twins`).
        space_gain: Norm of the spaced twins' common direction in D, in units of `embed_std`.
        pointer_recency: Head 3's attention logit for the latest position over one
            `pointer_recency * cos(distance * theta)` term; 0 for none.
        recency_pair: The RoPE pair of that term (pair 11 of 32: monotonic over ~360 tokens).
        freeze: Keep the previous-token and induction heads fixed during training
            (only their q/k rows otherwise).
        seed: Seed of the random projections.

    Returns:
        Gradient hooks that keep the frozen parts fixed; call `.remove()` on each
        when training ends.
    """
    cfg = model.config
    hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    if (cfg.hidden_size, hd, nh, nkv) != (256, 64, 4, 2) or cfg.num_hidden_layers < 2:
        raise ValueError(
            f"the copy circuit is laid out for hidden 256, 4 heads of 64, 2 kv heads, >= 2 layers; got hidden "
            f"{cfg.hidden_size}, {nh} heads of {hd}, {nkv} kv heads, {cfg.num_hidden_layers} layers"
        )
    half = hd // 2
    theta = _rope_base(cfg) ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)  # (32,) RoPE frequencies
    g = torch.Generator().manual_seed(seed)
    layers = model.model.layers
    eye = torch.eye(64)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight  # (V, 256)
        emb.zero_()
        emb[:, _A] = torch.randn(emb.shape[0], 64, generator=g) * embed_std
        if twins:
            plain, spaced = (torch.tensor(ids) for ids in zip(*twins))
            emb[spaced, _A] = emb[plain, _A]
            space_dir = torch.randn(64, generator=g)
            emb[spaced, _D] = space_gain * embed_std * space_dir / space_dir.norm() * math.sqrt(64)
        for layer in layers:  # every block starts as the identity...
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()

        # ...except the circuit. Layer 0: heads 0, 1 look back 1 and 2 tokens.
        at = layers[0].self_attn
        a = math.sqrt(position_logit * math.sqrt(hd) / position_pairs)  # sum_p a^2 / sqrt(hd) = position_logit
        k_bias = torch.zeros(hd, dtype=torch.float64)
        k_bias[:position_pairs] = a
        at.k_proj.weight[0:hd] = 0
        at.k_proj.bias[0:hd] = k_bias.float()
        for head, offset in ((0, 1), (1, 2)):
            # q.k = sum_p a^2 cos((t - s - offset) theta_p): largest at s = t - offset.
            q_bias = torch.zeros(hd, dtype=torch.float64)
            angle = -offset * theta[:position_pairs]
            q_bias[:position_pairs] = a * torch.cos(angle)
            q_bias[half : half + position_pairs] = a * torch.sin(angle)
            rows = slice(head * hd, (head + 1) * hd)
            at.q_proj.weight[rows] = 0
            at.q_proj.bias[rows] = q_bias.float()
        at.v_proj.weight[0:hd] = 0
        at.v_proj.weight[0:hd, _A] = eye  # value = token identity
        at.v_proj.bias[0:hd] = 0
        at.o_proj.weight[_B, 0:hd] = prev_gain * embed_std * eye  # head 0 -> B (token t-1)
        at.o_proj.weight[_C, hd : 2 * hd] = prev_gain * embed_std * eye  # head 1 -> C (token t-2)

        # Layer 1: head 2 matches (A_t, B_t) against (B_s, C_s) on the slowest RoPE pairs.
        at = layers[1].self_attn
        static = [p for p in range(static_pair_from, half)] + [p + half for p in range(static_pair_from, half)]
        proj = torch.randn(len(static), 64, generator=g) / math.sqrt(64)
        q0, k0 = 2 * hd, hd  # query head 2 uses key/value head 1
        at.q_proj.weight[q0 : q0 + hd] = 0
        at.q_proj.bias[q0 : q0 + hd] = 0
        at.k_proj.weight[k0 : k0 + hd] = 0
        at.k_proj.bias[k0 : k0 + hd] = 0
        n_first = len(static) // 2
        for i, d in enumerate(static):
            q_src, k_src = (_A, _B) if i < n_first else (_B, _C)
            at.q_proj.weight[q0 + d, q_src] = match_gain * proj[i]
            at.k_proj.weight[k0 + d, k_src] = proj[i]
        at.v_proj.weight[k0 : k0 + hd] = 0
        at.v_proj.weight[k0 : k0 + hd, _A] = eye
        at.v_proj.bias[k0 : k0 + hd] = 0
        at.o_proj.weight[_A, q0 : q0 + hd] = copy_gain * embed_std * eye

        # Pointer heads: query head 3 shares head 2's keys (the two tokens before s) and values (token s);
        # query heads 0 and 1 get a copy of them in key/value head 0. Their queries are left to the SFT.
        # Their outputs start as a copy into A, so the queries get gradient from the first step (with a
        # zero o_proj they would sit on a saddle).
        at.k_proj.weight[0:hd] = at.k_proj.weight[k0 : k0 + hd]
        at.k_proj.bias[0:hd] = 0
        at.v_proj.weight[0:hd] = at.v_proj.weight[k0 : k0 + hd]
        at.v_proj.bias[0:hd] = 0
        for head in (0, 1, 3):
            rows = slice(head * hd, (head + 1) * hd)
            at.q_proj.weight[rows] = 0
            at.q_proj.bias[rows] = 0
            at.o_proj.weight[_A, rows] = pointer_gain * embed_std * eye
        if pointer_recency:
            # Head 3: q.k gains pointer_recency * cos((t - s) theta_r) from constant biases on pair r (RoPE
            # rotates them by t and s). Head 2's query is zero on that pair: the induction head is unchanged.
            b = math.sqrt(pointer_recency * math.sqrt(hd))
            at.k_proj.bias[k0 + recency_pair] = b
            at.q_proj.bias[3 * hd + recency_pair] = b

    return [p.register_hook(lambda grad, idx=idx: _zero(grad, idx)) for p, idx in frozen_parts(model, freeze)]


def frozen_parts(model: Any, freeze: bool = True) -> list[tuple[torch.nn.Parameter, Any]]:
    """The circuit's parameters the SFT keeps fixed, each with the index of the fixed part.

    Always the previous-token heads' q/k rows (their attention comes from RoPE alone);
    with `freeze`, also their values and outputs and the induction head's q/k/v rows and
    output columns (o_proj is (out, in): a head's output is a block of input columns).
    Pointer head 3 shares the induction head's keys and values, so only its query and
    output learn.
    """
    hd = model.config.head_dim
    a0, a1 = model.model.layers[0].self_attn, model.model.layers[1].self_attn
    rows = [(a0.q_proj, slice(0, 2 * hd)), (a0.k_proj, slice(0, hd))]
    cols = []
    if freeze:
        rows += [(a0.v_proj, slice(0, hd)), (a1.q_proj, slice(2 * hd, 3 * hd)), (a1.k_proj, slice(hd, 2 * hd)),
                 (a1.v_proj, slice(hd, 2 * hd))]  # fmt: skip
        cols = [(a0.o_proj, slice(0, 2 * hd)), (a1.o_proj, slice(2 * hd, 3 * hd))]
    return [(p, idx) for lin, idx in rows for p in (lin.weight, lin.bias)] + [
        (lin.weight, (slice(None), idx)) for lin, idx in cols
    ]


def _zero(grad: torch.Tensor, idx: Any) -> torch.Tensor:
    grad = grad.clone()
    grad[idx] = 0
    return grad
