"""The vLLM engine as a `Policy` (see the package docstring for what it reports)."""

from __future__ import annotations

import asyncio
import atexit
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Any, cast

from agentenv._loops import LoopThread, refuse_inside_loop
from agentenv._reaper import Reaper, tagged
from agentenv.errors import InfraError
from agentenv.policies.backend import BackendStats, PolicyBackend, load_hf_tokenizer
from agentenv.policies.vllm.config import _CALL_MODES, CallEntropyMode, VLLMPolicyConfig
from agentenv.policies.vllm.engine import CoreClaim, WeightBuffer, _import_vllm, _on_cpu, engine_args
from agentenv.policies.vllm.entropy import _token_logprobs_and_entropies
from agentenv.types import FinishReason, Generation, SamplingParams, Tokenizer


@dataclass
class _Counters(BackendStats):
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    weight_updates: int = 0
    resumed_requests: int = 0  # requests a push aborted, gone on under the new weights



class VLLMPolicy(PolicyBackend):
    """A vLLM engine as a `Policy`.

    Args:
        config: Where the model is and how to run the engine.
        tokenizer: An already built tokenizer (skips loading one).
    """

    def __init__(self, config: VLLMPolicyConfig, tokenizer: Tokenizer | None = None):
        _import_vllm()
        self.config = config
        self.weight_version = 0
        self.tokenizer = tokenizer if tokenizer is not None else load_hf_tokenizer(config.model, config.tokenizer)
        self.stats: _Counters = _Counters()
        self._piece_cache: dict[int, str] = {}  # token id -> its text alone (stop-string prefilter)
        self._closed = False
        # The push's handshake with `_request` (both on the engine loop): no add while a push is under way.
        self._open = asyncio.Event()  # set: no push under way
        self._open.set()
        self._adding = 0  # requests being added to the engine right now
        self._added = asyncio.Event()  # set when `_adding` drops to 0
        self._pushes = 0  # pushes begun
        self._loop = LoopThread("agentenv-vllm")
        # Armed before the engine's processes exist, and they carry its tag from birth: a SIGKILL
        # during the tens of seconds of engine start leaves no orphan (nor one holding GPU memory).
        self._reaper = Reaper(tag=True)
        self._cores = CoreClaim(config.tensor_parallel_size, on_cpu=_on_cpu())  # this engine's cores
        try:
            # multiprocessing's resource tracker belongs to this process (every spawned child shares it) and
            # ends when the last of them does. Started outside the tag, so that closing one engine leaves it
            # alone: it ignores SIGTERM, and the reaper waited out its grace (5 s a close) and then killed it,
            # together with the cleanup it does for the children.
            resource_tracker.ensure_running()
            with tagged(cast(str, self._reaper.tag)), self._cores.bound():  # Reaper(tag=True) always has one
                self._engine = self._loop.run(self._start_engine())
        except BaseException:
            self._loop.stop(join_s=30)
            self._reaper.release()
            self._cores.release()
            raise
        # Shut the engine down before interpreter teardown if the owner never closes it.
        atexit.register(_close_at_exit, weakref.ref(self))
        model_config = self._engine.model_config
        self.vocab_size: int = model_config.get_vocab_size()
        self.max_model_len: int = model_config.max_model_len
        self._dtype = model_config.dtype  # torch dtype of the served weights
        self._buffer = WeightBuffer(config.weight_chunk_mb << 20)  # what a push writes and the workers map
        self._stacked: dict[str, list[str]] | None = None  # the model's stacked layers (`WeightBuffer.write`)

    async def _start_engine(self) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        engine = AsyncLLM.from_engine_args(engine_args(self.config))
        if self.config.entropy_mode == "exact":
            try:
                await engine.collective_rpc("agentenv_install_entropy")
            except BaseException:
                engine.shutdown()
                raise
        return engine

    # ------------------------------------------------------------------ generation

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, entropy_mode: CallEntropyMode | None = None
    ) -> Generation:
        """Sample one continuation of `prompt_ids`; batched with concurrent calls.

        Args:
            prompt_ids: The context so far.
            params: How to sample.
            entropy_mode: Overrides `config.entropy_mode` for this call; also
                `none` (entropies NaN: the baseline for benchmarks).
        """
        prompt_ids = self._check_prompt(prompt_ids)
        mode = self._check_mode(entropy_mode)
        return await asyncio.wrap_future(self._loop.submit(self._agenerate(prompt_ids, params, mode)))

    def generate_sync(
        self, prompt_ids: list[int], params: SamplingParams, *, entropy_mode: CallEntropyMode | None = None
    ) -> Generation:
        """Blocking `generate` for scripts (not from inside a running event loop)."""
        return self.generate_many_sync([prompt_ids], params, entropy_mode=entropy_mode)[0]

    def generate_many_sync(
        self, prompts: list[list[int]], params: SamplingParams, *, entropy_mode: CallEntropyMode | None = None
    ) -> list[Generation]:
        """Blocking `generate` of several prompts at once (batched by the engine)."""
        refuse_inside_loop("generate_many_sync() blocks; called inside a running event loop (use `await generate()`)")
        checked = [self._check_prompt(p) for p in prompts]
        mode = self._check_mode(entropy_mode)

        async def _all() -> list[Generation]:
            return list(await asyncio.gather(*(self._agenerate(p, params, mode) for p in checked)))

        gens: list[Generation] = self._loop.run(_all())
        return gens

    def _check_prompt(self, prompt_ids: list[int]) -> list[int]:
        if self._closed:
            raise RuntimeError("VLLMPolicy is closed")
        return super()._check_prompt(prompt_ids)

    def _check_mode(self, mode: CallEntropyMode | None) -> CallEntropyMode:
        mode = mode or self.config.entropy_mode
        if mode not in _CALL_MODES:
            raise ValueError(f"entropy_mode must be one of {list(_CALL_MODES)}, got {mode!r}")
        if mode == "exact" and self.config.entropy_mode != "exact":
            raise ValueError(
                f"entropy_mode='exact' needs an engine started with entropy_mode='exact' (this one: "
                f"{self.config.entropy_mode!r}): the entropy is computed by a sampler hook installed at start"
            )
        return mode

    def _vllm_params(self, params: SamplingParams, mode: CallEntropyMode, done: int = 0) -> Any:
        """vLLM's sampling parameters; `done` > 0: for the rest of a request a push aborted after `done` tokens
        (its budget left, and a seed of its own: the first one would replay the draws of its start)."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        seed = params.seed
        if done and seed is not None:
            seed = hash((seed, done)) & (2**63 - 1)  # a tuple of ints hashes the same in every process
        return VSamplingParams(
            n=1,
            max_tokens=params.max_tokens - done,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,  # vLLM: 0 disables
            seed=seed,
            # Stop strings are matched here, not by vLLM: its detokenizer would also decode
            # every returned logprob token one by one (21 per token at k=20, the whole
            # vocabulary in full mode), which halves throughput (full: /25).
            detokenize=False,
            # The sampled token's logprob always; `topk` adds the k largest, `full` all V.
            logprobs={"topk": self.config.entropy_topk, "full": -1}.get(mode, 0),
            flat_logprobs=True,
            # With stop strings we watch tokens as they come; otherwise only the end matters.
            output_kind=RequestOutputKind.DELTA if params.stop else RequestOutputKind.FINAL_ONLY,
            stream_interval=self.config.stop_check_interval if params.stop else None,
        )

    async def _agenerate(self, prompt_ids: list[int], params: SamplingParams, mode: CallEntropyMode) -> Generation:
        """Runs on the engine loop. A request that a push aborts goes on from its tokens (`_request`)."""
        token_ids: list[int] = []
        logprobs: list[float] = []
        entropies: list[float] = []
        versions: list[int] = []
        stop_string: str | None = None
        last = None  # the last CompletionOutput seen
        last_chars = _filterable_last_chars(params.stop)
        c = self.stats
        while True:
            left = params.max_tokens - len(token_ids)
            context = prompt_ids + token_ids
            if token_ids and (left <= 0 or len(context) >= self.max_model_len):
                reason: FinishReason = "length"  # a push aborted it as it reached its limit
                break
            version, pushes, queue = await self._request(context, self._vllm_params(params, mode, done=len(token_ids)))
            c.prompt_tokens += len(context)
            num_cached = 0
            finished = False
            try:
                while not finished:
                    out = queue.get_nowait() or await queue.get()
                    finished = out.finished
                    num_cached = out.num_cached_tokens or num_cached
                    last = out.outputs[0]
                    new = list(last.token_ids)
                    lps, ents = _token_logprobs_and_entropies(last.logprobs, len(new), mode, self.vocab_size)
                    if not params.stop:
                        token_ids += new
                        logprobs += lps
                        entropies += ents
                        versions += [version] * len(new)
                        continue
                    for j, tok in enumerate(new):
                        token_ids.append(tok)
                        logprobs.append(lps[j])
                        entropies.append(ents[j])
                        versions.append(version)
                        ends_on_eos = last.finish_reason == "stop" and j == len(new) - 1
                        # An EOS token ends the turn as EOS (as in hf); a token without any stop
                        # string's last character cannot complete one (skips the window decode).
                        if not ends_on_eos and (last_chars is None or self._has_any_char(tok, last_chars)):
                            stop_string = self._find_stop(token_ids, params.stop)
                            if stop_string is not None:
                                break
                    if stop_string is not None:
                        break
            finally:
                if not finished:  # a stop string, or the caller went away: the engine stops it
                    await self._engine.abort(queue.request_id, internal=True)
            c.cached_prompt_tokens += num_cached
            if stop_string is None and last is not None and last.finish_reason == "abort" and pushes != self._pushes:
                c.resumed_requests += 1  # aborted by a weight push: go on under the new weights
                continue
            if last is None:
                raise InfraError("vLLM returned no output for a request")
            if stop_string is not None:
                reason = "stop"
            elif last.finish_reason == "length":
                reason = "length"
            elif last.finish_reason == "stop":  # EOS (stop_reason None) or a generation_config EOS id (an int)
                reason = "eos"
                if not params.include_eos:
                    del token_ids[-1], logprobs[-1], entropies[-1], versions[-1]
            else:
                raise InfraError(f"vLLM ended a request with finish_reason={last.finish_reason!r}")
            break

        c.requests += 1
        c.generated_tokens += len(token_ids)
        return Generation(token_ids, logprobs, entropies, reason, stop_string=stop_string, versions=versions)

    async def _request(self, prompt_ids: list[int], vparams: Any) -> tuple[int, int, Any]:
        """Add a request to the engine once no push is under way.

        Returns (the weight version that samples it, the pushes begun so far,
        its output queue). A push waits for every add under way to reach the
        engine before it pauses it (`_pause`), so the engine holds this request
        before the pause (a push then finishes or aborts it) or only after the
        resume: either way one version samples all its tokens.
        """
        from vllm.inputs import tokens_input

        while not self._open.is_set():
            await self._open.wait()
        version, pushes = self.weight_version, self._pushes
        self._adding += 1
        try:
            queue = await self._engine.add_request(uuid.uuid4().hex, tokens_input(prompt_ids), vparams)
        finally:
            self._adding -= 1
            if not self._adding:
                self._added.set()
        return version, pushes, queue

    def _has_any_char(self, token_id: int, chars: frozenset[str]) -> bool:
        text = self._piece_cache.get(token_id)
        if text is None:
            text = self._piece_cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return any(c in text for c in chars)

    # ------------------------------------------------------------------ weights

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]] | Mapping[str, Any]) -> None:
        """Put the trainer's weights (names as in `state_dict()`) into the running engine.

        Running requests are aborted and go on from their tokens under the new
        weights (`weight_push: resume`; a turn's tokens then carry two
        versions, in order), or finish first on the old weights (`wait`). New
        requests wait for the push either way. The tensors go to the
        workers in chunks, are loaded in place (no restart), and then the
        prefix cache is reset: cached KV computed by the old weights is stale.
        Prefixes added by wrappers (`module.`, `_orig_mod.`) are stripped.
        Blocks the calling thread (the engine runs on its own event loop, so
        calling it from inside a running loop cannot deadlock).

        The tensors travel through host memory: each is copied once into a
        buffer (`WeightBuffer`), which every tensor-parallel worker maps (only
        its path crosses the engine's RPC) and loads from in the commit. So
        the engine's workers must share this process's host (vLLM's default
        executor; an engine spread over nodes takes the NCCL path). The buffer
        holds a host copy of the weights from the first push until `close`.
        """
        self._push(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)

    def _push(self, items: Iterable[tuple[str, Any]], in_place: bool = True) -> None:
        """`load_weights`; `in_place=False` loads with vLLM's layerwise reload even where the in-place commit
        would (`agentenv.policies._vllm_worker`): tests and benchmarks compare the two."""

        def transfer() -> None:
            if self._stacked is None:  # the engine's stacked layers: their shards go side by side in the buffer
                self._stacked = self._loop.run(self._engine.collective_rpc("agentenv_packed_modules"))[0]
            size, index = self._buffer.write(items, self._dtype, self._stacked)
            self._loop.run(self._engine.collective_rpc("agentenv_stage_weights", args=(self._buffer.path, size, index)))
            self._loop.run(self._engine.collective_rpc("agentenv_commit_weights", args=(in_place,)))

        self._update(transfer)

    def join_weight_group(self, host: str, port: int, rank_offset: int, world_size: int) -> list[int]:
        """Join a trainer's weight-broadcast group (`agentenv.policies.weight_group`, NCCL): every
        tensor-parallel worker as rank `rank_offset` + its rank. Returns their ranks."""
        if self._closed:
            raise RuntimeError("VLLMPolicy is closed")
        ranks: list[int] = self._loop.run(
            self._engine.collective_rpc("agentenv_nccl_join", args=(host, port, rank_offset, world_size))
        )
        return ranks

    def load_weights_from_group(self) -> None:
        """`load_weights` with the tensors broadcast by the group's rank 0 (the GPU path; blocks until they arrived)."""
        self._update(lambda: self._loop.run(self._engine.collective_rpc("agentenv_nccl_receive")))

    def _update(self, transfer: Callable[[], None]) -> None:
        """Pause (`_pause`), transfer and load, reset the prefix cache, bump the version, resume."""
        if self._closed:
            raise RuntimeError("VLLMPolicy is closed")
        engine = self._engine
        self._loop.run(self._pause())
        try:
            transfer()
            if not self._loop.run(engine.reset_prefix_cache()):
                raise InfraError("vLLM refused to reset its prefix cache after a weight update")
            self.weight_version += 1  # before the resume: a request reads its version when it is added
        except BaseException:
            self._loop.run(engine.collective_rpc("agentenv_drop_staged_weights"))
            raise
        finally:
            self._loop.run(self._resume())
        self.stats.weight_updates += 1

    async def _pause(self) -> None:
        """Stop new requests, let the adds under way reach the engine, then pause it.

        `weight_push: resume` pauses with vLLM's `abort`: every running request
        ends at once with the tokens it has (`_agenerate` goes on from them
        after the resume). `wait`: running requests finish on the old weights.
        Either way the caches are cleared: the KV the old weights computed is stale.
        """
        self._pushes += 1
        self._open.clear()
        while self._adding:
            self._added.clear()
            await self._added.wait()
        mode = "abort" if self.config.weight_push == "resume" else "wait"
        await self._engine.pause_generation(mode=mode, clear_cache=True)

    async def _resume(self) -> None:
        await self._engine.resume_generation()
        self._open.set()

    # ------------------------------------------------------------------ metrics and lifetime

    def metrics(self) -> dict[str, float]:
        """Counters since start (or `reset_metrics`).

        `prefix_cache_hit_rate` is the share of prompt tokens whose KV came from
        the prefix cache (vLLM's per-request `num_cached_tokens`), over finished
        requests; `unfinished_requests` is what the engine holds right now;
        `resumed_requests` counts requests a weight push aborted that went on
        under the new weights.
        """
        c = self.stats
        return {
            **super().metrics(),
            "prefix_cache_hit_rate": c.cached_prompt_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
            "unfinished_requests": float(self._engine.get_num_unfinished_requests()) if not self._closed else 0.0,
        }

    def reset_metrics(self) -> None:
        self.stats = _Counters(weight_updates=self.stats.weight_updates)

    def close(self) -> None:
        """Shut the engine's processes down. Idempotent."""
        if self._closed:
            return
        self._closed = True

        async def _shutdown() -> None:
            self._engine.shutdown()

        try:
            self._loop.run(_shutdown(), timeout=120)
        finally:
            self._loop.stop(join_s=30)
            self._buffer.close()
            self._reaper.release()
            self._cores.release()
            # Dropped now, while the interpreter is whole: AsyncLLM.__del__ at exit fails noisily.
            self._engine = None


def _filterable_last_chars(stops: tuple[str, ...]) -> frozenset[str] | None:
    """The stop strings' last characters, if a token's own text can rule them out.

    A token completes a stop string only if its text holds the string's last
    character. Decoded alone, a token keeps its ASCII characters (in UTF-8 an
    ASCII byte is never part of a longer character), but may lose a leading
    space (SentencePiece), so only ASCII non-space last characters qualify.
    """
    chars = frozenset(s[-1] for s in stops)
    if not chars or not all(c.isascii() and not c.isspace() for c in chars):
        return None
    return chars


def _close_at_exit(ref: weakref.ref[VLLMPolicy]) -> None:
    policy = ref()
    if policy is not None:
        policy.close()


def make_vllm_policy(cfg: VLLMPolicyConfig) -> VLLMPolicy:
    """Build the `vllm` backend from its config (what `policy.backend: vllm` selects)."""
    if not isinstance(cfg, VLLMPolicyConfig):
        raise TypeError(f"make_vllm_policy needs a VLLMPolicyConfig, got {type(cfg).__name__}")
    return VLLMPolicy(cfg)
