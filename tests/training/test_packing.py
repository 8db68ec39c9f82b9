"""Packed prefix trees: the same logprobs, entropies and gradients as the unpacked rows, each shared token once."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentenv.training.packing import plan_packing
from agentenv.training.scoring import sequence_logprobs


def small_model(attn: str) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256)  # fmt: skip
    cfg._attn_implementation = attn
    return Qwen2ForCausalLM(cfg).float()


def tree_rows(seed: int = 1) -> list[list[int]]:
    """An ARPO-like group: roots sharing a prompt, branches off roots and off branches, a row inside another."""
    g = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(3, 97, (n,), generator=g).tolist()

    prompt = rand(9)
    root = prompt + rand(30)
    b1 = root[:20] + rand(12)  # branches off the root at token 20
    b2 = b1[:26] + rand(9)  # off the branch, past its own branch point
    b3 = b1[:26] + rand(4)  # a sibling of b2 at the same node
    root2 = prompt + rand(14)
    stranger = rand(17)  # shares nothing: its own pack
    return [root, b1, b2, b3, root2, stranger, root[:25], [prompt[0]]]  # the last: a failed trajectory's stub


def pad(rows: list[list[int]], left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(map(len, rows))
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        sl = slice(L - len(r), L) if left else slice(0, len(r))
        ids[i, sl] = torch.tensor(r)
        mask[i, sl] = 1
    return ids, mask


def grads_of(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, pack: bool, weights: torch.Tensor):
    model.zero_grad(set_to_none=True)
    lp, ent = sequence_logprobs(model, ids, mask, 0.7, pack=pack)  # (B, T)
    keep = mask[:, 1:].float() * mask[:, :-1].float()  # columns that predict a real token from a real one
    loss = (lp * weights * keep).sum() + 0.1 * (ent * keep).sum()
    loss.backward()
    return lp.detach() * keep, ent.detach() * keep, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_plan_computes_each_shared_token_once():
    rows = tree_rows()
    ids, mask = pad(rows)
    plan = plan_packing(ids, mask)
    # by hand: the root 39, b1 12 own, b2 9, b3 4, root2 14 after the prompt, the stranger 17, root[:25] none
    assert plan.tokens == sum(map(len, rows))
    assert plan.packed_tokens == 39 + 12 + 9 + 4 + 14 + 17 + 0 + 0
    assert plan.input_ids.shape[0] == 2  # one pack for the tree, one for the stranger
    # b2's last token sees exactly b2's 35 tokens (its ancestors and itself), wherever they live
    r, q = divmod(int(plan.src[2, len(rows[2]) - 2]), plan.input_ids.shape[1])
    assert int(plan.allowed[r, q].sum()) == len(rows[2]) - 1
    assert plan.position_ids[r, q] == len(rows[2]) - 2  # positions restart at the branch point
    # a failed trajectory without tokens (an all-padding row) takes no position and no pack
    ids0, mask0 = pad(rows + [[]])
    empty = plan_packing(ids0, mask0)
    assert empty.packed_tokens == plan.packed_tokens and empty.input_ids.shape == plan.input_ids.shape
    # a cap on the pack's length: rows that would overflow it start their own pack
    capped = plan_packing(ids, mask, max_len=45)
    assert capped.input_ids.shape[1] <= 45 and capped.packed_tokens > plan.packed_tokens


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("left", [False, True])
def test_packed_logprobs_and_gradients_equal_unpacked(attn, left):
    model = small_model(attn)
    ids, mask = pad(tree_rows(), left=left)
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1, generator=torch.Generator().manual_seed(3))
    lp_u, ent_u, g_u = grads_of(model, ids, mask, False, weights)
    lp_p, ent_p, g_p = grads_of(model, ids, mask, True, weights)
    torch.testing.assert_close(lp_p, lp_u, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_p, ent_u, atol=1e-5, rtol=0)
    for name in g_u:
        torch.testing.assert_close(g_p[name], g_u[name], atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    assert any(g.abs().max() > 1e-3 for g in g_u.values())  # the comparison is not of zeros


def test_rows_that_share_nothing_are_computed_unpacked():
    model = small_model("sdpa")
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 97, (3, 12), generator=g)
    ids[:, 0] = torch.tensor([3, 4, 5])
    plan = plan_packing(ids, torch.ones_like(ids))
    assert plan.saving == 0.0
    with torch.no_grad():
        lp_u, _ = sequence_logprobs(model, ids)
        lp_p, _ = sequence_logprobs(model, ids, pack=True)
    assert torch.equal(lp_u, lp_p)


def test_flash_attention_is_refused():
    model = small_model("sdpa")
    model.config._attn_implementation = "flash_attention_2"
    ids, mask = pad(tree_rows())
    with pytest.raises(ValueError, match="pack_prefixes"):
        sequence_logprobs(model, ids, mask, pack=True)


@pytest.mark.slow
def test_a_real_arpo_tree_of_the_tiny_model(tiny_model_path):
    """A tree the tiny model grew (toy two-hop tasks, the local retriever): packed equals unpacked."""
    from transformers import AutoModelForCausalLM

    from agentenv.algorithms.arpo import ARPOConfig, TreeSampler
    from agentenv.configs import config_from_dict
    from agentenv.training.batching import collate
    from agentenv.training.build import build_runtime
    from agentenv.types import SamplingParams

    run = {
        "model": {"path": "tiny"},
        "policy": {"backend": "hf", "temperature": 1.0, "max_turn_tokens": 48},
        "env": {"tools": ["search"], "tasks": {"source": "toy", "kinds": ["twohop"], "seed": 0},
                "max_tool_calls": 3, "max_context_tokens": 512, "max_result_tokens": 128},
        "algorithm": {"name": "arpo"},
    }  # fmt: skip
    rt = build_runtime(config_from_dict(run), model_path=str(tiny_model_path))
    try:
        cfg = ARPOConfig(group_size=8, initial_rollouts=2, forks_per_branch=2, entropy_window=10, alpha=1.0, beta=0.0, tau=0.5)
        group = asyncio.run(
            TreeSampler(cfg).sample(rt.policy, rt.make_env, rt.tasks.train[0], SamplingParams(max_tokens=48), 1)
        )
    finally:
        asyncio.run(rt.aclose())
    # P_t = α = 1 > τ (β = 0): every probe after a tool result branches; seed 1's rollouts call search
    # (proven on the shipped model: seed 7's two roots write only malformed calls before the budget runs out)
    assert group.info["branches"] > 0
    batch = collate(group.trajectories, [torch.zeros(len(t)) for t in group.trajectories], 0)
    plan = plan_packing(batch.input_ids, batch.attention_mask)
    assert plan.saving > 0.3, plan.saving
    weights = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(0)) * batch.loss_mask
    # The packing changes which values are computed and in what order they are summed (a branch's keys over the
    # longer packed row), not what: tolerances from the dtype's eps and the reduction sizes, on every CPU. A logit
    # sums over at most 512 terms (the longest row's keys, the MLP's width) in each of 4 layers, and |logprob|
    # reaches 16: 16 x 512 x 4 x eps. A gradient sums over the batch's tokens (~3,000) as well, relative to its
    # scale. The rotary embedding computes cos/sin in float32 whatever the model's dtype, and a vectorized cos
    # rounds a lane and the scalar tail apart (which positions fall where depends on the row layout and the
    # CPU's vector width): float32's eps bounds a float64 model too.
    tokens = int(batch.attention_mask.sum())
    for dtype in (torch.float64, torch.float32):
        eps = max(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps)
        atol, grad_rtol = 16 * 512 * 4 * eps, tokens * 4 * eps
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=dtype)
        w = weights.to(dtype)
        lp_u, ent_u, g_u = grads_of(model, batch.input_ids, batch.attention_mask, False, w)
        lp_p, ent_p, g_p = grads_of(model, batch.input_ids, batch.attention_mask, True, w)
        torch.testing.assert_close(lp_p, lp_u, atol=atol, rtol=0.0)
        torch.testing.assert_close(ent_p, ent_u, atol=atol, rtol=0.0)
        for name in g_u:
            # relative to the gradient's scale (the tied embedding's reaches 10^3)
            scale = float(g_u[name].abs().max())
            err = float((g_p[name] - g_u[name]).abs().max())
            assert err <= grad_rtol * max(scale, 1.0), (dtype, name, err, scale)


@pytest.mark.slow
def test_the_trainer_packs_by_default_and_recomputes_the_same_logprobs(fast_overrides):
    """ARPO's toy tree through the trainer: `trainer.pack_prefixes` auto packs; off gives the same old logprobs."""
    from agentenv.configs import config_from_dict
    from agentenv.training.batching import collate
    from agentenv.training.trainer import Trainer

    cfg = config_from_dict({}, fast_overrides + ["algorithm.name=arpo", "algorithm.group_size=4",
                                                 "algorithm.initial_rollouts=1", "algorithm.alpha=1.0"])  # fmt: skip
    trainer = Trainer(cfg)
    try:
        assert trainer.updater.pack  # auto: ARPO grows trees
        groups = trainer.run(trainer.rollouts.groups(trainer.rt.tasks.train[:2], 0, [0, 1]))
        trajs = [t for g in groups for t in g]
        batch = collate(trajs, [torch.zeros(len(t)) for t in trajs], trainer.pad_id)
        assert plan_packing(batch.input_ids[:4], batch.attention_mask[:4]).saving > 0.3  # the first tree
        packed = trainer.updater.recompute(batch, trainer.unwrapped())
        trainer.updater.pack = False
        unpacked = trainer.updater.recompute(batch, trainer.unwrapped())
        torch.testing.assert_close(packed, unpacked, atol=1e-5, rtol=1e-4)
        assert packed.abs().sum() > 0
    finally:
        trainer.close()


def test_pack_prefixes_on_refuses_flash_attention():
    from agentenv.errors import ConfigError
    from agentenv.training.packing import packing_enabled

    model = small_model("sdpa")
    assert packing_enabled("auto", model) and packing_enabled("on", model) and not packing_enabled("off", model)
    assert not packing_enabled("auto", model, trees=False) and packing_enabled("on", model, trees=False)
    model.config._attn_implementation = "flash_attention_2"
    assert not packing_enabled("auto", model)
    with pytest.raises(ConfigError, match="trainer.pack_prefixes"):
        packing_enabled("on", model)
