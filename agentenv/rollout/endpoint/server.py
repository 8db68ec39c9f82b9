"""The OpenAI-compatible endpoint over a policy: `/v1/chat/completions`, `/v1/models`, on aiohttp.

Each episode gets its own random API key (`Endpoint.open_episode`); the key is
the episode's name, so one episode's requests cannot add to, read or end
another's trajectories. A request is answered by `policy.generate` on the
exact token ids of its trajectory (`agentenv.rollout.endpoint.recorder`), and
its answer, ids, logprobs and entropies are recorded. Errors have OpenAI's
shape (`{"error": {"message", "type", "param", "code"}}`) and change nothing:

- 400 malformed JSON (not UTF-8, a lone surrogate, nested too deeply), messages,
  tools or parameters; `context_length_exceeded` (refused before tokenizing when
  the rendering has more characters than the budget's tokens can hold);
- 401 a missing or unknown key (`invalid_api_key`); 409 a key whose episode ended (`episode_ended`);
- 403 a client that is not on loopback (unless `rollout.endpoint.allow_remote`);
- 404 an unknown model (`model_not_found`) or route; 413 a body too large; 415 a charset other than UTF-8;
- 429 `episode_request_limit`: the episode made `rollout.endpoint.max_requests_per_episode` requests;
- 500 `policy_error` (`policy.generate` raised) or `internal_error` (anything else); 504 the policy timed out.

Every error is counted (`counts["error/<code>"]`, `rollout/endpoint_errors`).
The request is checked whole (`ChatRequest.of`, then its messages rendered)
before anything is generated, and recorded only once its reply is built
(serialized whole, before its headers go out). A client that goes away
cancels its request: its generation stops, its slot is free, nothing is recorded.
At most `max_concurrent_per_episode` requests of one episode are rendered or
generated at once (the others wait, first come first served), and a large
body is parsed, rendered and tokenized on a worker thread, never on the loop.

`stream: true` is answered once the completion is whole, as one chunk (then
its finish reason, its usage if `stream_options.include_usage`, and `[DONE]`),
for clients that only stream.

An agent in this process (`rollout.agent`: its client is `AgentRunner.client`)
reaches the same handler without a socket (`LocalTransport`): the same checks,
errors, recording and cancellation, minus HTTP on both sides of the loop (an
agent elsewhere, or anything that reads the client's `base_url`, goes over HTTP).

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
import re
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx2
from aiohttp import web

from agentenv.envs.chat import ChatTemplate
from agentenv.policies.base import Policy
from agentenv.rollout.endpoint.config import EndpointConfig
from agentenv.rollout.endpoint.recorder import EpisodeRecord, RequestError, longest_token_chars, parse_tool_calls
from agentenv.types import SamplingParams

_MAX_ENDED = 100_000  # ended keys remembered (for the `episode_ended` answer); older ones read as unknown


# a request body above this many bytes is parsed, rendered and tokenized on a worker thread (below it the work is
# well under a millisecond: the thread's hand-off would cost more than it saves the loop)
OFFLOAD_BYTES = 32 * 1024
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


# refusals no retry can change: clients that honour `x-should-retry` (openai's, which retries 409 and 429) do not retry
_FINAL = frozenset({"episode_ended", "episode_request_limit"})


def _error(e: RequestError) -> web.Response:
    headers = {"x-should-retry": "false"} if e.code in _FINAL else None
    return web.json_response(e.body(), status=e.status, headers=headers)


def parse_body(raw: bytes) -> Any:
    """A request body's JSON (its errors as RequestErrors, 400)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"the request body is not UTF-8 (byte {e.start}: {raw[e.start:e.start + 1]!r})",
                           "invalid_encoding") from None  # fmt: skip
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"the request body is not valid JSON ({e.msg})", "invalid_json") from None
    except RecursionError:
        raise RequestError(400, "the request body's JSON nests too deeply to parse", "invalid_json") from None
    if _SURROGATE_ESCAPE.search(text):  # only escapes make lone surrogates; a text without one has none
        stack: list[tuple[Any, str]] = [(body, "")]
        while stack:
            v, where = stack.pop()
            if isinstance(v, str):
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    raise RequestError(400, f"the request body's string at {where or 'the top'} holds a lone "
                                            "surrogate (\\ud800-\\udfff unpaired): not text", "invalid_encoding",
                                       where.lstrip(".") or None) from None  # fmt: skip
            elif isinstance(v, dict):
                stack.extend((x, f"{where}.{k}") for k, x in v.items())
                stack.extend((k, f"{where} (a key)") for k in v)
            elif isinstance(v, list):
                stack.extend((x, f"{where}[{i}]") for i, x in enumerate(v))
    return body


