"""The tiny model's architecture and its cold-start SFT (loss only on policy tokens)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

import torch

from agentenv.policies.tiny.config import TinyBuildConfig
from agentenv.policies.tiny.traces import Trace


def make_model(cfg: TinyBuildConfig, tokenizer: Any) -> Any:
    """A randomly initialised `Qwen2ForCausalLM` (fp32, tied embeddings, head_dim 64)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    mcfg = Qwen2Config(
        vocab_size=len(tokenizer),  # exactly the tokenizer: no id the env would reject can be sampled
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=10000.0,
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


def batches(traces: list[Trace], batch_tokens: int, rng: random.Random) -> list[list[Trace]]:
    """Shuffled batches of similar-length traces, each within `batch_tokens` (padding included)."""
    order = list(traces)
    rng.shuffle(order)
    out: list[list[Trace]] = []
    # Sort within windows of ~8 batches: little padding, still a mixed order.
    window = max(1, 8 * batch_tokens // max(1, max(len(t) for t in traces)))
    for i in range(0, len(order), window):
        chunk = sorted(order[i : i + window], key=len)
        cur: list[Trace] = []
        for t in chunk:
            if cur and (len(cur) + 1) * max(len(t), len(cur[-1])) > batch_tokens:
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


def sft_loss(model: Any, ids: torch.Tensor, attn: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the policy tokens.

    Only the positions that predict a policy token go through the LM head.
    """
    hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, T, H)
    target = loss_mask[:, 1:]  # (B, T-1): token t+1 is a policy token
    h = hidden[:, :-1][target]  # (N, H)
    logits = model.lm_head(h).float()  # (N, V)
    return torch.nn.functional.cross_entropy(logits, ids[:, 1:][target])


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

    model.train()
    t0 = time.perf_counter()
    queue: list[list[Trace]] = []
    losses: list[float] = []
    tokens = 0
    stopped_early = False
    step = 0
    for step in range(cfg.sft_steps):
        if not queue:
            queue = batches(traces, cfg.batch_tokens, rng)
        ids, attn, mask = collate(queue.pop(), pad_id)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = sft_loss(model, ids, attn, mask)
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
        if elapsed > cfg.max_sft_seconds:
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
