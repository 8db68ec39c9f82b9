"""The chat template an env renders with, and the check that its incremental context equals a rendering from scratch.

`env.chat_template` picks the template: None (the tokenizer's own), the name of
one packaged in `agentenv/envs/templates/` (`chatml_hermes`: ChatML with
hermes-style tools), or a path to a Jinja file. `env.chat_template_kwargs` go
to every rendering (e.g. Qwen3's `enable_thinking: false`).

The env never re-tokenizes what the policy wrote: each turn's tokens are
appended as sampled, and the env appends the template's own text between turns.
`check_from_scratch` verifies that this equals what the template renders for
the whole conversation: the same text, and every piece the env appended
(prompt, tool turns) tokenized exactly as the template's text tokenizes alone.
The policy's pieces are compared as text: they are its own tokens, never
re-tokenized, so a sampled split that differs from the tokenizer's own is not
an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from agentenv.errors import ConfigError
from agentenv.types import Segment, Tokenizer

TEMPLATES_DIR = Path(__file__).parent / "templates"


def packaged_templates() -> list[str]:
    """Names of the templates shipped with agentenv (`env.chat_template: <name>`)."""
    return sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))


def load_chat_template(spec: str | None, key: str = "env.chat_template") -> tuple[str | None, str | None]:
    """(Jinja text, name) of `env.chat_template`; (None, None) for the tokenizer's own.

    Raises:
        ConfigError: Neither a packaged template nor a readable file.
    """
    if spec is None:
        return None, None
    packaged = TEMPLATES_DIR / f"{spec}.jinja"
    if "/" not in spec and packaged.is_file():
        return packaged.read_text(), spec
    path = Path(spec).expanduser()
    if path.is_file():
        return path.read_text(), str(path)
    raise ConfigError(
        key, f"{spec!r} is neither a packaged template ({', '.join(packaged_templates())}) nor a Jinja file"
    )


@dataclass
class ChatTemplate:
    """A tokenizer with the template and options every rendering of an env uses.

    Attributes:
        tokenizer: The policy's tokenizer.
        template: Jinja text; None: the tokenizer's own.
        name: How errors name the template.
        kwargs: Extra template variables (`env.chat_template_kwargs`).
        tools: Function schemas given to the template as `tools` (None: not given).
    """

    tokenizer: Tokenizer
    template: str | None = None
    name: str = ""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None

    @classmethod
    def from_config(cls, tokenizer: Tokenizer, spec: str | None, kwargs: Mapping[str, Any]) -> ChatTemplate:
        template, name = load_chat_template(spec)
        if name is None:
            name = f"the chat template of {tokenizer.name_or_path or type(tokenizer).__name__}"
        else:
            name = f"chat template {name!r}"
        return cls(tokenizer, template, name, dict(kwargs))

    @property
    def available(self) -> bool:
        """Whether there is a template at all (given, or the tokenizer's own)."""
        return self.template is not None or bool(self.tokenizer.chat_template)

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool, tools: bool = True
    ) -> str:
        """The template's text of `messages` (with the env's tools and kwargs).

        With `add_generation_prompt`, it ends where the assistant writes next:
        after the generation prompt, or after the text of a final assistant
        message (a prefill the policy continues).
        """
        extra: dict[str, Any] = dict(self.kwargs)
        if add_generation_prompt and messages and messages[-1].get("role") == "assistant":
            add_generation_prompt, extra["continue_final_message"] = False, True
        if tools and self.tools is not None:
            extra["tools"] = self.tools
        if self.template is not None:
            extra["chat_template"] = self.template
        try:
            return cast(str, self.tokenizer.apply_chat_template(  # tokenize=False: the text
                [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=False, **extra
            ))
        except Exception as e:  # noqa: BLE001 - a template can fail any way (jinja errors, raise_exception)
            raise ConfigError("env.chat_template", f"{self.name} failed to render: {type(e).__name__}: {e}") from e

    def encode(self, text: str) -> list[int]:
        """Token ids of template text: its special tokens honored, none added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def decode(self, ids: Sequence[int]) -> str:
        """The exact text of token ids (special tokens kept, no clean-up)."""
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text

    def ignores_tools(self) -> bool:
        """Whether the template renders the same with and without `tools` (it has no tool support)."""
        if not self.tools:
            return False
        probe = [{"role": "user", "content": "hi"}]
        return self.render(probe, add_generation_prompt=True) == self.render(
            probe, add_generation_prompt=True, tools=False
        )


def _snippet(text: str, at: int, width: int = 40) -> str:
    return repr(text[max(0, at - width) : at + width])


def check_from_scratch(chat: ChatTemplate, segments: Sequence[Segment], rendered: str) -> None:
    """Check that the context's segments are a prefix of `rendered`, the template's text of the whole conversation.

    Each segment's text must continue `rendered` where the previous one ended;
    each prompt or tool segment must also be exactly the tokens its text
    encodes to alone. Policy segments are compared as text only (see the module
    docstring).

    Raises:
        ConfigError: Naming the template, the segment and where the texts part.
    """
    pos = 0
    for i, seg in enumerate(segments):
        text = chat.decode(seg.token_ids)
        want = rendered[pos : pos + len(text)]
        if want != text:
            at = next((j for j, (a, b) in enumerate(zip(text, want)) if a != b), min(len(text), len(want)))
            raise ConfigError(
                "env.chat_template",
                f"{chat.name} renders the conversation differently from scratch than turn by turn, so the "
                f"context would not be what the model sees when the same conversation is rendered whole: "
                f"segment {i} ({seg.source}) at character {pos + at}: the env has {_snippet(text, at)}, the "
                f"template renders {_snippet(want, at)}. Use a template that renders earlier turns verbatim "
                f"(env.chat_template; e.g. chatml_hermes)",
            )
        if seg.source != "policy":
            alone = chat.encode(text)
            if alone != list(seg.token_ids):
                at = next((j for j, (a, b) in enumerate(zip(alone, seg.token_ids)) if a != b), 0)
                raise ConfigError(
                    "env.chat_template",
                    f"segment {i} ({seg.source}) of the context is not how {chat.name}'s text tokenizes from "
                    f"scratch: token {at} is {list(seg.token_ids)[at:at + 3]}, from scratch {alone[at:at + 3]} "
                    f"(text {_snippet(text, len(chat.decode(alone[:at])))})",
                )
        pos += len(text)
