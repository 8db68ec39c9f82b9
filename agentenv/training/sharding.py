"""How the trained model is spread over the processes (`trainer.strategy`), and LoRA (`model.lora`).

`ddp`: every process holds the whole model; Accelerate wraps it in
DistributedDataParallel (nothing, with one process) and all-reduces the
gradients. `fsdp2`: we call PyTorch's `fully_shard` ourselves, one unit per
decoder layer and the root, on a 1-D mesh over all processes; parameters,
gradients and optimizer state are DTensor shards. Accelerate stays the launcher
(process group, device, `backward`), in a plain multi-process mode: it cannot
drive FSDP on CPU processes, and this way the GPUs run exactly the code the
two-process CPU test runs.

Every consumer of the weights reads them through `full_weights`: one full
tensor at a time (a collective all-gather under `fsdp2`, a view otherwise),
with LoRA merged in, under the names of the plain transformers model. The
weight push and the checkpoint's adapter folder use it; nothing ever holds two
full copies of the model.

Checkpoints: under `ddp` Accelerate's `save_state` (as before); under `fsdp2`
`torch.distributed.checkpoint` writes each rank's shards of the model and the
optimizer into `sharded/` (with LoRA, only the adapters: the base weights are
the base model's), and Accelerate's `save_state` the RNG states and the
scheduler. `agentenv export` turns any of them into a transformers folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from agentenv.configs import LoraConfig
from agentenv.errors import ConfigError

SHARDED_DIR = "sharded"
"""A checkpoint's `torch.distributed.checkpoint` folder (model and optimizer shards), under `fsdp2`."""
ADAPTER_DIR = "adapter"
"""A LoRA checkpoint's PEFT adapter folder (adapter_config.json, adapter_model.safetensors, tokenizer)."""
BASE_DIR = "base"
"""A sharded checkpoint's model config and tokenizer (no weights: they are in `sharded/`)."""
MODEL_DIR = "model"
"""A `ddp` checkpoint's full transformers folder."""

