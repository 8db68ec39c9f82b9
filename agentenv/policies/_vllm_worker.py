"""Methods that vLLM mixes into its worker processes (`worker_extension_cls`).

The policy in the trainer's process reaches them through the engine's
`collective_rpc`. Two jobs:

- weights: the trainer's weights are staged (views of a buffer in host memory
  that the policy wrote and each worker maps: only its path crosses the RPC),
  then committed in one in-place reload;
- entropy: `agentenv_install_entropy` makes the worker's sampler report each
  sampled token's exact entropy, computed here where the full distribution is
  (see `EntropySampler`), so no vocabulary-sized logprob lists leave the worker.

vLLM imports this module by name inside each worker, so it must stay
importable without side effects.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "EntropySampler",
    "WorkerExtension",
    "decode_entropies",
    "encode_entropies",
    "install_entropy_sampler",
    "token_entropy",
]

# The sign bit of an int64. A real rank is >= 1, so a rank slot with this bit set holds an entropy.
_TAG = -(1 << 63)


class WorkerExtension:
    """Mixed into each vLLM worker (one per tensor-parallel rank)."""

    def agentenv_stage_weights(self, path: str, size: int, index: list[list[Any]]) -> int:
        """Keep the weights the policy wrote into its buffer (`agentenv.policies.vllm.engine.WeightBuffer`) until
        the commit: views of the buffer, mapped, not read, so the commit's load is the only copy.

        The mapping is kept for the next push, which the policy writes into the
        same pages (a fresh mapping costs a fault per page). The views are
        dropped at the commit, before the policy writes again.

        Returns:
            How many tensors are staged so far.
        """
        import torch

        kept = self.__dict__.get("_agentenv_buffer")
        if kept is None or kept[0] != path or kept[1] < size:
            kept = (path, size, torch.from_file(path, shared=True, size=max(size, 1), dtype=torch.uint8))
            self.__dict__["_agentenv_buffer"] = kept
        mapped = kept[2]
        staged = self.__dict__.setdefault("_agentenv_staged", {})
        for name, dtype, shape, offset in index:
            to = getattr(torch, dtype)
            n = to.itemsize * math.prod(shape)
            staged[name] = mapped[offset : offset + n].view(to).view(shape)
        return len(staged)

    def agentenv_commit_weights(self, in_place: bool = True) -> int:
        """Load every staged tensor into the model; returns their count.

        On CPU (one worker, unquantized weights) in place (`_commit_in_place`):
        each tensor is copied where the model keeps it and each linear layer's
        kernel is rebuilt from the staged tensors, no more. Elsewhere, for a
        tensor that path does not know, or with `in_place=False`, vLLM's
        layerwise reload: it restores each layer's checkpoint layout in fresh
        memory, loads, and re-runs the layer's post-load processing (on CPU:
        repacking linear weights for oneDNN), so the new values reach the
        kernels. Every layer must be in one reload, hence staging.
        """
        staged: dict[str, Any] = self.__dict__.pop("_agentenv_staged", {})
        if not staged:
            return 0
        model = self.model_runner.get_model()
        plan = _in_place_plan(model, staged, self.vllm_config) if in_place else None
        self.__dict__["_agentenv_last_commit"] = "in_place" if plan is not None else "reload"
        if plan is not None:
            _commit_in_place(model, plan)
            return len(staged)
        _skip_computed_buffers(model)
        if getattr(model.config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in staged:
            # a trainer sends a tied tensor once (under the embedding's name); the reload counts the head's
            # weight as its own, so it gets the same tensor (no copy) instead of a "Failed to load weights"
            staged.setdefault("lm_head.weight", staged["model.embed_tokens.weight"])
        self.reload_weights(weights_iterator=iter(staged.items()), is_checkpoint_format=True)
        _refresh_tied_lm_head(model)
        return len(staged)

    def agentenv_last_commit(self) -> str:
        """How the last commit loaded: "in_place" (`_commit_in_place`) or "reload" (vLLM's layerwise reload)."""
        return str(self.__dict__.get("_agentenv_last_commit", ""))

    def agentenv_packed_modules(self) -> dict[str, list[str]]:
        """The model's stacked layers, `{"qkv_proj": ["q_proj", "k_proj", "v_proj"], ...}`: the checkpoint tensors
        vLLM stacks into one weight, in its order. A push writes them one after another (`WeightBuffer.write`), so
        the stacked weight is a view of the buffer."""
        packed = getattr(self.model_runner.get_model(), "packed_modules_mapping", None) or {}
        return {str(k): [str(s) for s in v] for k, v in dict(packed).items()}

    def agentenv_nccl_join(self, host: str, port: int, rank_offset: int, world_size: int) -> int:
        """Join the trainer's weight-broadcast group (`agentenv.policies.weight_group`) as rank
        `rank_offset` + this worker's tensor-parallel rank; returns that rank."""
        from agentenv.policies.weight_group import WeightGroup

        rank = rank_offset + int(getattr(self, "rank", 0))
        old = self.__dict__.pop("_agentenv_group", None)
        if old is not None:
            old.close()
        self.__dict__["_agentenv_group"] = WeightGroup(host, port, rank, world_size, backend="nccl", device=self.device)
        return rank

    def agentenv_nccl_receive(self) -> int:
        """Receive one push's tensors from the group, then load them in one reload; returns their count."""
        staged = self.__dict__.setdefault("_agentenv_staged", {})
        for name, tensor in self.__dict__["_agentenv_group"].receive():
            staged[name] = tensor
        return self.agentenv_commit_weights()

    def agentenv_drop_staged_weights(self) -> None:
        """Forget staged chunks (after a failed transfer)."""
        self.__dict__.pop("_agentenv_staged", None)

    def agentenv_install_entropy(self) -> str:
        """Make this worker's sampler report exact entropies (idempotent); returns its class name."""
        return install_entropy_sampler(self.model_runner)


def _skip_computed_buffers(model: Any) -> None:
    """Tell vLLM's layerwise reload which buffers no checkpoint holds.

    The reload counts every parameter and buffer of a layer as something to
    load; a layer that got none of them is reported ("RotaryEmbedding: Failed
    to load weights", at every push) and gets its old tensors back. A rotary
    embedding holds only `cos_sin_cache`, a non-persistent buffer computed from
    the config, never saved in a checkpoint: putting it back is right, the
    warning is not. vLLM lists the tensors that no weight loader ever fills in
    `reload.meta.SKIP_LOAD_TENSORS` (by name); we add the names of the
    non-persistent buffers of parameterless layers (the rotary caches), unless a
    loadable tensor elsewhere in the model has the same name. The reload then
    skips them and still puts them back. Without that set (another vLLM
    version) nothing changes but the warning.
    """
    try:
        from vllm.model_executor.model_loader.reload.meta import SKIP_LOAD_TENSORS
    except ImportError:
        return
    computed: set[str] = set()
    loadable: set[str] = set()
    for module in model.modules():
        params = [n for n, p in module.named_parameters(recurse=False) if p is not None]
        loadable.update(params)
        non_persistent = module._non_persistent_buffers_set
        for name, buf in module.named_buffers(recurse=False):
            if buf is None:
                continue
            (computed if not params and name in non_persistent else loadable).add(name)
    SKIP_LOAD_TENSORS.update(computed - loadable)


def _refresh_tied_lm_head(model: Any) -> None:
    """Re-derive the output projection of a model whose lm_head shares the embedding.

    The reload never sees an `lm_head` weight of its own for a tied model, so it
    puts the layer's old kernel tensors back (on CPU a prepacked copy of the old
    embedding): the logits would keep using the old weights. Re-tying and
    re-processing rebuilds that kernel from the new embedding.
    """
    lm_head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if lm_head is None or embed is None or not getattr(model.config, "tie_word_embeddings", False):
        return
    quant_method = getattr(lm_head, "quant_method", None)
    if quant_method is None or not hasattr(lm_head, "weight"):
        return
    lm_head.weight = embed.weight
    quant_method.process_weights_after_loading(lm_head)


_Target = tuple[Any, str, list[Any], bool]
"""One parameter of an in-place commit: (its module, its name there, the staged tensors that fill it in order
(the shards vLLM stacks, or one tensor), whether the module's kernel holds its own copy of it (`_commit_in_place`))."""


def _in_place_plan(model: Any, staged: dict[str, Any], vllm_config: Any) -> list[_Target] | None:
    """Where each staged tensor goes in the model, when `_commit_in_place` can load them all; else None.

    It can on vLLM's CPU platform, for one worker (no tensor or pipeline
    parallel shards), without quantization or LoRA, when every name is a
    parameter of the model (`model.layers.0.input_layernorm.weight`) or a
    shard of one that vLLM stacks (`...q_proj.weight` of `...qkv_proj.weight`,
    per the model's `packed_modules_mapping`), every shape is the parameter's
    (the shards' rows add up to it in vLLM's order; an embedding may have
    padded rows), and every module touched is one whose post-load processing
    is known: an unquantized linear layer or embedding, or a module without
    one (a norm). With one worker, vLLM's loaders copy a tensor whole (a
    shard at its rows), which is what the in-place commit does.
    """
    import torch

    try:
        from vllm.distributed import get_pp_group, get_tensor_model_parallel_world_size
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
            VocabParallelEmbedding,
        )
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader
        from vllm.platforms import current_platform
    except ImportError:  # another vLLM version: the reload
        return None
    if not current_platform.is_cpu() or vllm_config.quant_config is not None or vllm_config.lora_config is not None:
        return None
    if current_platform.is_zen_cpu():  # zentorch may keep a reference to the weight it was given (the buffer)
        return None
    if get_tensor_model_parallel_world_size() != 1 or get_pp_group().world_size != 1:
        return None
    packed = getattr(model, "packed_modules_mapping", None) or {}
    shard_of = {shard: (name, i, len(shards)) for name, shards in packed.items() for i, shard in enumerate(shards)}

    def submodule(path: str) -> Any:
        try:
            return model.get_submodule(path)
        except AttributeError:
            return None

    groups: dict[tuple[str, str], dict[int, Any]] = {}
    expected: dict[tuple[str, str], int] = {}
    for name, tensor in staged.items():
        path, _, leaf = name.rpartition(".")
        module = submodule(path)
        if module is not None and isinstance(getattr(module, leaf, None), torch.nn.Parameter):
            key, i, n = (path, leaf), 0, 1
        else:
            parent, _, last = path.rpartition(".")
            if last not in shard_of:
                return None
            stacked, i, n = shard_of[last]
            key = (f"{parent}.{stacked}" if parent else stacked, leaf)
        parts = groups.setdefault(key, {})
        if i in parts or expected.setdefault(key, n) != n:
            return None
        parts[i] = tensor

    plan: dict[int, _Target] = {}  # by parameter: a tied one sent under two names gets the last, as vLLM's loader
    for (path, leaf), parts in groups.items():
        module = submodule(path)
        param = getattr(module, leaf, None)
        if module is None or not isinstance(param, torch.nn.Parameter) or len(parts) != expected[(path, leaf)]:
            return None
        shards = [parts[i] for i in range(len(parts))]
        method = getattr(module, "quant_method", None)
        if method is None:
            if hasattr(module, "process_weights_after_loading"):
                return None
        elif not isinstance(method, (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)):
            return None
        rest = shards[0].shape[1:]
        if len(shards) > 1 and any(s.dim() == 0 or s.shape[1:] != rest for s in shards):
            return None
        sizes = getattr(module, "output_sizes", None)
        if len(shards) > 1 and (sizes is None or list(sizes) != [s.shape[0] for s in shards]):
            return None
        packed_away = param.numel() == 0 and isinstance(method, UnquantizedLinearMethod) and leaf == "weight"
        if packed_away:  # the kernel keeps the only copy (CPU: oneDNN's packed weight)
            want = (module.output_size_per_partition, module.input_size_per_partition)
            if tuple(rest) != want[1:] or sum(s.shape[0] for s in shards) != want[0]:
                return None
            if any(s.dtype != param.dtype for s in shards):
                return None
        else:
            loader = getattr(param, "weight_loader", default_weight_loader)
            owner = getattr(loader, "__self__", None)  # a tied head's weight has its embedding's loader
            if loader is not default_weight_loader and not isinstance(owner, (LinearBase, VocabParallelEmbedding)):
                return None  # a loader of the model's own (it may transform the tensor)
            if len(shards) == 1 and shards[0].shape == param.shape:
                pass
            elif shards[0].dim() == 0 or tuple(rest) != tuple(param.shape[1:]):
                return None
            else:
                rows = sum(s.shape[0] for s in shards)
                vocab = getattr(module, "org_vocab_size", None) if isinstance(module, VocabParallelEmbedding) else None
                if rows != param.shape[0] and not (len(shards) == 1 and rows == vocab):  # padded vocabulary rows
                    return None
        plan[id(param)] = (module, leaf, shards, packed_away)
    return list(plan.values())


