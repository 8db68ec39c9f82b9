"""Prompt text and rendering through a real (locally built) tokenizer."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from agentenv.tasks.prompts import ARPO_SYSTEM_PROMPT, render_prompt, render_prompt_text
from agentenv.toy.tasks import TOY_SYSTEM_PROMPT

VALID = "/work/shared/data/arpo/valid.parquet"

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_tokenizer(chat_template: str | None):
    """A byte-level BPE tokenizer trained here on a few lines, ChatML specials added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TOY_SYSTEM_PROMPT, "What is 4821 * 917?", "system user assistant"], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    fast.chat_template = chat_template
    return fast


def test_arpo_prompt_matches_data_with_backspace_repaired():
    raw = pq.read_table(VALID, columns=["prompt"]).column("prompt")[0].as_py()[0]["content"]
    assert "\x08" in raw  # the published defect is still there, so the repair matters
    assert raw.replace("\x08", "\\b") == ARPO_SYSTEM_PROMPT
    assert "\x08" not in ARPO_SYSTEM_PROMPT
    assert ARPO_SYSTEM_PROMPT.count("\\boxed{") == 2


def test_toy_prompt_is_short_and_names_every_tag():
    assert len(TOY_SYSTEM_PROMPT.split()) <= 45
    for tag in ("<think></think>", "<search>query</search>", "<python>code</python>", "<result></result>"):
        assert tag in TOY_SYSTEM_PROMPT
    assert "<answer>\\boxed{...}</answer>" in TOY_SYSTEM_PROMPT


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 4821 * 917?"}]


def test_render_uses_chat_template():
    tok = _byte_tokenizer(CHATML)
    text = render_prompt_text(tok, MESSAGES)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 4821 * 917?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = render_prompt(tok, MESSAGES)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 2
    assert tok.decode(ids) == text


def test_render_fallback_without_template():
    tok = _byte_tokenizer(None)
    text = render_prompt_text(tok, MESSAGES)
    assert text == "system: Be brief.\nuser: What is 4821 * 917?\nassistant:"
    assert tok.decode(render_prompt(tok, MESSAGES)) == text


@pytest.mark.parametrize("template", [CHATML, None])
def test_render_returns_plain_int_list(template):
    ids = render_prompt(_byte_tokenizer(template), MESSAGES)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