_PEFT_PREFIX = "base_model.model."


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on this rank: a DTensor is all-gathered (collective: every rank calls it)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t` (a DTensor's shard; `t` itself otherwise)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def hf_name(name: str) -> str:
    """A trained model's parameter name as the plain transformers model calls it."""
    for prefix in ("module.", "_orig_mod."):
        while name.startswith(prefix):
            name = name[len(prefix) :]
    return name.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".")


def add_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """`model` with PEFT LoRA adapters on `cfg.target_modules`; only the adapters keep requires_grad.

    Raises:
        ConfigError: (`model.lora.target_modules`) no layer of the model has such a name.
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # peft types it int; it scales by alpha / r and takes a float
        lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules), bias="none", task_type="CAUSAL_LM",
    )  # fmt: skip
    try:
        return get_peft_model(model, peft_cfg)
    except ValueError as e:  # PEFT: "Target modules {...} not found in the base model"
        raise ConfigError("model.lora.target_modules", f"{list(cfg.target_modules)}: {e}") from None


def full_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights, one full tensor at a time, as the plain transformers model names them.

    Sharded parameters are all-gathered one by one (every rank must iterate to
    the end, in the same order); LoRA adapters are merged into their base
    weight (`W + alpha/r * B @ A`) and not sent themselves. A tensor shared by
    two names (tied embeddings) is sent once, under its first name. Each
    yielded tensor may be a view of the live weights: read it, don't keep it.
    """
    lora = _lora_layers(model)
    seen: set[int] = set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen or ".lora_" in name:
            continue
        seen.add(id(t))
        full = _full(t.detach())
        owner, _, leaf = name.rpartition(".base_layer.")
        if owner and leaf == "weight" and owner in lora:
            full = _merged(lora[owner], full)
        yield hf_name(name), full


def _lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # no PEFT installed: no LoRA model can exist
        return {}
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def _merged(layer: Any, base: torch.Tensor) -> torch.Tensor:
    """base (out, in) + scaling * B (out, r) @ A (r, in), for each active adapter; a new tensor."""
    out = base.float()
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        a = _full(layer.lora_A[adapter].weight.detach()).float()  # (r, in)
        b = _full(layer.lora_B[adapter].weight.detach()).float()  # (out, r)
        delta = (b @ a) * layer.scaling[adapter]  # (out, in)
        out = out + (delta.T if getattr(layer, "fan_in_fan_out", False) else delta)
    return out.to(base.dtype)


class Strategy:
    """What differs between `ddp` and `fsdp2`, behind one interface the trainer calls.

    Args:
        accelerator: The run's `accelerate.Accelerator` (launcher, device, process group).
        name: `trainer.strategy`.
        lora: `model.lora`.

    Raises:
        ConfigError: The Accelerate launch config asks Accelerate itself to shard (FSDP, DeepSpeed,
            Megatron): one way to shard, `trainer.strategy`.
    """

    def __init__(self, accelerator: Any, name: str, lora: LoraConfig):
        from accelerate.utils import DistributedType

        kind = accelerator.distributed_type
        if kind in (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM):
            raise ConfigError(
                "trainer.strategy",
                f"{name!r}, but the Accelerate launch config sets distributed_type {kind.value}: agentenv shards the "
                "model itself. Launch with torchrun, or an Accelerate config of distributed_type MULTI_GPU (MULTI_CPU), "
                "and set trainer.strategy=fsdp2 to shard",
            )
        self.acc = accelerator
        self.name = name
        self.lora = lora
        self.sharded = name == "fsdp2"

    # ------------------------------------------------------------------ building
    def prepare(self, model: torch.nn.Module, make_optimizer: Any, make_scheduler: Any) -> tuple[Any, Any, Any]:
        """LoRA, sharding, then the optimizer (over the trainable, possibly sharded, parameters) and scheduler."""
        if self.lora.enabled:
            model = add_lora(model, self.lora)
        if not self.sharded:
            opt = make_optimizer([p for p in model.parameters() if p.requires_grad])
            prepared: tuple[Any, Any, Any] = self.acc.prepare(model, opt, make_scheduler(opt))
            return prepared
        model = self._shard(model)
        opt = make_optimizer([p for p in model.parameters() if p.requires_grad])
        sched = make_scheduler(opt)
        # Model and optimizer shards are saved with torch.distributed.checkpoint; Accelerate's save_state
        # keeps the RNG states and, registered here, the scheduler.
        self.acc.register_for_checkpointing(sched)
        return model, opt, sched

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model.to(self.acc.device)
        mesh = init_device_mesh(self.acc.device.type, (self.acc.num_processes,))
        # One unit per decoder layer (transformers lists the block class in `_no_split_modules`): its
        # parameters are gathered for its forward and backward only (and prefetched for the next layer's), so
        # besides the root's (embeddings, final norm, lm_head) only a layer or two are whole at a time.
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]  # peft's wrapper: a method, not a submodule
        blocks = set(getattr(inner, "_no_split_modules", None) or [])
        units = [m for m in model.modules() if type(m).__name__ in blocks]
        if not units:
            raise ConfigError(
                "trainer.strategy", f"fsdp2 found no decoder layer to shard in {type(inner).__name__} (_no_split_modules "
                f"{sorted(blocks)})",
            )  # fmt: skip
        for unit in units:
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)  # the rest: embeddings, final norm, lm_head
        return model

    # ------------------------------------------------------------------ updates
    def no_sync(self, model: torch.nn.Module, last: bool) -> Any:
        """Skip DDP's all-reduce on every micro-batch but the last (FSDP2 reduce-scatters each: a sum either way)."""
        if last or self.sharded:
            return contextlib.nullcontext()
        return self.acc.no_sync(model)

    def clip_grad_norm_(self, model: torch.nn.Module, max_norm: float) -> float:
        """Clip the global gradient norm; returns the norm before clipping (the same on every rank)."""
        if not self.sharded:
            return float(self.acc.clip_grad_norm_(model.parameters(), max_norm))
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # a DTensor: the norm over all shards
        return float(_full(norm))

    def common_count(self, n: int) -> int:
        """The most of `n` over the ranks, under `fsdp2` (each forward is a collective: ranks must run as many)."""
        if not self.sharded or self.acc.num_processes == 1:
            return n
        import torch.distributed as dist

        t = torch.tensor([n], device=self.acc.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    # ------------------------------------------------------------------ checkpoints
    def save(self, model: torch.nn.Module, opt: Any, staging: Path, tokenizer: Any) -> None:
        """Write the model (and optimizer, under `fsdp2`) into `staging`; every rank calls it.

        Accelerate's `save_state` must have run first (optimizer and model
        under `ddp`; RNG states and scheduler always).
        """
        unwrapped = self.acc.unwrap_model(model)
        main = self.acc.is_main_process
        if self.sharded:
            import torch.distributed.checkpoint as dcp

            dcp.save(self._dcp_state(model, opt), checkpoint_id=str(staging / SHARDED_DIR))
        if self.lora.enabled:
            # The adapters, gathered (small): a PEFT folder that `export` merges and PEFT loads.
            adapters = {n: _full(p.detach()) for n, p in unwrapped.named_parameters() if p.requires_grad}
            if main:
                unwrapped.save_pretrained(staging / ADAPTER_DIR, state_dict=_peft_names(adapters))
                tokenizer.save_pretrained(staging / ADAPTER_DIR)
        elif self.sharded:
            if main:
                unwrapped.config.save_pretrained(staging / BASE_DIR)
                if unwrapped.generation_config is not None:
                    unwrapped.generation_config.save_pretrained(staging / BASE_DIR)
                tokenizer.save_pretrained(staging / BASE_DIR)
        elif main:
            unwrapped.save_pretrained(staging / MODEL_DIR, safe_serialization=True)
            tokenizer.save_pretrained(staging / MODEL_DIR)

    def load(self, model: torch.nn.Module, opt: Any, ckpt: Path) -> None:
        """Load what `save` wrote under `fsdp2` (Accelerate's `load_state` does the rest); every rank calls it."""
        if not self.sharded:
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        if not (ckpt / SHARDED_DIR).is_dir():
            raise ConfigError(
                "trainer.strategy", f"fsdp2, but checkpoint {ckpt} was written by a ddp run (no {SHARDED_DIR}/); "
                "resume it with trainer.strategy=ddp",
            )  # fmt: skip
        state = self._dcp_state(model, opt)
        dcp.load(state, checkpoint_id=str(ckpt / SHARDED_DIR))
        # dcp.load fails on a key the checkpoint lacks; not strict here only so the frozen base may stay out
        options = self._options(strict=not self.lora.enabled)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)

    def _options(self, strict: bool = True) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # With LoRA only the adapters train: the frozen base comes from model.path, not the checkpoint.
        return StateDictOptions(ignore_frozen_params=self.lora.enabled, strict=strict)

    def _dcp_state(self, model: torch.nn.Module, opt: Any) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(model, opt, options=self._options())
        return {"model": msd, "optim": osd}


def _peft_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Parameter names of a PeftModel -> the names its `save_pretrained(state_dict=)` expects (the same, unwrapped)."""
    return {n.removeprefix("module.").removeprefix("_orig_mod."): t for n, t in state.items()}
