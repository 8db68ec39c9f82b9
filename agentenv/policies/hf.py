"""The transformers policy: batched sampling with per-token logprob and exact entropy.

Concurrent `generate` calls are batched continuously: a request that arrives
while a batch decodes is prefilled and joins it at the next step, and a row
leaves the batch the moment it finishes. Decoding runs one step at a time in a
worker thread (`asyncio.to_thread`), so the event loop keeps serving tool calls.

What the sampler reports per token is computed from the full distribution
`softmax(logits / T)` (T = temperature, 1 for greedy): the logprob of the
sampled token and its exact entropy (`agentenv.policies.distribution`). That is
the distribution the trainer recomputes (`agentenv.training.scoring`). top-k / top-p truncation changes which
token is drawn but is NOT reflected in the reported logprob and entropy (as in
vLLM's default "raw" logprobs).

Rows are left-padded; position ids count a row's real tokens, so a padded
row computes the same numbers as the row alone (up to float rounding).

A weight push (`load_weights`) lands between two decode steps. The KV cache
the old weights computed is then stale: before the next token, every decoding
row's context (prompt and the tokens it sampled so far) is prefilled again
under the new weights (a true partial rollout). So each token's version names
the weights that computed its whole distribution, cache included; a push costs
one prefill of the batch.

A finished row's cache is kept (`HFPolicyConfig.prefix_cache_mb`, least recently
used dropped first; all of it at a push). A request whose prompt starts with
tokens a kept cache holds, at least as many as the prompt has past them,
prefills only the rest: an agent's next turn (the last prompt, its reply and a
tool result) computes the new tokens, not the whole context again. Such
requests arriving together prefill in one forward, as new prompts do.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from agentenv._loops import refuse_inside_loop
from agentenv.policies.backend import BackendStats, PolicyBackend, load_hf_tokenizer
from agentenv.policies.config import HFPolicyConfig
from agentenv.policies.distribution import logprobs_and_entropy
from agentenv.types import Generation, SamplingParams, Tokenizer

__all__ = ["HFPolicyConfig", "HFPolicy", "HFPolicyStats"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _device(config: HFPolicyConfig) -> torch.device:
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


@dataclass
class HFPolicyStats(BackendStats):
    """Counters of the batching engine (tests and benchmarks read them)."""

    prefill_calls: int = 0
    decode_calls: int = 0
    rows_prefilled: int = 0
    max_rows: int = 0
    rows_recomputed: int = 0
    """Rows whose cache a weight push made stale, prefilled again under the new weights."""
    prefix_hits: int = 0
    """Requests whose prompt's start came from a kept cache (`HFPolicyConfig.prefix_cache_mb`)."""
    prefix_tokens: int = 0
    """Prompt tokens those requests did not compute again."""


# --------------------------------------------------------------------------- pure functions