class Incoming(Protocol):
    """What a route reads of a request: aiohttp's `web.Request`, or a `LocalRequest` of this process's agents."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def charset(self) -> str | None: ...

    async def read(self) -> bytes: ...


@dataclass(frozen=True)
class LocalRequest:
    """A request of an agent in this process, as `LocalTransport` hands it over (no socket, no HTTP parsing)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    max_bytes: int  # rollout.endpoint.max_request_bytes, as aiohttp's client_max_size bounds `read`

    @property
    def charset(self) -> str | None:
        for param in self.headers.get("Content-Type", "").split(";")[1:]:
            name, _, value = param.partition("=")
            if name.strip().lower() == "charset":
                return value.strip().strip('"')
        return None

    async def read(self) -> bytes:
        if len(self.body) > self.max_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=self.max_bytes, actual_size=len(self.body))
        return self.body


Route = Callable[[Any], Awaitable[web.Response]]


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion request, every field the endpoint reads checked (`of`) before anything is generated.

    `messages` and `tools` are checked as they are rendered (`EpisodeRecord.prepare`), also before.
    """

    messages: Any
    tools: Any
    max_tokens: int | None
    stop: tuple[str, ...]
    tool_choice: str | None
    stream: bool
    include_usage: bool
    logprobs: bool
    size: int  # bytes of the body

    @classmethod
    def of(cls, body: Any, size: int, model_name: str) -> ChatRequest:
        """The request of a parsed body.

        Raises:
            RequestError: A field with a wrong type or value (400, naming it), another model (404).
        """
        if not isinstance(body, Mapping):
            raise RequestError(400, "the request body must be a JSON object", "invalid_json")
        model = body.get("model")
        if model != model_name:
            raise RequestError(404, f"the model {model!r} does not exist; this endpoint serves {model_name!r}",
                               "model_not_found", "model")  # fmt: skip
        if body.get("n", 1) != 1:
            raise RequestError(400, "only n=1 is supported (sample again for another completion)", "unsupported", "n")
        field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = body.get(field)
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
            raise RequestError(400, f"{field} must be a positive integer, got {max_tokens!r}", "invalid_value", field)
        stop = body.get("stop") or ()
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise RequestError(400, "stop must be a string or a list of non-empty strings", "invalid_value", "stop")
        tool_choice = body.get("tool_choice")
        if tool_choice not in (None, "auto", "none"):
            raise RequestError(400, "tool_choice may be 'auto' or 'none' only", "unsupported", "tool_choice")
        flags = {}
        for name in ("stream", "logprobs"):
            v = body.get(name)
            if v is not None and not isinstance(v, bool):
                raise RequestError(400, f"{name} must be true or false, got {v!r}", "invalid_value", name)
            flags[name] = bool(v)
        options = body.get("stream_options")
        if options is not None and not isinstance(options, Mapping):
            raise RequestError(400, f"stream_options must be an object ({{\"include_usage\": true}}), got {options!r}",
                               "invalid_value", "stream_options")  # fmt: skip
        usage = (options or {}).get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise RequestError(400, f"stream_options.include_usage must be true or false, got {usage!r}",
                               "invalid_value", "stream_options.include_usage")  # fmt: skip
        if options is not None and not flags["stream"]:
            raise RequestError(400, "stream_options is only allowed with stream: true", "invalid_value", "stream_options")
        return cls(body.get("messages"), body.get("tools"), max_tokens, tuple(stop), tool_choice, flags["stream"],
                   bool(usage), flags["logprobs"], size)  # fmt: skip


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
        self._slots: dict[str, asyncio.Semaphore] = {}  # an open episode's key -> its requests' turns
        self._token_chars = longest_token_chars(chat.tokenizer)
        self._ended: dict[str, None] = {}
        self.counts: Counter[str] = Counter()  # requests, errors by code, prefix breaks (since start)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self._routes: dict[str, dict[str, Route]] = {  # path -> method -> route, served over HTTP and in-process alike
            "/v1/models": {"GET": self._models},
            "/v1/chat/completions": {"POST": self._chat},
            "/v1/agentenv/episode": {"GET": self._episode},
        }

    # ---- lifecycle ------------------------------------------------------
    async def start(self) -> Endpoint:
        """Bind and serve (on the running loop); `port` is then the bound port."""
        if self._runner is not None:
            return self
        app = web.Application(middlewares=[self._guard], client_max_size=self.config.max_request_bytes)
        for path, methods in self._routes.items():
            for method, route in methods.items():
                app.router.add_route(method, path, route)
        # a client that goes away (its agent gave up, its episode timed out) cancels its request: the slot it held
        # or waited for is free, its generation stops, and the reply nobody reads is never recorded
        runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
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
        rec = EpisodeRecord(key, self.chat, policy, params, seed, self.max_context_tokens, self._token_chars)
        self.episodes[key] = rec
        self._slots[key] = asyncio.Semaphore(self.config.max_concurrent_per_episode)
        return rec

    def close_episode(self, key: str) -> EpisodeRecord | None:
        """End an episode: its key is refused from now on; its record is returned (None if unknown)."""
        rec = self.episodes.pop(key, None)
        self._slots.pop(key, None)
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
        return await self._shaped(request, handler)

    async def serve_local(self, request: LocalRequest) -> web.Response:
        """A request of an agent in this process (`LocalTransport`): routed as aiohttp routes, its failures shaped
        as `_guard` shapes them (it is on this machine: the loopback rule holds by construction)."""
        return await self._shaped(request, self._route)

    async def _route(self, request: Incoming) -> web.Response:
        methods = self._routes.get(request.path)
        if methods is None:
            raise web.HTTPNotFound()
        route = methods.get(request.method)
        if route is None:
            raise web.HTTPMethodNotAllowed(request.method, list(methods))
        return await route(request)

    async def _shaped(self, request: Incoming, handler: Route) -> web.Response:
        """The handler's response, or its failure as an OpenAI-style error (counted)."""
        try:
            return await handler(request)
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
        except RecursionError:  # nesting the parser took but a later step (rendering its tools) did not
            self.counts["error/invalid_value"] += 1
            return _error(RequestError(400, "the request nests too deeply to be rendered", "invalid_value"))
        except Exception as e:  # noqa: BLE001 - whatever raised, the client gets an OpenAI-shaped error, counted
            self.counts["error/internal_error"] += 1
            return _error(RequestError(500, f"the endpoint failed on this request: {type(e).__name__}: {e}",
                                       "internal_error", type_="server_error"))  # fmt: skip

    def _episode_of(self, request: Incoming) -> EpisodeRecord:
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
    async def _models(self, request: Incoming) -> web.Response:
        self._episode_of(request)
        name = self.config.model_name
        return web.json_response(
            {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "agentenv"}]}
        )

    async def _episode(self, request: Incoming) -> web.Response:
        """The episode's own record (sizes and uids), for its key only."""
        return web.json_response(self._episode_of(request).summary())

    async def _body(self, request: Incoming) -> tuple[Mapping[str, Any], int]:
        """The request body as a JSON object: UTF-8 (the only charset JSON has), parsed off the loop when large.

        Raises:
            RequestError: Another charset (415), bytes that are not UTF-8, JSON that
                does not parse, nests deeper than the parser goes or holds a lone
                surrogate (400), or a body that is not an object (400).
        """
        charset = request.charset
        if charset is not None and charset.lower().replace("-", "").replace("_", "") != "utf8":
            raise RequestError(415, f"the request body's charset must be utf-8 (JSON is UTF-8), got {charset!r}",
                               "unsupported_charset")  # fmt: skip
        raw = await request.read()  # at most rollout.endpoint.max_request_bytes (413 beyond)
        body = await asyncio.to_thread(parse_body, raw) if len(raw) > OFFLOAD_BYTES else parse_body(raw)
        return body, len(raw)

    async def _chat(self, request: Incoming) -> web.Response:
        rec = self._episode_of(request)
        req = ChatRequest.of(*await self._body(request), self.config.model_name)  # every field checked before any work
        cfg = self.config
        if rec.admitted >= cfg.max_requests_per_episode:
            raise RequestError(
                429, f"this episode made its {cfg.max_requests_per_episode} requests "
                     "(rollout.endpoint.max_requests_per_episode); nothing more is answered for it",
                "episode_request_limit", type_="rate_limit_error")  # fmt: skip
        slots = self._slots.get(rec.key)
        if slots is None or rec.closed:
            raise RequestError(409, "this API key's episode has ended; nothing more is recorded for it", "episode_ended")
        rec.admitted += 1
        async with slots:  # at most max_concurrent_per_episode of one episode's requests at a time
            if rec.closed:
                raise RequestError(409, "this API key's episode has ended; nothing more is recorded for it", "episode_ended")
            return await self._answer(rec, req)

    async def _answer(self, rec: EpisodeRecord, req: ChatRequest) -> web.Response:
        # rendering and tokenizing grow with the request: a large one runs on a worker thread, never on the loop
        if req.size > OFFLOAD_BYTES:
            prep = await asyncio.to_thread(rec.prepare, req.messages, req.tools)
        else:
            prep = rec.prepare(req.messages, req.tools)  # shown to the model even with tool_choice none
        params = rec.sampling(req.max_tokens, req.stop, len(prep.prompt_ids))
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.generation_timeout_s):  # (wait_for would start a task per request)
                gen = await rec.policy.generate(prep.prompt_ids, params)
        except TimeoutError:
            raise RequestError(504, f"the policy did not answer within {self.generation_timeout_s:g} s "
                                    "(rollout.generation_timeout_s)", "timeout", type_="server_error") from None  # fmt: skip
        except Exception as e:  # noqa: BLE001 - the policy's fault: this request's error, never a plain-text 500
            raise RequestError(500, f"the policy failed to answer: {type(e).__name__}: {e}", "policy_error",
                               type_="server_error") from e  # fmt: skip
        elapsed = time.perf_counter() - t0
        if rec.closed:
            raise RequestError(409, "this API key's episode ended while the request was answered; it is not recorded",
                               "episode_ended")  # fmt: skip
        text = self.chat.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        calling = prep.tool_names and req.tool_choice != "none"
        content, calls = parse_tool_calls(text, prep.tool_names) if calling else (text, [])
        finish = "tool_calls" if calls else ("length" if gen.finish_reason == "length" else "stop")
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "token_ids": gen.token_ids}
        if req.logprobs:
            tok = self.chat.tokenizer
            choice["logprobs"] = {"content": [
                {"token": (s := tok.decode([t], skip_special_tokens=False)), "logprob": lp,
                 "bytes": list(s.encode("utf-8", "surrogatepass")), "top_logprobs": [], "entropy": h}
                for t, lp, h in zip(gen.token_ids, gen.logprobs, gen.entropies)
            ]}  # fmt: skip
        n_prompt, n_out = len(prep.prompt_ids), len(gen.token_ids)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
        thread = rec.place(prep)  # the trajectory the answer goes to (nothing awaited from here to `record`)
        out = {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model_name,
            "choices": [choice],
            "usage": usage,
            "agentenv": {"trajectory": thread.uid, "episode": rec.uid},
        }
        # the reply is serialized whole before it is recorded and before its headers go out: whatever fails here is
        # an error the client gets (not a stream broken after its headers), and nothing is recorded
        body = _events(out, req.include_usage) if req.stream else json.dumps(out).encode()
        rec.record(prep, gen, calls, content, elapsed, thread)
        self.counts["requests"] += 1
        if prep.prefix_break:
            rec.prefix_breaks += 1
            self.counts["prefix_breaks"] += 1
        headers = {"x-agentenv-trajectory": thread.uid}
        if not req.stream:
            return web.Response(body=body, headers=headers, content_type="application/json", charset="utf-8")
        # the events are whole already: one body with its length (no chunked encoding to write or parse)
        return web.Response(body=body, headers={**headers, "Cache-Control": "no-cache"}, content_type="text/event-stream")


