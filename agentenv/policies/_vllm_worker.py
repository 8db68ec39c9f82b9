"""Methods that vLLM mixes into its worker processes (`worker_extension_cls`).

The policy in the trainer's process reaches them through the engine's
`collective_rpc`: it stages the trainer's weights in chunks (safetensors bytes,
so any tensor dtype crosses the process boundary unchanged), then commits them
in one in-place reload. vLLM imports this module by name inside each worker, so
it must stay importable without side effects.
"""

from __future__ import annotations

from typing import Any


class WeightSyncExtension:
    """Receives new weights into a running vLLM worker (one per tensor-parallel rank)."""

    def agentenv_stage_weights(self, blob: bytes) -> int:
        """Keep one chunk of checkpoint-format weights until the commit.

        Returns:
            How many tensors are staged so far.
        """
        from safetensors.torch import load

        staged = self.__dict__.setdefault("_agentenv_staged", {})
        staged.update(load(blob))
        return len(staged)

    def agentenv_commit_weights(self) -> int:
        """Load every staged tensor into the model in place; returns their count.

        vLLM's layerwise reload restores each layer's checkpoint layout, loads,
        and re-runs the layer's post-load processing (on CPU: repacking linear
        weights for oneDNN), so the new values reach the kernels. Every layer
        must be in one reload, hence staging.
        """
        staged: dict[str, Any] = self.__dict__.pop("_agentenv_staged", {})
        if not staged:
            return 0
        self.reload_weights(weights_iterator=iter(staged.items()), is_checkpoint_format=True)
        _refresh_tied_lm_head(self.model_runner.get_model())
        return len(staged)

    def agentenv_drop_staged_weights(self) -> None:
        """Forget staged chunks (after a failed transfer)."""
        self.__dict__.pop("_agentenv_staged", None)


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