def _sample_rows(
    logp: torch.Tensor, greedy: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """Draw one token per row by inverse CDF with one uniform per row.

    One uniform per row (from that row's own generator) makes a row's sample
    independent of its batch mates. Truncation (top-k, then top-p) only
    decides which tokens can be drawn.

    Args:
        logp: (B, V) log-probabilities at the sampling temperature.
        greedy: (B,) bool; argmax rows.
        top_k: (B,) long; <= 0 disables.
        top_p: (B,) float in (0, 1].
        u: (B,) uniforms in [0, 1).

    Returns:
        (B,) token ids.
    """
    probs, idx = logp.exp().sort(dim=-1, descending=True)  # (B, V)
    ranks = torch.arange(probs.shape[-1], device=probs.device).unsqueeze(0)  # (1, V)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, probs.shape[-1])).unsqueeze(-1)  # (B, 1)
    keep = ranks < k
    # top-p: keep the smallest prefix whose mass reaches top_p (the first token always).
    mass_before = probs.cumsum(-1) - probs  # (B, V)
    keep &= mass_before < top_p.unsqueeze(-1)
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    cdf = probs.cumsum(-1)  # (B, V)
    target = (u * cdf[:, -1]).unsqueeze(-1)  # (B, 1)
    pos = torch.searchsorted(cdf, target, right=True).clamp(max=probs.shape[-1] - 1)  # (B, 1)
    # Never land on a zero-probability slot (rounding at the end of the cdf).
    n_keep = keep.sum(-1, keepdim=True)
    pos = torch.minimum(pos, n_keep - 1)
    sampled = idx.gather(-1, pos).squeeze(-1)  # (B,)
    return torch.where(greedy, idx[:, 0], sampled)


# --------------------------------------------------------------------------- KV cache helpers


def _cache_kv(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer, each (B, H_kv, L, D), across transformers versions."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))  # transformers < 4.56


def _make_cache(kv: list[tuple[torch.Tensor, torch.Tensor]], room_limit: int = 0) -> Any:
    """A transformers cache holding `kv`. With `room_limit`, one whose layers grow in place, up to that many
    tokens (`_roomy_layer`), where this transformers version takes such layers."""
    from transformers import DynamicCache

    layer_cls = _roomy_layer() if room_limit else None
    if layer_cls is not None:
        return _roomy_cache(layer_cls, kv, room_limit)
    if hasattr(DynamicCache, "from_legacy_cache"):
        return DynamicCache.from_legacy_cache(tuple(kv))
    return DynamicCache(ddp_cache_data=kv)  # fills its layers by `cat`: a copy


def _roomy_cache(layer_cls: type, kv: list[tuple[torch.Tensor, torch.Tensor]], room_limit: int) -> Any:
    """An empty `DynamicCache` given layers of `layer_cls` that hold `kv` as they are (no copy)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for k, v in kv:
        layer = layer_cls()
        layer.dtype, layer.device, layer.room_limit = k.dtype, k.device, room_limit
        layer.keys, layer.values, layer.is_initialized = k, v, True
        cache.layers.append(layer)
    return cache


@functools.cache
def _roomy_layer() -> type | None:
    """A transformers `DynamicLayer` whose keys and values are views of buffers with room to grow; None where
    this transformers version's cache does not take it (it then grows by copies, as before).

    `DynamicLayer` appends a decode step's token by `torch.cat`, a copy of the whole cache at every step (and
    making the cache from the batch's tensors copied it again). In torch's profiler those copies were half of
    a decode step's operator time (SmolLM2, 4 rows of 700 tokens, one core); the step's wall time went from 115
    to 95 ms without them. This layer writes the new tokens into the room past the view and returns the longer
    view; with no room left it moves to a buffer twice as long (at most `room_limit` tokens).

    Only `_decode` makes such a cache, over the batch's own tensors: each is whole (from a `cat`, an
    `index_select`, a slice that ends where its storage does) or a view `_grow` returned, so the room it writes
    into is always a buffer `_grow` made. A kept prefix never goes into one (it is cloned out of the batch).
    """
    try:
        from transformers.cache_utils import DynamicLayer

        class RoomyLayer(DynamicLayer):
            room_limit = 0

            def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                keys, values = self.keys, self.values
                if not self.is_initialized or keys is None or values is None or keys.numel() == 0:
                    return super().update(key_states, value_states, *args, **kwargs)
                self.keys = _grow(keys, key_states, self.room_limit)
                self.values = _grow(values, value_states, self.room_limit)
                return self.keys, self.values

        # This version's cache must take such layers: a cache of one, grown once, holds the concatenation.
        old, new = torch.zeros(1, 1, 2, 2), torch.ones(1, 1, 1, 2)
        cache = _roomy_cache(RoomyLayer, [(old, old)], 8)
        keys, _ = cache.update(new, new, 0)
        if not (torch.equal(keys, torch.cat([old, new], dim=2)) and cache.get_seq_length() == 3):
            return None
    except Exception:  # noqa: BLE001 - another transformers version (before 4.56: no DynamicLayer)
        return None
    return RoomyLayer


def _grow(old: torch.Tensor, new: torch.Tensor, limit: int = 0) -> torch.Tensor:
    """`torch.cat([old, new], dim=2)` for (B, H, L, D) tensors, written into the room past `old` when its storage
    has it (`_roomy_layer`: only for tensors whose room is theirs). The room is read from `old`'s strides (under
    inference mode a view records no base): `old` starts a (B, H, room, D) buffer at the start of its storage.
    A new buffer holds twice the tokens (at least 64, at most `limit` where given, never fewer than needed)."""
    b, h, n, d = old.shape
    m = new.shape[2]
    room = old.stride(1) // d if d else 0
    if not (
        old.stride(3) == 1
        and old.stride(2) == d
        and old.stride(1) == room * d
        and old.stride(0) == h * room * d
        and old.storage_offset() == 0
        and room >= n + m
        and old.untyped_storage().nbytes() >= b * h * room * d * old.element_size()
    ):
        room = max(2 * (n + m), 64)
        room = max(n + m, min(room, limit)) if limit else room
        buffer = old.new_empty((b, h, room, d))
        buffer[:, :, :n] = old
    else:
        buffer = old.as_strided((b, h, room, d), old.stride())
    buffer[:, :, n : n + m] = new
    return buffer[:, :, : n + m]


def _left_pad(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x.new_zeros(shape), x], dim=dim)


@dataclass
class _Batch:
    """The rows decoding together. The cache holds every token of a row except
    its `pending` one (sampled, not yet fed to the model)."""

    rows: list[_Request]
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (B, H_kv, L, D)
    mask: torch.Tensor  # (B, L) long, 1 on real tokens
    pending: torch.Tensor  # (B,) long
    version: int  # the weights that computed `kv`


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Generation]
    generator: torch.Generator
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    result: Generation | None = None
    covers: int | None = None  # the kept cache whose every token this row's prompt starts with (its key)

    def context(self) -> list[int]:
        """Every token the model has seen or sampled for this row: the prompt, then the turn so far."""
        return self.prompt_ids + self.token_ids


@dataclass
class _Prefix:
    """A finished row's cache, kept for a later prompt that starts the same way."""

    tokens: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (1, H_kv, len(tokens), D)
    nbytes: int
    hashes: list[int]  # `_chain(tokens)`