def _commit_in_place(model: Any, plan: list[_Target]) -> None:
    """Load `_in_place_plan`'s tensors: the only copies are into the model's own memory.

    A parameter the model keeps is overwritten in place (a stacked one shard by
    shard at its rows; an embedding's padded rows zeroed, as vLLM's loader
    does). A linear layer whose CPU kernel keeps the only copy of its weight
    (vLLM's oneDNN handler packs the weight into memory of its own and drops
    the parameter) is given the staged weight (for a stacked layer, a view of
    the buffer when the push wrote its shards one after another, as
    `WeightBuffer.write` does, else one concatenation) and re-runs vLLM's
    processing, which packs it into a new kernel; its empty parameter object
    is put back as vLLM's reload does. The modules that hold a parameter
    overwritten here and have processing of their own (an embedding, a tied
    output head: their CPU kernel packs a copy too) re-run it. The end state
    is the one vLLM's layerwise reload leaves, without its fresh copy of every
    layer.
    """
    import torch

    written: set[int] = set()
    for module, leaf, shards, packed_away in plan:
        param = getattr(module, leaf)
        if packed_away:
            weight = torch.nn.Parameter(_stacked(shards), requires_grad=False)
            setattr(module, leaf, weight)
            module.quant_method.process_weights_after_loading(module)
            if module.weight is weight:  # a kernel that reads the parameter: it must not read the buffer
                weight.data = weight.data.clone()
            elif module.weight.numel() == 0:
                module.register_parameter(leaf, param)
            continue
        if len(shards) == 1 and shards[0].shape == param.shape:
            param.data.copy_(shards[0])
        else:
            row = 0
            for s in shards:
                param.data[row : row + s.shape[0]].copy_(s)
                row += s.shape[0]
            param.data[row:].zero_()
        written.add(id(param))
    done = {id(m) for m, _, _, packed_away in plan if packed_away}
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is None or id(module) in done:
            continue
        if any(id(p) in written for p in module.parameters(recurse=False)):
            method.process_weights_after_loading(module)


