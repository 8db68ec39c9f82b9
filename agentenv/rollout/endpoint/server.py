"""The OpenAI-compatible endpoint over a policy: `/v1/chat/completions`, `/v1/models`, on aiohttp.

Each episode gets its own random API key (`Endpoint.open_episode`); the key is
the episode's name, so one episode's requests cannot add to, read or end
another's trajectories. A request is answered by `policy.generate` on the
exact token ids of its trajectory (`agentenv.rollout.endpoint.recorder`), and
its answer, ids, logprobs and entropies are recorded. Errors have OpenAI's
shape (`{"error": {"message", "type", "param", "code"}}`) and change nothing:

- 400 malformed JSON, messages, tools or parameters; `context_length_exceeded`;
- 401 a missing or unknown key (`invalid_api_key`); 409 a key whose episode ended (`episode_ended`);
- 403 a client that is not on loopback (unless `rollout.endpoint.allow_remote`);
- 404 an unknown model (`model_not_found`) or route; 504 the policy timed out.

`stream: true` is answered once the completion is whole, as one chunk (then
its finish reason, its usage if `stream_options.include_usage`, and `[DONE]`),
for clients that only stream.

Sampling follows the run (`policy.temperature`, `top_p`, `top_k`: the loss
assumes them); a request's `max_tokens`/`max_completion_tokens` can only lower
`policy.max_turn_tokens`, its `stop` strings are honored, and its
`temperature`, `top_p` and `seed` are ignored (request i of an episode samples
with a seed derived from the episode's).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from agentenv.envs.chat import ChatTemplate
from agentenv.policies.base import Policy
from agentenv.rollout.endpoint.config import EndpointConfig
from agentenv.rollout.endpoint.recorder import EpisodeRecord, RequestError, parse_tool_calls
from agentenv.types import SamplingParams

_MAX_ENDED = 100_000  # ended keys remembered (for the `episode_ended` answer); older ones read as unknown


def _error(e: RequestError) -> web.Response:
    return web.json_response(e.body(), status=e.status)


class Endpoint:
    """An aiohttp server that answers chat completions for open episodes.

    Args:
        chat: The run's chat template (tokenizer, `env.chat_template`, its kwargs).
        config: Where it listens and whom it serves.
        max_context_tokens: Most tokens of one trajectory (`env.max_context_tokens`).
        generation_timeout_s: Limit of one `generate` call (None: none).
    """

    def __init__(self, chat: ChatTemplate, config: EndpointConfig | None = None, max_context_tokens: int = 2048,
                 generation_timeout_s: float | None = None):  # fmt: skip
        self.chat = chat
        self.config = config or EndpointConfig()
        self.max_context_tokens = max_context_tokens
        self.generation_timeout_s = generation_timeout_s
        self.episodes: dict[str, EpisodeRecord] = {}
        self._ended: dict[str, None] = {}
        self.counts: Counter[str] = Counter()  # requests, errors by code, prefix breaks (since start)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    # ---- lifecycle ------------------------------------------------------
    async def start(self) -> Endpoint:
        """Bind and serve (on the running loop); `port` is then the bound port."""
        if self._runner is not None:
            return self
        app = web.Application(middlewares=[self._guard], client_max_size=self.config.max_request_bytes)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/agentenv/episode", self._episode)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port, reuse_address=True)
        await site.start()
        self._runner = runner
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp's private server: set once start() returned
        return self

    @property
    def url(self) -> str:
        """The base URL a client uses (`.../v1`); a wildcard bind is reached through loopback."""
        if self.port is None:
            raise RuntimeError("the endpoint is not started: await Endpoint.start() first")
        host = self.config.host
        ip = ipaddress.ip_address(host)
        if ip.is_unspecified:
            host = "127.0.0.1" if ip.version == 4 else "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/v1"

    async def aclose(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def open_episode(self, policy: Policy, params: SamplingParams, seed: int) -> EpisodeRecord:
        """A new episode with its own random key (`record.key`)."""
        key = "ae-" + secrets.token_urlsafe(24)
        rec = EpisodeRecord(key, self.chat, policy, params, seed, self.max_context_tokens)
        self.episodes[key] = rec
        return rec

    def close_episode(self, key: str) -> EpisodeRecord | None:
        """End an episode: its key is refused from now on; its record is returned (None if unknown)."""
        rec = self.episodes.pop(key, None)
        if rec is not None:
            rec.closed = True
            self._ended[key] = None
            while len(self._ended) > _MAX_ENDED:
                self._ended.pop(next(iter(self._ended)))
        return rec

    # ---- plumbing -------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Loopback only (unless allowed); every failure as an OpenAI-style error."""
        if not self.config.allow_remote:
            peer = request.remote or ""
            try:
                local = ipaddress.ip_address(peer.split("%")[0]).is_loopback
            except ValueError:
                local = False
            if not local:
                self.counts["error/remote_refused"] += 1
                return _error(RequestError(
                    403, f"the endpoint serves loopback clients only, not {peer!r} (rollout.endpoint.allow_remote)",
                    "remote_refused", type_="permission_error"))  # fmt: skip
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except RequestError as e:
            self.counts[f"error/{e.code}"] += 1
            return _error(e)
        except web.HTTPRequestEntityTooLarge:
            self.counts["error/request_too_large"] += 1
            return _error(RequestError(413, f"request body above {self.config.max_request_bytes} bytes",
                                       "request_too_large"))  # fmt: skip
        except web.HTTPException as e:
            code = "not_found" if e.status == 404 else "http_error"
            self.counts[f"error/{code}"] += 1
            return _error(RequestError(e.status, f"{request.method} {request.path}: {e.reason}", code))

    def _episode_of(self, request: web.Request) -> EpisodeRecord:
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        rec = self.episodes.get(key) if key else None
        if rec is not None:
            return rec
        if key in self._ended:
            raise RequestError(409, "this API key's episode has ended; nothing more is recorded for it",
                               "episode_ended", type_="invalid_request_error")  # fmt: skip
        raise RequestError(401, "missing or invalid API key: each episode has its own key (the client it was given)",
                           "invalid_api_key", type_="authentication_error")  # fmt: skip

    # ---- routes ---------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        self._episode_of(request)
        name = self.config.model_name
        return web.json_response(
            {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "agentenv"}]}
        )

    async def _episode(self, request: web.Request) -> web.Response:
        """The episode's own record (sizes and uids), for its key only."""
        return web.json_response(self._episode_of(request).summary())

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        rec = self._episode_of(request)
        try:
            body = await request.json(loads=json.loads)
        except json.JSONDecodeError as e:
            raise RequestError(400, f"the request body is not valid JSON ({e.msg})", "invalid_json") from None
        if not isinstance(body, Mapping):
            raise RequestError(400, "the request body must be a JSON object", "invalid_json")
        model = body.get("model")
        if model != self.config.model_name:
            raise RequestError(404, f"the model {model!r} does not exist; this endpoint serves {self.config.model_name!r}",
                               "model_not_found", "model")  # fmt: skip
        if body.get("n", 1) != 1:
            raise RequestError(400, "only n=1 is supported (sample again for another completion)", "unsupported", "n")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
            raise RequestError(400, f"max_tokens must be a positive integer, got {max_tokens!r}", "invalid_value", "max_tokens")
        stop = body.get("stop") or ()
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise RequestError(400, "stop must be a string or a list of non-empty strings", "invalid_value", "stop")
        if body.get("tool_choice") not in (None, "auto", "none"):
            raise RequestError(400, "tool_choice may be 'auto' or 'none' only", "unsupported", "tool_choice")
        prep = rec.prepare(body.get("messages"), body.get("tools"))  # shown to the model even with tool_choice none
        if prep.prefix_break:
            rec.prefix_breaks += 1
            self.counts["prefix_breaks"] += 1
        params = rec.sampling(max_tokens, tuple(stop), len(prep.prompt_ids))
        t0 = time.perf_counter()
        try:
            gen = await asyncio.wait_for(rec.policy.generate(prep.prompt_ids, params), self.generation_timeout_s)
        except TimeoutError:
            raise RequestError(504, f"the policy did not answer within {self.generation_timeout_s:g} s "
                                    "(rollout.generation_timeout_s)", "timeout", type_="server_error") from None  # fmt: skip
        elapsed = time.perf_counter() - t0
        if rec.closed:
            raise RequestError(409, "this API key's episode ended while the request was answered; it is not recorded",
                               "episode_ended")  # fmt: skip
        text = self.chat.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        calling = prep.tool_names and body.get("tool_choice") != "none"
        content, calls = parse_tool_calls(text, prep.tool_names) if calling else (text, [])
        thread = rec.record(prep, gen, calls, content, elapsed)
        self.counts["requests"] += 1
        finish = "tool_calls" if calls else ("length" if gen.finish_reason == "length" else "stop")
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "token_ids": gen.token_ids}
        if body.get("logprobs"):
            tok = self.chat.tokenizer
            choice["logprobs"] = {"content": [
                {"token": (s := tok.decode([t], skip_special_tokens=False)), "logprob": lp,
                 "bytes": list(s.encode("utf-8")), "top_logprobs": [], "entropy": h}
                for t, lp, h in zip(gen.token_ids, gen.logprobs, gen.entropies)
            ]}  # fmt: skip
        n_prompt, n_out = len(prep.prompt_ids), len(gen.token_ids)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
        out = {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model_name,
            "choices": [choice],
            "usage": usage,
            "agentenv": {"trajectory": thread.uid, "episode": rec.uid},
        }
        headers = {"x-agentenv-trajectory": thread.uid}
        if body.get("stream"):
            return await self._stream(request, out, body, headers)
        return web.json_response(out, headers=headers)

    async def _stream(self, request: web.Request, out: dict[str, Any], body: Mapping[str, Any],
                      headers: dict[str, str]) -> web.StreamResponse:  # fmt: skip
        """`stream: true`: the whole completion as one chunk, then its finish (and usage, if asked), then [DONE]."""
        resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        choice = out["choices"][0]
        delta: dict[str, Any] = {"role": "assistant", "content": choice["message"]["content"]}
        if "tool_calls" in choice["message"]:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(choice["message"]["tool_calls"])]
        head = {k: out[k] for k in ("id", "created", "model", "agentenv")} | {"object": "chat.completion.chunk"}
        first: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None, "token_ids": choice["token_ids"]}
        if "logprobs" in choice:
            first["logprobs"] = choice["logprobs"]
        chunks = [{**head, "choices": [first]},
                  {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]  # fmt: skip
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "choices": [], "usage": out["usage"]})
        for c in chunks:
            await resp.write(f"data: {json.dumps(c)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