def _chain(tokens: list[int], known: Sequence[int] = ()) -> list[int]:
    """`out[k - 1]` stands for `tokens[:k]`: each hash from the one before it and one token, O(len) in all.
    `known`: the chain of a run `tokens` starts with, taken as it is."""
    out = list(known)
    h = out[-1] if out else 0
    for t in tokens[len(out) :]:
        h = hash((h, t))
        out.append(h)
    return out


class _KeptCaches:
    """Finished rows' caches within a memory bound, least recently used dropped first, found by the longest
    start they share with a prompt.

    Every leading run of a kept cache's tokens is indexed by its hash, so a lookup is a
    binary search over the prompt's own leading runs (a run that some cache holds has
    every shorter run held too): O(prompt) however many caches are kept, where a scan of
    the caches took milliseconds per request once thousands shared a system prompt.
    Adding or dropping a cache is O(its tokens). The index is Python objects outside
    `limit`: about 260 bytes a kept token (the tiny model's keys and values take 512 a
    token, SmolLM2-135M's 46 KiB).
    """

    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes
        self.caches: OrderedDict[int, _Prefix] = OrderedDict()  # least recently used first
        self.nbytes = 0
        # a leading run's hash -> the keys of the caches holding it, oldest first
        self._index: dict[int, dict[int, None]] = {}
        self._whole: dict[int, int] = {}  # the hash of all of a cache's tokens -> its key
        self._keys = itertools.count()

    def add(self, prefix: _Prefix) -> None:
        if prefix.nbytes > self.limit:
            return
        key = next(self._keys)
        self.caches[key] = prefix
        self.nbytes += prefix.nbytes
        for h in prefix.hashes:
            self._index.setdefault(h, {})[key] = None
        if prefix.hashes:
            self._whole[prefix.hashes[-1]] = key
        while self.nbytes > self.limit:
            self.drop(next(iter(self.caches)))

    def drop(self, key: int) -> None:
        prefix = self.caches.pop(key, None)
        if prefix is None:
            return
        self.nbytes -= prefix.nbytes
        if prefix.hashes and self._whole.get(prefix.hashes[-1]) == key:
            del self._whole[prefix.hashes[-1]]
        for h in prefix.hashes:
            holders = self._index[h]
            del holders[key]
            if not holders:
                del self._index[h]

    def clear(self) -> None:
        self.caches.clear()
        self._index.clear()
        self._whole.clear()
        self.nbytes = 0

    def find(self, prompt: list[int]) -> tuple[_Prefix, int, int] | None:
        """A kept cache sharing the most leading tokens with `prompt`, how many of them to use, and its key: one
        that holds no more than them where there is one (the new row's cache then holds it whole, and it can be
        dropped), else the one added last. None unless it is at least as many as the prompt has past them (else a
        batched prefill of the whole prompt is cheaper). Never the prompt's last token, whose logits the prefill
        must compute."""
        most = len(prompt) - 1
        least = (len(prompt) + 1) // 2
        if not self._index or most < max(least, 1):
            return None
        hashes = _chain(prompt[:most])
        if hashes[least - 1] not in self._index:
            return None
        lo, hi = least, most  # prompt[:lo] is held; the longest held run is at most `hi`
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if hashes[mid - 1] in self._index else (lo, mid - 1)
        key = self._whole.get(hashes[lo - 1])
        if key is None or len(self.caches[key].tokens) != lo:
            key = next(reversed(self._index[hashes[lo - 1]]))
        prefix = self.caches[key]
        if prefix.tokens[:lo] != prompt[:lo]:  # two runs with one hash: reuse nothing rather than the wrong cache
            return None
        self.caches.move_to_end(key)
        return prefix, lo, key


