"""`agentenv export`: any checkpoint (plain, sharded, LoRA) -> a plain transformers folder.

`AutoModelForCausalLM.from_pretrained(out)` loads the result, tokenizer
included; vLLM serves it. A LoRA checkpoint is merged into its base model; a
sharded one (`trainer.strategy: fsdp2`) is read from its
`torch.distributed.checkpoint` shards in this one process. The folder is
written beside `out` and renamed into place, so `out` is complete or absent.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

from agentenv.errors import ConfigError
from agentenv.training import checkpoint as ckpt
from agentenv.training.sharding import ADAPTER_DIR, BASE_DIR, MODEL_DIR, SHARDED_DIR


def resolve_checkpoint(source: str | Path) -> Path:
    """A run folder (its newest intact checkpoint) or a checkpoint folder, verified.

    Raises:
        ConfigError: (`RUN_OR_CHECKPOINT`) nothing resumable there, or the checkpoint is damaged.
    """
    src = Path(source)
    if (src / ckpt.STATE_FILE).exists():
        reason = ckpt.verify(src)
        if reason is not None:
            raise ConfigError("RUN_OR_CHECKPOINT", f"checkpoint {src} is damaged: {reason}")
        return src
    if (src / "checkpoints").is_dir():
        chosen, skipped = ckpt.find_resumable(src)
        if chosen is None:
            why = "; ".join(f"{p.name}: {r}" for p, r in skipped) or "none written yet"
            raise ConfigError("RUN_OR_CHECKPOINT", f"{src} has no intact checkpoint ({why})")
        return chosen
    raise ConfigError("RUN_OR_CHECKPOINT", f"{src} is neither a run folder (with checkpoints/) nor a checkpoint")


def export(source: str | Path, out: str | Path) -> Path:
    """Write the checkpoint at `source` (or a run's newest) as a transformers folder `out`; returns `out`.

    Raises:
        ConfigError: `source` holds no usable checkpoint, or `out` exists.
    """
    src = resolve_checkpoint(source)
    out = Path(out)
    if out.exists():
        raise ConfigError("--out", f"{out} exists; give a new folder")
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if (src / ADAPTER_DIR).is_dir():
            _merge_adapter(src / ADAPTER_DIR, tmp)
        elif (src / SHARDED_DIR).is_dir():
            _gather_shards(src, tmp)
        elif (src / MODEL_DIR / "config.json").exists():
            shutil.copytree(src / MODEL_DIR, tmp)
        else:
            raise ConfigError("RUN_OR_CHECKPOINT", f"{src} holds no model ({MODEL_DIR}/, {SHARDED_DIR}/ or {ADAPTER_DIR}/)")
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _merge_adapter(adapter: Path, out: Path) -> None:
    """Base model (the path the adapter config names) + adapters, merged."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_path = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    try:
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    except OSError as e:
        raise ConfigError("RUN_OR_CHECKPOINT", f"the adapter's base model {base_path!r} does not load: {e}") from None
    dtype = base.dtype
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    merged.to(dtype).save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(adapter).save_pretrained(out)


def _gather_shards(src: Path, out: Path) -> None:
    """The model's shards, read whole into an empty model built from the checkpoint's config."""
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(src / BASE_DIR)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    model.to_empty(device="cpu")
    state = model.state_dict()
    with warnings.catch_warnings():  # "torch.distributed is disabled ...: assuming ... a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"model": state}, checkpoint_id=str(src / SHARDED_DIR), no_dist=True)
    model.tie_weights()
    if (src / BASE_DIR / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(src / BASE_DIR)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(src / BASE_DIR).save_pretrained(out)