def _stacked(shards: list[Any]) -> Any:
    """The shards stacked along their first dimension: a view when they lie one after another in memory."""
    import torch

    first = shards[0]
    if len(shards) == 1:
        return first
    storage = first.untyped_storage().data_ptr()
    contiguous = all(s.is_contiguous() and s.dtype == first.dtype for s in shards)
    end = first.data_ptr()
    for s in shards:  # each starts where the last ended, in the same memory
        contiguous = contiguous and s.data_ptr() == end and s.untyped_storage().data_ptr() == storage
        end = s.data_ptr() + s.numel() * s.element_size()
    if not contiguous:
        return torch.cat(shards)
    rows = sum(s.shape[0] for s in shards)
    return first.as_strided((rows, *first.shape[1:]), first.stride())


# --------------------------------------------------------------------------- exact entropy in the engine


def encode_entropies(entropy: Any) -> Any:
    """(n,) entropies (a tensor) -> (n,) int64 for a rank slot: the float64 bits with the sign bit set."""
    import torch

    bits = entropy.clamp(min=0).to(torch.float64).view(torch.int64)
    return bits | _TAG


def decode_entropies(ranks: Any) -> Any:
    """The inverse of `encode_entropies` on the client, in numpy: (n,) int -> (n,) float64.

    Raises:
        ValueError: A slot holds a real rank (>= 0): the engine did not compute it.
    """
    import numpy as np

    r = np.asarray(ranks, dtype=np.int64)
    if (r >= 0).any():
        raise ValueError("a rank slot holds a rank, not an entropy")
    return (r & np.int64(~_TAG)).view(np.float64)