def _events(out: dict[str, Any], include_usage: bool) -> bytes:
    """`stream: true`'s reply: the whole completion as one chunk, then its finish (and usage, if asked), then [DONE]."""
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
    if include_usage:
        chunks.append({**head, "choices": [], "usage": out["usage"]})
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


class LocalTransport(httpx2.AsyncBaseTransport):
    """The openai client's transport for agents in the endpoint's own process: a request to the endpoint's URL is
    handed to its routes (`Endpoint.serve_local`) without a socket; any other URL goes over HTTP.

    Over HTTP both ends run on the one event loop: the client's connection pool and HTTP/1.1 (httpx2, httpcore),
    the socket, and aiohttp's parsing and writing took most of a request's CPU and made 32 agents' requests queue
    on one core (benchmarks/endpoint.py). Here the request keeps everything the endpoint checks and records; the
    client's read timeout is kept (`httpx2.ReadTimeout`), and a cancelled request cancels its handler, as a
    closed connection does.
    """

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self._base: httpx2.URL | None = None
        self._http: httpx2.AsyncHTTPTransport | None = None  # for any other URL (opened on first use)

    def _ours(self, url: httpx2.URL) -> bool:
        port = self.endpoint.port
        if port is None:
            return False
        if self._base is None or self._base.port != port:
            self._base = httpx2.URL(self.endpoint.url)
        return url.port == port and url.host == self._base.host and url.scheme == "http"

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not self._ours(request.url):
            if self._http is None:
                self._http = httpx2.AsyncHTTPTransport()
            return await self._http.handle_async_request(request)
        ep = self.endpoint
        local = LocalRequest(request.method, request.url.path, request.headers, await request.aread(),
                             ep.config.max_request_bytes)  # fmt: skip
        read_s = request.extensions.get("timeout", {}).get("read")
        try:
            async with asyncio.timeout(read_s):
                resp = await ep.serve_local(local)
        except TimeoutError:  # (the handler answers its own timeouts: this one is the client's)
            raise httpx2.ReadTimeout(f"no answer within the client's read timeout ({read_s:g} s)", request=request) from None
        body = resp.body
        assert isinstance(body, bytes)  # every route answers with whole bytes
        return httpx2.Response(resp.status, headers=list(resp.headers.items()), content=body, request=request)

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()
