"""What the model backends (hf, vLLM) share: the prompt check, stop strings, counters and lifetime.

A backend subclasses `PolicyBackend` and implements `generate` and
`load_weights` (the `Policy` protocol); it keeps its counters in a
`BackendStats` dataclass (its own extends it), which `metrics()` reports.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Self

from agentenv.types import Tokenizer


@dataclass
class BackendStats:
    """Counters every backend keeps since start (or `reset_metrics`); a backend's own extend them."""

    requests: int = 0
    """Finished `generate` calls."""
    generated_tokens: int = 0


def load_hf_tokenizer(model: str, tokenizer: str | None) -> Tokenizer:
    """The transformers tokenizer at `tokenizer` (None: the model's own)."""
    from transformers import AutoTokenizer

    loaded: Tokenizer = AutoTokenizer.from_pretrained(tokenizer or model)
    return loaded


class PolicyBackend:
    """The base of the model backends: a `Policy` with counters (`HasMetrics`) and a `close` (`Closeable`).

    Attributes:
        tokenizer: The model's tokenizer.
        weight_version: 0 as built, one more per weight push.
        max_model_len: The model's context length; a prompt must leave room for a token.
        stats: The backend's counters.
    """

    tokenizer: Tokenizer
    weight_version: int
    max_model_len: int
    stats: BackendStats

    def _check_prompt(self, prompt_ids: list[int]) -> list[int]:
        """The prompt as ints, or ValueError when it is empty or leaves no room in the model's context."""
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("generate() needs a non-empty prompt")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; the model's context is {self.max_model_len} "
                "(the env's context budget should end the episode before this)"
            )
        return prompt_ids

    def _find_stop(self, token_ids: list[int], stops: tuple[str, ...]) -> str | None:
        """The stop string that the last token completed, if any.

        Called after every token, so a stop string first shows up in the tail
        window when its last token lands. The window covers the longest stop
        string (a character is at most 4 byte-level tokens). Several at once:
        the one that starts first wins.
        """
        window = 4 * max(len(s) for s in stops) + 4
        text = self.tokenizer.decode(token_ids[-window:], skip_special_tokens=False)
        found = [(text.find(s), s) for s in stops if s in text]
        return min(found)[1] if found else None

    def metrics(self) -> dict[str, float]:
        """The counters (`stats`) since start or `reset_metrics`, as floats."""
        return {k: float(v) for k, v in dataclasses.asdict(self.stats).items()}

    def reset_metrics(self) -> None:
        self.stats = type(self.stats)()

    def close(self) -> None:
        """Free what the backend holds (processes, memory). Idempotent; nothing by default."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
