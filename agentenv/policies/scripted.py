"""ScriptedPolicy: a Policy that plays given turns. For tests and SFT trace making.

It behaves like a real sampler at the boundaries that matter to the env and
the rollout: it honours `max_tokens` (finish `length`), reports finish `stop`
when a turn ends with one of `params.stop`, otherwise ends the turn with EOS
(finish `eos`), and continues a partial turn when the prompt ends with one.
Logprobs and entropies are 0.0 (a deterministic sampler).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agentenv.types import Generation, SamplingParams, Tokenizer

TurnScript = Sequence[str] | Callable[[list[int]], str]


def _find(hay: list[int], needle: list[int], start: int) -> int:
    """Index of the first occurrence of `needle` in `hay[start:]`, or -1."""
    n = len(needle)
    if n == 0:
        return start
    first = needle[0]
    for i in range(start, len(hay) - n + 1):
        if hay[i] == first and hay[i : i + n] == needle:
            return i
    return -1


class ScriptedPolicy:
    """Plays scripted turns.

    Args:
        tokenizer: Encodes the turns (`encode(text, add_special_tokens=False)`).
        turns: Either the turns' texts in order, or a callable that gets the
            prompt ids (the episode's context) and returns the next turn's text.
            With a list, the policy is stateless: it finds how many turns are
            already in the context (in order) and plays the next one, so it is
            safe for concurrent episodes and forks. After the last turn it
            returns only EOS. Turns are found in order anywhere in the
            context, so a turn should not also occur verbatim in the prompt
            (e.g. a bare `<search>query</search>` shown by a system prompt).
        delay_s: Sleep this long in every `generate` (simulates a slow model).
    """

    def __init__(self, tokenizer: Tokenizer, turns: TurnScript, *, delay_s: float = 0.0):
        self.tokenizer = tokenizer
        self.weight_version = 0
        self._fn: Callable[[list[int]], str] | None = turns if callable(turns) else None
        self._turn_ids: list[list[int]] = (
            [] if self._fn is not None else [self._encode(t) for t in turns]  # type: ignore[union-attr]  # not callable here: a list of turns
        )
        self.delay_s = delay_s
        self.calls = 0
        self._eos: int | None = tokenizer.eos_token_id

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _locate(self, prompt: list[int]) -> tuple[int, int]:
        """(index of the turn to play, tokens of it already at the end of the prompt)."""
        pos = 0
        for i, turn in enumerate(self._turn_ids):
            j = _find(prompt, turn, pos)
            if j < 0:
                tail = prompt[pos:]
                for k in range(min(len(turn) - 1, len(tail)), 0, -1):
                    if tail[-k:] == turn[:k]:
                        return i, k
                return i, 0
            pos = j + len(turn)
        return len(self._turn_ids), 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """The next scripted turn (or its rest), cut at `params.max_tokens`."""
        self.calls += 1
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        prompt = list(prompt_ids)
        if self._fn is not None:
            turn, done = self._encode(self._fn(prompt)), 0
        else:
            i, done = self._locate(prompt)
            turn = self._turn_ids[i] if i < len(self._turn_ids) else []
        rest = turn[done:]
        if len(rest) > params.max_tokens:
            return self._gen(rest[: params.max_tokens], "length")
        text = self.tokenizer.decode(turn, skip_special_tokens=False)
        stop = next((s for s in params.stop if text.endswith(s)), None)
        if stop is not None and rest:
            return self._gen(rest, "stop", stop)
        if rest and self._eos is not None and rest[-1] == self._eos:
            return self._gen(rest, "eos")
        if params.include_eos and self._eos is not None:
            if len(rest) + 1 > params.max_tokens:
                return self._gen(rest, "length")
            return self._gen(rest + [self._eos], "eos")
        return self._gen(rest, "eos")

    def _gen(self, ids: list[int], finish: str, stop: str | None = None) -> Generation:
        n = len(ids)
        return Generation(list(ids), [0.0] * n, [0.0] * n, finish, stop, versions=[self.weight_version] * n)  # type: ignore[arg-type]  # finish is one of the FinishReason literals by the callers

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Nothing to load (the script is the policy); the version still counts the pushes."""
        self.weight_version += 1
