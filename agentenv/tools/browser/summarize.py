"""Condense a selected passage into what the goal needs, with a language model.

`PolicySummarizer` drives any `Policy` (the tiny model, hf, vLLM);
`EndpointSummarizer` calls an OpenAI-compatible chat endpoint (a vLLM server,
a hosted model). Both bound the summary in tokens. A summarizer that fails is
an infrastructure fault (`ToolError`), not the agent's.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentenv.errors import ToolError
from agentenv.tools.sessions import LoopSessions
from agentenv.types import Generation, SamplingParams, Tokenizer

if TYPE_CHECKING:  # pragma: no cover
    import aiohttp

SYSTEM_PROMPT = "You read web pages for a research assistant and report only what the page says."
NOTHING_RELEVANT = "No relevant information."
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


@runtime_checkable
class Generator(Protocol):
    """What a summarizer needs of a model: a `Policy`'s tokenizer and `generate` (tools import no policy)."""

    tokenizer: Tokenizer

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation: ...


@runtime_checkable
class KnowsContext(Protocol):
    """A model that says its context length (the hf and vLLM backends do)."""

    max_model_len: int


@runtime_checkable
class Summarizer(Protocol):
    """Turns a passage into the information relevant to a goal."""

    async def summarize(self, goal: str, title: str, url: str, passage: str) -> str: ...


def summary_request(goal: str, title: str, url: str, passage: str) -> str:
    """The user message asking for the information relevant to `goal`."""
    goal = goal.strip() or "Summarize the main content of the page."
    return (
        f"Goal: {goal}\n\n"
        f"Web page: {title or '(untitled)'}\nURL: {url}\n\n"
        f"Page content:\n{passage}\n\n"
        "Write down the information from this page that is relevant to the goal: facts, names, numbers and "
        "dates exactly as the page gives them, briefly. Do not add anything the page does not say. "
        f"If the page has nothing relevant, answer: {NOTHING_RELEVANT}"
    )


def clean_summary(text: str) -> str:
    """Drop reasoning (`<think>...</think>`, an unclosed `<think>...`, or everything
    before a lone `</think>` when the chat template opened the block) and outer whitespace."""
    text = _THINK.sub("", text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text.strip()


class PolicySummarizer:
    """Summarize with a `Policy`, rendering the prompt with `policy.tokenizer`.

    Args:
        policy: Any Policy (its tokenizer's chat template is used when it has one).
        max_tokens: Most tokens in the summary.
        input_tokens: Most tokens of the passage put into the prompt (cut to fit).
        temperature: Sampling temperature (0 = greedy).
        seed: Sampling seed (the same passage and goal give the same summary).
    """

    def __init__(self, policy: Generator, max_tokens: int = 512, input_tokens: int = 3072, temperature: float = 0.0, seed: int = 0):
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
        self.input_tokens = input_tokens

    def prompt_ids(self, goal: str, title: str, url: str, passage: str) -> list[int]:
        """The prompt as token ids, the passage cut to `input_tokens`.

        When the model's context is known (the policy's `max_model_len`, else
        the tokenizer's `model_max_length`), the passage is also cut so that
        prompt plus summary fit in it.

        Raises:
            ToolError: Even an empty passage leaves no room for the summary.
        """
        tok = self.tokenizer
        budget = self.input_tokens
        limit = (self.policy.max_model_len if isinstance(self.policy, KnowsContext) else None) or tok.model_max_length
        if isinstance(limit, int) and limit < 10**7:  # HF's "unknown" is ~1e30
            room = limit - len(self._render(goal, title, url, "")) - self.params.max_tokens - 4
            if room < 16:
                raise ToolError(
                    f"the summarizer's context ({limit} tokens) leaves no room for a page: lower "
                    f"browse.summary_max_tokens ({self.params.max_tokens})"
                )
            budget = min(budget, room)
        ids = _encode(tok, passage)
        if len(ids) > budget:
            passage = tok.decode(ids[:budget], skip_special_tokens=True) + " ..."
        return self._render(goal, title, url, passage)

    def _render(self, goal: str, title: str, url: str, passage: str) -> list[int]:
        tok = self.tokenizer
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": summary_request(goal, title, url, passage)},
        ]
        if tok.chat_template:
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = f"{SYSTEM_PROMPT}\n\n{messages[1]['content']}\n\nRelevant information:"
        return _encode(tok, text)

    async def summarize(self, goal: str, title: str, url: str, passage: str) -> str:
        ids = self.prompt_ids(goal, title, url, passage)
        try:
            gen = await self.policy.generate(ids, self.params)
        except Exception as e:
            raise ToolError(
                f"the browser's summarizer model failed ({type(e).__name__}: {e}). Check the summarizer policy "
                "(its server, or whether the prompt fits: lower browse.summary_input_tokens)."
            ) from e
        return clean_summary(self.tokenizer.decode(gen.token_ids, skip_special_tokens=True))


def _encode(tok: Tokenizer, text: str) -> list[int]:
    # verbose=False: a page longer than the model's context is expected here (it is cut next).
    try:
        ids: list[int] = tok.encode(text, add_special_tokens=False, verbose=False)
    except TypeError:  # a tokenizer without the HF keyword
        ids = tok.encode(text, add_special_tokens=False)
    return ids


class EndpointSummarizer:
    """Summarize through an OpenAI-compatible `/chat/completions` endpoint.

    Args:
        base_url: Endpoint root, e.g. `http://127.0.0.1:8000/v1`.
        model: Model name the server expects.
        api_key_env: Environment variable holding the key (none sent when unset).
        max_tokens: Most tokens in the summary (`max_tokens` of the request).
        input_chars: Most characters of the passage sent.
        temperature: Sampling temperature.
        timeout_s: Limit of one request.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        max_tokens: int = 512,
        input_chars: int = 12000,
        temperature: float = 0.0,
        timeout_s: float = 120.0,
    ):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.max_tokens = max_tokens
        self.input_chars = input_chars
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.sessions = LoopSessions(self._new_session)

    def _new_session(self) -> aiohttp.ClientSession:
        import aiohttp

        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def summarize(self, goal: str, title: str, url: str, passage: str) -> str:
        import aiohttp

        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": summary_request(goal, title, url, passage[: self.input_chars])},
            ],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        headers = {}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        try:
            async with self.sessions.get().post(self.url, json=body, headers=headers) as resp:
                if resp.status != 200:
                    detail = (await resp.text())[:200]
                    raise ToolError(
                        f"summarizer endpoint {self.url} answered HTTP {resp.status}: {detail!r}. "
                        f"Check the url, the model name {self.model!r} and the key in ${self.api_key_env}."
                    )
                payload = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ToolError(f"summarizer endpoint {self.url} unreachable ({type(e).__name__}: {e}); is the server up?") from e
        try:
            content = payload["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as e:
            raise ToolError(f"summarizer endpoint {self.url} sent an unexpected answer: {str(payload)[:200]}") from e
        return clean_summary(content)

    async def aclose(self) -> None:
        await self.sessions.aclose()
