"""The tiny model's tokenizer: byte-level BPE trained on the toy tasks' text.

Digits are split one per token (so copying a number is copying digits), the
tool tags are single added tokens (not special: they survive
`decode(skip_special_tokens=True)`, which the env parses), and the ChatML
specials `<|im_start|>`, `<|im_end|>` (EOS) and `<|endoftext|>` (pad) are
special tokens. The chat template is ChatML.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

TAGS = (
    "<think>", "</think>", "<search>", "</search>", "<python>", "</python>",
    "<result>", "</result>", "<answer>", "</answer>",
)  # fmt: skip
PAD, BOS, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIALS = (PAD, BOS, EOS)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


TEXT_SEED_OFFSET = 7919
"""The BPE learns from a toy world of another seed (and a 4x larger knowledge base),
so no name of the train or held-out worlds is frequent enough to become one
token: every world's names split into the same generic syllable pieces."""


def training_texts(seed: int) -> Iterator[str]:
    """Text the BPE is trained on: prompts, reference turns, results, and a corpus."""
    from agentenv.toy.tasks import TOY_SYSTEM_PROMPT, ToyConfig, build_toy_suite, reference_turns

    suite = build_toy_suite(ToyConfig(seed=seed + TEXT_SEED_OFFSET).with_kb_scale(4))
    yield f"{BOS}system\n{TOY_SYSTEM_PROMPT}{EOS}\n"
    for task in suite.train:
        yield f"{BOS}user\n{task.question}{EOS}\n{BOS}assistant\n"
        yield from reference_turns(task)
        yield f"<result>\n{task.ground_truth}\n</result>"
    for i, rec in enumerate(suite.kb.passages):
        yield f"Page {i % 10 + 1}: {rec['title']}\n{rec['text']}\n\n"


def train_tokenizer(seed: int = 0, vocab_size: int = 2048) -> Any:
    """Train the byte-level BPE and wrap it as a `PreTrainedTokenizerFast`.

    Deterministic: the same seed and size give the same vocabulary.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_texts(seed), trainer)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TAGS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        additional_special_tokens=[BOS],
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast
