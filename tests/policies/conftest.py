"""A very small random Qwen2 and a byte-level tokenizer for tests of policy mechanics."""

from __future__ import annotations

import pytest

TAGS = ["<search>", "</search>", "<python>", "</python>", "<answer>", "</answer>"]


def make_small_tokenizer():
    """Byte-level BPE (~400 tokens) with ChatML specials and the tool tags as single tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = ["the quick brown fox jumps over the lazy dog 0123456789 search python answer result"] * 20
    tok.train_from_iterator(text, trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )


def make_small_model(vocab_size: int, seed: int = 0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    model = Qwen2ForCausalLM(cfg).eval()
    # Sharper logits than the init's near-uniform ones, so samples and stops vary.
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(2.0)
    return model


@pytest.fixture(scope="module")
def small_tokenizer():
    return make_small_tokenizer()


@pytest.fixture
def small_policy(small_tokenizer):
    from agentenv.policies.hf import HFPolicy, HFPolicyConfig

    model = make_small_model(len(small_tokenizer))
    # no kept caches: the mechanics tests run whole prefills (tests/policies/test_hf.py tests the kept ones)
    cfg = HFPolicyConfig(model="<in-memory>", device="cpu", prefix_cache_mb=0)
    return HFPolicy(cfg, model=model, tokenizer=small_tokenizer)


@pytest.fixture
def outlived():
    """`outlived(procs, timeout_s)`: pids of the psutil processes still running after `timeout_s`;
    those are killed before it returns, so none is left to the rest of the suite."""
    import os
    import signal
    import time

    import psutil

    def running(procs) -> list[int]:
        alive = []
        for p in procs:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    def check(procs, timeout_s: float) -> list[int]:
        deadline = time.monotonic() + timeout_s
        while running(procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = running(procs)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        return left

    return check