class EntropySampler:
    """Put in front of vLLM's sampler class: each sampled token's rank slot carries its exact entropy.

    vLLM's sampler (the V1 model runner's `vllm.v1.sample.sampler.Sampler`, and
    the V2 runner's `vllm.v1.worker.gpu.sample.sampler.Sampler`, GPU default in
    vLLM 0.32) computes, in `sample()`, the scores of the distribution each
    token is drawn from: with `logprobs_mode="processed_logprobs"` the scores
    after penalties, temperature and top-k / top-p (-inf outside the kept
    tokens); log-probabilities (V1) or logits (V2). `sample()` returns them with
    the tokens, and `__call__` gathers the requested logprobs from them into
    `logprobs_tensors`. We keep that tensor (n, V) from `sample()`, and when the
    call returns, replace `logprobs_tensors.selected_token_ranks` (n,), the
    sampled token's rank, with its entropy (`encode_entropies`).

    Why the rank slot: it is one int64 per sampled token that every request
    with `logprobs >= 0` receives whatever the other requests of its batch ask
    for (their top-k columns stay as they are), it crosses the engine's
    processes bit for bit, and nothing in vLLM reads it back. A real rank is
    >= 1, so the client tells an entropy from a rank by the sign bit and fails
    loudly instead of misreading one. The ranks vLLM computed are lost; this
    engine's clients never read them. (Speculative decoding samples through
    vLLM's rejection sampler instead of this call: its tokens would come back
    with real ranks, and the client raises.)
    """

    _agentenv_scores: Any = None  # (n, V) tensor of the step being sampled
    _agentenv_scores_are_logprobs = False  # set per vLLM sampler class by `install_entropy_sampler`

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        sampled, scores = super().sample(*args, **kwargs)  # type: ignore[misc]  # a mixin: vLLM's Sampler is the next class
        self._agentenv_scores = scores
        return sampled, scores

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._agentenv_scores = None
        out = super().__call__(*args, **kwargs)  # type: ignore[misc]  # a mixin: vLLM's Sampler is the next class
        scores, self._agentenv_scores = self._agentenv_scores, None
        lp = out.logprobs_tensors
        if lp is not None and scores is not None and scores.shape[0] == lp.selected_token_ranks.shape[0]:
            entropy = token_entropy(scores, normalized=self._agentenv_scores_are_logprobs)
            out.logprobs_tensors = lp._replace(selected_token_ranks=encode_entropies(entropy))
        return out