_Hit = tuple[_Request, _Prefix, int]  # a request, the kept cache its prompt starts with, how many of its tokens


# --------------------------------------------------------------------------- the policy


class HFPolicy(PolicyBackend):
    """A transformers causal LM as a `Policy`.

    Args:
        config: Where the model is and how to run it.
        model: An already built model (skips loading `config.model`).
        tokenizer: An already built tokenizer (skips loading).
    """

    def __init__(self, config: HFPolicyConfig, model: Any = None, tokenizer: Tokenizer | None = None):
        self.config = config
        self.weight_version = 0
        self.device = _device(config)
        self.tokenizer = tokenizer if tokenizer is not None else load_hf_tokenizer(config.model, config.tokenizer)
        if model is None:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(
                config.model, dtype=_DTYPES[config.dtype], attn_implementation=config.attn_implementation
            )
        self.model = model.to(device=self.device, dtype=_DTYPES[config.dtype]).eval()
        mcfg = self.model.config
        self.max_model_len = config.max_model_len or getattr(mcfg, "max_position_embeddings", None) or 2048
        self.eos_token_ids = self._eos_ids()
        self.stats: HFPolicyStats = HFPolicyStats()
        self._seed_rng = random.Random(config.seed)
        self._lock = threading.Lock()  # one forward or weight load at a time
        self._waiting: deque[_Request] = deque()
        self._batch: _Batch | None = None
        self._runner: asyncio.Task[None] | None = None
        self._kept = _KeptCaches(config.prefix_cache_mb << 20)

    @classmethod
    def from_pretrained(cls, path: str, **kwargs: Any) -> HFPolicy:
        """`HFPolicy(HFPolicyConfig(model=path, **kwargs))`."""
        return cls(HFPolicyConfig(model=str(path), **kwargs))

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_cfg = getattr(self.model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif eos is not None:
            ids.update(int(e) for e in eos)
        return frozenset(ids)

    # ------------------------------------------------------------------ public API

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """Sample one continuation of `prompt_ids`; batched with concurrent calls."""
        prompt_ids = self._check_prompt(prompt_ids)
        seed = params.seed if params.seed is not None else self._seed_rng.randrange(2**63)
        loop = asyncio.get_running_loop()
        req = _Request(prompt_ids, params, loop.create_future(), torch.Generator().manual_seed(seed))
        self._waiting.append(req)
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run())
        return await req.future

    def generate_sync(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """Blocking `generate` for scripts (not from inside a running event loop)."""
        return self.generate_many_sync([prompt_ids], params)[0]

    def generate_many_sync(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Blocking batched `generate` of several prompts with the same params."""
        refuse_inside_loop("generate_sync() called inside a running event loop; use `await generate()`")

        async def _all() -> list[Generation]:
            return list(await asyncio.gather(*(self.generate(p, params) for p in prompts)))

        return asyncio.run(_all())

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, Any]] | Mapping[str, Any]) -> None:
        """Copy the trainer's weights into the model (names as in `state_dict()`).

        Prefixes added by wrappers (`module.`, `_orig_mod.`) are stripped. A
        name the model does not have raises ValueError. Sequences decoding at
        that moment continue with the new weights, over a cache recomputed by them.
        A push that raises part way (a bad name or shape) is still a new version
        when it copied anything: the weights changed, so the old version no
        longer names them (the tensors stream in one at a time: none is kept to
        check them all first).
        """
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        state = self.model.state_dict(keep_vars=True)
        unknown = []
        copied = 0
        with self._lock:
            try:
                for name, tensor in items:
                    key = name
                    for prefix in ("module.", "_orig_mod."):
                        while key.startswith(prefix):
                            key = key[len(prefix) :]
                    target = state.get(key)
                    if target is None:
                        unknown.append(name)
                        continue
                    if tuple(target.shape) != tuple(tensor.shape):
                        raise ValueError(f"load_weights: {name} has shape {tuple(tensor.shape)}, model has {tuple(target.shape)}")
                    target.data.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
                    copied += 1
            finally:
                if copied:
                    self.weight_version += 1
                    self._kept.clear()  # computed by the old weights
        if unknown:
            raise ValueError(f"load_weights: the model has no parameter named {unknown[:5]} ({len(unknown)} unknown)")

    # ------------------------------------------------------------------ scheduler (event loop side)

    async def _run(self) -> None:
        """Feed waiting requests into the batch and step it until both are empty."""
        while self._waiting or self._batch is not None:
            rows = len(self._batch.rows) if self._batch is not None else 0
            new: list[_Request] = []
            while self._waiting and rows + len(new) < self.config.max_batch_size:
                req = self._waiting.popleft()
                if not req.future.done():  # cancelled while waiting
                    new.append(req)
            try:
                done = await asyncio.to_thread(self._step, new)
            except Exception as exc:  # the model failed: fail its requests, keep serving the rest
                failed = new + (self._batch.rows if self._batch is not None else [])
                self._batch = None
                for req in failed:
                    if not req.future.done():
                        req.future.set_exception(exc)
                continue
            for req in done:
                if not req.future.done():
                    assert req.result is not None  # a finished request holds its Generation (`_advance`)
                    req.future.set_result(req.result)

    # ------------------------------------------------------------------ decoding (worker thread)

    def _step(self, new: list[_Request]) -> list[_Request]:
        """One decode step of the batch plus the prefill of `new`; returns finished rows."""
        with self._lock, torch.inference_mode():
            if self._batch is not None:
                # Rows whose caller went away (cancelled) leave before the forward.
                keep = [i for i, r in enumerate(self._batch.rows) if not r.future.done()]
                if len(keep) < len(self._batch.rows):
                    self._select(keep)
            logits_parts = []
            if self._batch is not None and self._batch.version != self.weight_version:
                # A push since the cache was computed: the next tokens must come from the new weights
                # over a cache the new weights computed, or their version would name the wrong policy.
                stale, self._batch = self._batch.rows, None
                self.stats.rows_recomputed += len(stale)
                for group in self._prefill_groups(stale):
                    new_batch, new_logits = self._prefill(group)
                    self._merge(new_batch)
                    logits_parts.append(new_logits)
            elif self._batch is not None:
                logits_parts.append(self._decode())
            fresh, hits = [], []
            for r in new:
                hit = self._kept.find(r.prompt_ids)
                if hit is None:
                    fresh.append(r)
                    continue
                prefix, n, key = hit
                r.covers = key if n == len(prefix.tokens) else None
                hits.append((r, prefix, n))
            for hit_group in self._hit_groups(hits):
                new_batch, new_logits = self._prefill_after(hit_group)
                self._merge(new_batch)
                logits_parts.append(new_logits)
            for group in self._prefill_groups(sorted(fresh, key=lambda r: len(r.prompt_ids))):
                new_batch, new_logits = self._prefill(group)
                self._merge(new_batch)
                logits_parts.append(new_logits)
            if self._batch is None:
                return []
            logits = torch.cat(logits_parts, dim=0)  # (B, V), rows in batch order
            return self._sample_and_advance(logits)

    def _prefill_groups(self, reqs: list[_Request]) -> list[list[_Request]]:
        """Split new requests (in order) so each padded prefill stays within `max_prefill_tokens`."""
        groups: list[list[_Request]] = []
        cur: list[_Request] = []
        width = 0
        for r in reqs:
            w = max(width, len(r.context()))
            if cur and w * (len(cur) + 1) > self.config.max_prefill_tokens:
                groups.append(cur)
                cur, w = [], len(r.context())
            cur.append(r)
            width = w
        if cur:
            groups.append(cur)
        return groups

    def _prefill(self, reqs: list[_Request]) -> tuple[_Batch, torch.Tensor]:
        """Run left-padded contexts (a new row's prompt; a recomputed row's prompt and turn so far);
        returns their batch state and last logits (n, V)."""
        contexts = [r.context() for r in reqs]
        n, width = len(reqs), max(len(c) for c in contexts)
        ids = torch.zeros((n, width), dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, width - len(c) :] = torch.tensor(c)
            mask[i, width - len(c) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (n, W)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1
        )
        self.stats.prefill_calls += 1
        self.stats.rows_prefilled += n
        # The cache covers every context token; `pending` is overwritten by the token sampled next.
        kv = _cache_kv(out.past_key_values)
        batch = _Batch(rows=list(reqs), kv=kv, mask=mask, pending=ids[:, -1], version=self.weight_version)
        return batch, out.logits[:, -1]

    def _hit_groups(self, hits: list[_Hit]) -> list[list[_Hit]]:
        """Split kept-cache hits, fewest new tokens first, into the groups `_prefill_after` runs.

        A group's forward takes the same number of input tokens per row (its
        most new tokens): a row with fewer reads fewer from its kept cache and
        feeds the rest again, so no padding sits among a row's tokens. A row
        joins a group only if that still leaves it a kept token, and only while
        the group's columns, kept and fed, times its rows stay within
        `max_prefill_tokens` (a first hit alone may exceed it, as one long
        prompt does in `_prefill_groups`).
        """
        groups: list[list[_Hit]] = []
        cur: list[_Hit] = []
        shortest = longest = 0  # of `cur`'s prompts
        for h in sorted(hits, key=lambda h: (len(h[0].prompt_ids) - h[2], len(h[0].prompt_ids))):
            r, _, n = h
            size, new = len(r.prompt_ids), len(r.prompt_ids) - n  # `new`: the most in `cur` with `h` (sorted)
            lo, hi = (min(shortest, size), max(longest, size)) if cur else (size, size)
            # each row feeds `new` tokens over its first len - new kept ones: columns `hi`, at least one kept
            if cur and (lo - new < 1 or hi * (len(cur) + 1) > self.config.max_prefill_tokens):
                groups.append(cur)
                cur, lo, hi = [], size, size
            cur.append(h)
            shortest, longest = lo, hi
        if cur:
            groups.append(cur)
        return groups

    def _prefill_after(self, hits: list[_Hit]) -> tuple[_Batch, torch.Tensor]:
        """Prefill a group of hits (`_hit_groups`) in one forward over their kept caches; returns their batch
        state and last logits (rows, V).

        Each row feeds its last `width` prompt tokens (the group's most new
        tokens) over the kept cache of the ones before them, left-padded like
        any row: each computes what it computes alone (up to float rounding),
        and the kept caches are read, not written.
        """
        width = max(len(r.prompt_ids) - n for r, _, n in hits)
        used = [len(r.prompt_ids) - width for r, _, _ in hits]  # kept tokens each row reads, at least 1
        kept = max(used)
        b = len(hits)
        ids = torch.tensor([r.prompt_ids[-width:] for r, _, _ in hits])
        pos = torch.stack([torch.arange(u, u + width) for u in used])
        mask = torch.zeros((b, kept + width), dtype=torch.long)
        for i, u in enumerate(used):
            mask[i, kept - u :] = 1
        kv = []
        for layer, (k0, v0) in enumerate(hits[0][1].kv):  # per layer: the kept tokens, right-aligned at `kept`
            k = k0.new_zeros((b, k0.shape[1], kept, k0.shape[3]))
            v = v0.new_zeros((b, v0.shape[1], kept, v0.shape[3]))
            for i, ((_, prefix, _), u) in enumerate(zip(hits, used)):
                pk, pv = prefix.kv[layer]
                k[i, :, kept - u :] = pk[0, :, :u]
                v[i, :, kept - u :] = pv[0, :, :u]
            kv.append((k, v))
        ids, pos, mask = ids.to(self.device), pos.to(self.device), mask.to(self.device)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=_make_cache(kv),
            use_cache=True, logits_to_keep=1,
        )  # fmt: skip
        self.stats.prefill_calls += 1
        self.stats.rows_prefilled += b
        self.stats.prefix_hits += b
        self.stats.prefix_tokens += sum(used)
        batch = _Batch(rows=[r for r, _, _ in hits], kv=_cache_kv(out.past_key_values), mask=mask,
                       pending=ids[:, -1], version=self.weight_version)  # fmt: skip
        return batch, out.logits[:, -1]

    def _keep_prefixes(self, done: list[int]) -> None:
        """Keep the caches of the finished rows `done` (batch indices), within `prefix_cache_mb`."""
        b = cast(_Batch, self._batch)
        per_token = sum((k.shape[1] * k.shape[3] + v.shape[1] * v.shape[3]) * k.element_size() for k, v in b.kv)
        for i in done:
            n = int(b.mask[i].sum())  # the row's cached tokens: the rightmost n columns (rows are left-padded)
            if n == 0 or b.version != self.weight_version or n * per_token > self._kept.limit:
                continue  # not kept (then a cache it covers stays)
            tokens = b.rows[i].context()[:n]
            key = b.rows[i].covers
            covered = self._kept.caches.get(key) if key is not None else None
            if key is not None:  # every token of that cache is at the start of this row's: one copy is enough
                self._kept.drop(key)
            kv = [(k[i : i + 1, :, -n:].clone(), v[i : i + 1, :, -n:].clone()) for k, v in b.kv]
            self._kept.add(_Prefix(tokens, kv, n * per_token, _chain(tokens, covered.hashes if covered else ())))

    def _decode(self) -> torch.Tensor:
        """Feed each row's pending token; returns next-token logits (B, V)."""
        b = cast(_Batch, self._batch)  # decode/select/sample run only on a live batch
        pos = b.mask.sum(-1, keepdim=True)  # (B, 1): position of the pending token
        mask = torch.cat([b.mask, torch.ones_like(b.mask[:, :1])], dim=-1)  # (B, L+1)
        out = self.model(
            input_ids=b.pending.unsqueeze(-1),
            attention_mask=mask,
            position_ids=pos,
            past_key_values=_make_cache(b.kv, room_limit=self.max_model_len),
            use_cache=True,
        )
        self.stats.decode_calls += 1
        b.kv, b.mask = _cache_kv(out.past_key_values), mask
        logits: torch.Tensor = out.logits[:, -1]
        return logits

    def _merge(self, new: _Batch) -> None:
        """Append `new` rows to the batch, left-padding the shorter cache (both computed by the same weights)."""
        if self._batch is None:
            self._batch = new
            return
        b = self._batch
        assert b.version == new.version, (b.version, new.version)  # one step runs under the lock: no push between
        la, lb = b.mask.shape[1], new.mask.shape[1]
        pad_a, pad_b = max(lb - la, 0), max(la - lb, 0)
        b.kv = [
            (
                torch.cat([_left_pad(ka, pad_a, 2), _left_pad(kb, pad_b, 2)], dim=0),
                torch.cat([_left_pad(va, pad_a, 2), _left_pad(vb, pad_b, 2)], dim=0),
            )
            for (ka, va), (kb, vb) in zip(b.kv, new.kv)
        ]
        b.mask = torch.cat([_left_pad(b.mask, pad_a, 1), _left_pad(new.mask, pad_b, 1)], dim=0)
        b.pending = torch.cat([b.pending, new.pending])
        b.rows = b.rows + new.rows

    def _select(self, keep: list[int]) -> None:
        """Keep only rows `keep`, then drop columns that are padding in every row."""
        if not keep:
            self._batch = None
            return
        b = cast(_Batch, self._batch)  # decode/select/sample run only on a live batch
        idx = torch.tensor(keep, device=b.mask.device)
        mask = b.mask.index_select(0, idx)
        # Leading columns that no remaining row uses.
        first = int((mask.sum(0) > 0).long().argmax())
        b.mask = mask[:, first:]
        b.kv = [(k.index_select(0, idx)[:, :, first:], v.index_select(0, idx)[:, :, first:]) for k, v in b.kv]
        b.pending = b.pending.index_select(0, idx)
        b.rows = [b.rows[i] for i in keep]

    def _sample_and_advance(self, logits: torch.Tensor) -> list[_Request]:
        b = cast(_Batch, self._batch)  # decode/select/sample run only on a live batch
        rows = b.rows
        dev = logits.device
        temps = torch.tensor([r.params.temperature for r in rows], device=dev).unsqueeze(-1)  # (B, 1)
        logp, ent = logprobs_and_entropy(logits, temps)  # (B, V), (B,)
        greedy = torch.tensor([r.params.greedy for r in rows], device=dev)
        top_k = torch.tensor([r.params.top_k for r in rows], device=dev, dtype=torch.long)
        top_p = torch.tensor([r.params.top_p for r in rows], device=dev, dtype=torch.float32)
        # One uniform per row from its own generator (drawn even for greedy rows: harmless).
        u = torch.tensor([float(torch.rand((), generator=r.generator)) for r in rows], device=dev)
        tokens = _sample_rows(logp, greedy, top_k, top_p, u)  # (B,)
        tok_logp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        tokens_l, lp_l, ent_l = tokens.tolist(), tok_logp.tolist(), ent.tolist()

        self.stats.max_rows = max(self.stats.max_rows, len(rows))
        keep, done, finished = [], [], []
        for i, r in enumerate(rows):
            if self._advance(r, tokens_l[i], lp_l[i], ent_l[i], b.version):
                done.append(r)
                finished.append(i)
            else:
                keep.append(i)
        b.pending = tokens
        if done:
            self.stats.requests += len(done)
            if self.config.prefix_cache_mb:
                self._keep_prefixes(finished)
            self._select(keep)
        return done

    def _advance(self, r: _Request, tok: int, lp: float, h: float, version: int) -> bool:
        """Record one sampled token for `r` (sampled by weights `version`); returns True when `r` is finished."""
        p = r.params
        self.stats.generated_tokens += 1
        if tok in self.eos_token_ids:
            if p.include_eos:
                r.token_ids.append(tok)
                r.logprobs.append(lp)
                r.entropies.append(h)
                r.versions.append(version)
            r.result = Generation(r.token_ids, r.logprobs, r.entropies, "eos", versions=r.versions)
            return True
        r.token_ids.append(tok)
        r.logprobs.append(lp)
        r.entropies.append(h)
        r.versions.append(version)
        if p.stop:
            hit = self._find_stop(r.token_ids, p.stop)
            if hit is not None:
                r.result = Generation(r.token_ids, r.logprobs, r.entropies, "stop", stop_string=hit, versions=r.versions)
                return True
        if len(r.token_ids) >= p.max_tokens or len(r.prompt_ids) + len(r.token_ids) >= self.max_model_len:
            r.result = Generation(r.token_ids, r.logprobs, r.entropies, "length", versions=r.versions)
            return True
        return False
