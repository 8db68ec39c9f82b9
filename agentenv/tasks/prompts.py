"""System prompts and prompt rendering (chat template -> token ids)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentenv.types import Tokenizer

# ARPO's system prompt, as published in its verl parquet data, with the literal
# backspace (`\x08`) that stood where `\b` of `\boxed` was meant repaired.
ARPO_SYSTEM_PROMPT = (
    "You are a helpful assistant that can solve the given question step by step with the help of the "
    "wikipedia search tool and python interpreter tool. Given a question, you need to first think about "
    "the reasoning process in the mind and then provide the answer. During thinking, you can invoke the "
    "wikipedia search tool to search and python interpreter tool to calculate the math problem for fact "
    "information about specific topics if needed. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags respectively, and the search query and result are "
    "enclosed within <search> </search> and <result> </result> tags respectively. For example, "
    "<think> This is the reasoning process. </think> <search> search query here </search> "
    "<result> search result here </result> <think> This is the reasoning process. </think> "
    "<python> python code here </python> <result> python interpreter result here </result> "
    "<think> This is the reasoning process. </think> <answer> The final answer is \\[ \\boxed{answer here} "
    "\\] </answer>. In the last part of the answer, the final exact answer is enclosed within \\boxed{} "
    "with latex format."
)

def _fallback_render(messages: Sequence[Mapping[str, str]]) -> str:
    """`role: content` lines, then the open assistant turn (holding a prefill, if the last message is one)."""
    prefill = messages[-1]["content"] if is_prefilled(messages) else ""
    lines = [f"{m['role']}: {m['content']}" for m in messages[: len(messages) - bool(prefill)]]
    return "\n".join(lines) + "\nassistant:" + prefill


def is_prefilled(messages: Sequence[Mapping[str, str]]) -> bool:
    """Whether the messages end with an assistant message: the start of the response, which the policy continues."""
    return bool(messages) and messages[-1].get("role") == "assistant"


def render_prompt_text(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, str]], chat_template: str | None = None, **template_kwargs: Any
) -> str:
    """The prompt as text: the chat template, or a plain fallback.

    Args:
        tokenizer: A transformers tokenizer (or anything with `encode`). May be None
            for the plain rendering.
        messages: Chat messages, `{"role": ..., "content": ...}`.
        chat_template: Jinja text used instead of the tokenizer's own.
        **template_kwargs: Further template variables (e.g. `enable_thinking`).

    Returns:
        The rendered prompt, ending where the assistant's reply begins; when the
        last message is the assistant's (a prefill), ending after its text.
    """
    msgs = [dict(m) for m in messages]
    if tokenizer is not None and (chat_template or tokenizer.chat_template):
        if chat_template is not None:
            template_kwargs["chat_template"] = chat_template
        cont = is_prefilled(msgs)
        return tokenizer.apply_chat_template(
            msgs, add_generation_prompt=not cont, continue_final_message=cont, tokenize=False, **template_kwargs
        )
    return _fallback_render(msgs)


def render_prompt(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, str]], chat_template: str | None = None, **template_kwargs: Any
) -> list[int]:
    """Render chat messages to prompt token ids, ready for generation.

    Uses the chat template (with the generation prompt) where there is one,
    else `system: ...\nuser: ...\nassistant:`. The text is encoded without
    extra special tokens: the template already holds the ones it wants.

    Args:
        tokenizer: A transformers tokenizer.
        messages: Chat messages, `{"role": ..., "content": ...}`.
        chat_template: Jinja text used instead of the tokenizer's own.
        **template_kwargs: Further template variables.

    Returns:
        The prompt token ids.
    """
    text = render_prompt_text(tokenizer, messages, chat_template, **template_kwargs)
    return list(tokenizer.encode(text, add_special_tokens=False))