def token_entropy(scores: Any, normalized: bool) -> Any:
    """Entropy (nats) of each row's distribution softmax(scores), computed in float32.

    Args:
        scores: (n, V) log-probabilities (`normalized`) or logits; -inf marks
            tokens outside the distribution (top-k / top-p, masks).
        normalized: The rows are log-probabilities already (saves a log-softmax).

    Returns:
        (n,) entropies.
    """
    import torch

    logp = scores.float() if normalized else torch.log_softmax(scores.float(), dim=-1)  # (n, V)
    # One (n, V) temporary, multiplied in place: on CPU a second one costs 4x the arithmetic
    # (fresh pages for every step's allocation). p log p is 0 * -inf = nan on excluded tokens;
    # nansum counts them as the 0 they are (a masked where() costs 3x more). A row of NaN logits
    # gets entropy 0 here, but its NaN logprob still shows the fault.
    plogp = torch.exp(logp)
    plogp.mul_(logp)
    return -plogp.nansum(dim=-1)


def _known_sampler_classes() -> tuple[type, ...]:
    from vllm.v1.sample.sampler import Sampler

    known: list[type] = [Sampler]
    try:
        from vllm.v1.worker.gpu.sample.sampler import Sampler as SamplerV2
    except ImportError:  # a build without the V2 runner
        pass
    else:
        known.append(SamplerV2)
    return tuple(known)


def install_entropy_sampler(model_runner: Any) -> str:
    """Re-class `model_runner.sampler` as an `EntropySampler` of its own class; idempotent.

    Depends on vLLM's model runner keeping its sampler in `.sampler`, calling it
    once per step, and the sampler's `sample()` returning (tokens, scores)
    (checked on vLLM 0.32: both model runners). An unknown sampler raises.
    """
    import vllm

    sampler = getattr(model_runner, "sampler", None)
    if isinstance(sampler, EntropySampler):
        return type(sampler).__name__
    known = _known_sampler_classes()
    if not isinstance(sampler, known):
        raise RuntimeError(
            f"agentenv cannot compute entropies in vLLM {vllm.__version__}'s sampler "
            f"{type(sampler).__module__}.{type(sampler).__name__}: it knows {[c.__qualname__ for c in known]}. "
            "Use policy entropy_mode=topk, or a vLLM version agentenv supports"
        )
    from vllm.v1.sample.sampler import Sampler as SamplerV1

    cls = type(sampler)
    attrs = {
        "__module__": __name__,
        # V1's sample() returns log-softmaxed scores in processed_logprobs mode (engine_args sets it); V2's, logits.
        "_agentenv_scores_are_logprobs": issubclass(cls, SamplerV1) and sampler.logprobs_mode == "processed_logprobs",
    }
    sampler.__class__ = type(f"{cls.__name__}WithEntropy", (EntropySampler, cls), attrs)
    return type(sampler).__name__
