"""The tiny model's architecture and its cold-start SFT (loss only on policy tokens)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

import torch

from agentenv.toy.tiny.config import TinyBuildConfig
from agentenv.toy.tiny.traces import Trace


def make_model(cfg: TinyBuildConfig, tokenizer: Any) -> Any:
    """A randomly initialised `Qwen2ForCausalLM` (fp32, tied embeddings, head_dim 64)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    mcfg = Qwen2Config(  # type: ignore[call-arg]  # head_dim and rope_theta are taken through **kwargs (not in the stubbed signature)
        vocab_size=len(tokenizer),  # exactly the tokenizer: no id the env would reject can be sampled
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=1e6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(cfg.seed)
    model = Qwen2ForCausalLM(mcfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def init_model(cfg: TinyBuildConfig, tokenizer: Any) -> tuple[Any, list[Any]]:
    """`make_model`, then the copy circuit when `cfg.copy_circuit`.

    Returns:
        (model, gradient hooks to remove when training ends).
    """
    model = make_model(cfg, tokenizer)
    hooks: list[Any] = []
    if cfg.copy_circuit:
        from agentenv.toy.tiny.circuits import install_copy_circuit, space_twins

        twins = space_twins(tokenizer) if cfg.space_twins else []
        hooks = install_copy_circuit(
            model, twins=twins, pointer_recency=cfg.pointer_recency, freeze=cfg.freeze_circuit, seed=cfg.seed
        )
    return model, hooks


def batches(traces: list[Trace], batch_tokens: int, rng: random.Random, shared: int = 0) -> list[list[Trace]]:
    """Shuffled batches of similar-length traces.

    A batch holds at most `batch_tokens` tokens, padding included and the
    `shared` prefix tokens (computed once per batch) not counted.
    """
    order = list(traces)
    rng.shuffle(order)
    out: list[list[Trace]] = []
    # Sort within windows of ~8 batches: little padding, still a mixed order.
    window = max(1, 8 * batch_tokens // max(1, max(len(t) for t in traces) - shared))
    for i in range(0, len(order), window):
        chunk = sorted(order[i : i + window], key=len)
        cur: list[Trace] = []
        for t in chunk:
            if cur and (len(cur) + 1) * (max(len(t), len(cur[-1])) - shared) > batch_tokens:
                out.append(cur)
                cur = []
            cur.append(t)
        if cur:
            out.append(cur)
    rng.shuffle(out)
    return out


def collate(batch: list[Trace], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (ids, attention_mask, loss_mask), each (B, T)."""
    width = max(len(t) for t in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    loss = torch.zeros((len(batch), width), dtype=torch.bool)
    for i, t in enumerate(batch):
        n = len(t)
        ids[i, :n] = torch.tensor(t.token_ids)
        attn[i, :n] = 1
        loss[i, :n] = torch.tensor(t.loss_mask, dtype=torch.bool)
    return ids, attn, loss


def copy_weights(ids: torch.Tensor, loss_mask: torch.Tensor, prefix_len: int, weight: float) -> torch.Tensor:
    """Per-token loss weights: `weight` on copied content, 1 on the other policy tokens, 0 elsewhere.

    Copied content: a policy token whose id occurs earlier in the question or a
    tool result (the context after the shared `prefix_len` tokens, the system
    prompt) and nowhere in that prefix: the names and numbers an answer has to
    carry over. They are a few percent of the policy tokens yet decide the
    reward, and learning where to copy them from is the slow part of the SFT.

    Args:
        ids: (B, T) token ids.
        loss_mask: (B, T) bool, True on policy tokens.
    Returns:
        (B, T) float weights.
    """
    w = loss_mask.float()  # (B, T)
    if weight == 1.0:
        return w
    in_prefix = set(ids[0, :prefix_len].tolist())
    for b in range(ids.shape[0]):
        seen: set[int] = set()
        row, mask = ids[b].tolist(), loss_mask[b].tolist()
        for t in range(prefix_len, len(row)):
            tok = row[t]
            if not mask[t]:
                if tok not in in_prefix:
                    seen.add(tok)
            elif tok in seen:
                w[b, t] = weight
    return w


def common_prefix(traces: list[Trace]) -> list[int]:
    """The longest token prefix every trace starts with (the system prompt and more)."""
    first = traces[0].token_ids
    n = min(len(t) for t in traces)
    for t in traces[1:]:
        ids = t.token_ids
        i = 0
        while i < n and ids[i] == first[i]:
            i += 1
        n = i
    return list(first[:n])


def sft_loss(
    model: Any,
    ids: torch.Tensor,
    attn: torch.Tensor,
    loss_mask: torch.Tensor,
    prefix: list[int] | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Next-token cross-entropy over the policy tokens, averaged with `weights` (B, T) when given.

    Only the positions that predict a policy token go through the LM head.
    With `prefix` (tokens every row starts with, holding no policy token), the
    prefix runs once and its keys/values are shared by the rows (expanded, so
    their gradients sum): the same loss and gradients as the full batch, for
    less compute.
    """
    from transformers import DynamicCache

    p = len(prefix) if prefix else 0
    if p and not bool(loss_mask[:, : p + 1].any()):
        pre = model.model(input_ids=torch.tensor([prefix]), use_cache=True).past_key_values
        b = ids.shape[0]
        kv = [(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in _layers(pre)]
        cache = DynamicCache(ddp_cache_data=kv) if not hasattr(DynamicCache, "from_legacy_cache") else (
            DynamicCache.from_legacy_cache(tuple(kv))
        )
        pos = torch.arange(p, ids.shape[1]).unsqueeze(0).expand(b, -1)  # (B, T-P)
        hidden = model.model(
            input_ids=ids[:, p:], attention_mask=attn, position_ids=pos, past_key_values=cache, use_cache=True
        ).last_hidden_state  # (B, T-P, H)
        shift = p + 1  # hidden[:, i] (position p + i) predicts token p + i + 1
    else:
        hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, T, H)
        shift = 1  # hidden[:, i] predicts token i + 1
    target = loss_mask[:, shift:]  # (B, T-shift): the predicted token is a policy token
    h = hidden[:, :-1][target]  # (N, H)
    labels = ids[:, shift:][target]  # (N,)
    logits = model.lm_head(h).float()  # (N, V)
    if weights is None:
        return torch.nn.functional.cross_entropy(logits, labels)
    w = weights[:, shift:][target]  # (N,)
    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="none")  # (N,)
    return (ce * w).sum() / w.sum()


def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def train_sft(
    model: Any,
    traces: list[Trace],
    cfg: TinyBuildConfig,
    pad_id: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Cold-start SFT: AdamW, linear warmup then cosine decay to 10% of `lr`.

    Returns:
        Stats: steps done, seconds, tokens seen, first and last losses, and
        whether the time cap stopped it early.
    """
    rng = random.Random(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.sft_steps - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    prefix = common_prefix(traces)  # the system prompt: computed once per batch, shared by its rows
    log(f"  sft: {len(traces)} traces, shared prefix {len(prefix)} tokens")
    model.train()
    t0 = time.perf_counter()
    queue: list[list[Trace]] = []
    losses: list[float] = []
    tokens = 0
    stopped_early = False
    step = 0
    for step in range(cfg.sft_steps):
        if not queue:
            queue = batches(traces, cfg.batch_tokens, rng, len(prefix))
        ids, attn, mask = collate(queue.pop(), pad_id)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        weights = copy_weights(ids, mask, len(prefix), cfg.copy_weight)
        loss = sft_loss(model, ids, attn, mask, prefix, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        tokens += int(attn.sum())
        elapsed = time.perf_counter() - t0
        if step % 25 == 0 or step == cfg.sft_steps - 1:
            recent = sum(losses[-25:]) / len(losses[-25:])
            log(
                f"  sft step {step + 1}/{cfg.sft_steps}  loss {recent:.3f}  lr {lr_at(step):.2e}  "
                f"{elapsed:.0f}s  {tokens / max(elapsed, 1e-9):.0f} tok/s"
            )
        if cfg.max_sft_seconds is not None and elapsed > cfg.max_sft_seconds:
            log(f"  sft stopped at step {step + 1}: over max_sft_seconds {cfg.max_sft_seconds:g}")
            stopped_early = True
            break
    model.eval()
    return {
        "steps": step + 1,
        "seconds": round(time.perf_counter() - t0, 1),
        "tokens": tokens,
        "loss_first": round(sum(losses[:10]) / max(1, len(losses[:10])), 4),
        "loss_last": round(sum(losses[-25:]) / max(1, len(losses[-25:])), 4),
        "stopped_early": stopped_early,
    }
