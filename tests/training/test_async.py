"""Asynchronous training across steps (`trainer.max_staleness`): the bound, eta = 0, versions, the decoupled loss."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentenv._loops import LoopThread
from agentenv.algorithms.core import aggregate, clipped_pg_loss, decoupled_weights
from agentenv.configs import config_from_dict
from agentenv.envs.testing import make_task
from agentenv.errors import ConfigError
from agentenv.policies.models import resolve_model_path
from agentenv.policies.scripted import ScriptedPolicy
from agentenv.training.async_rollout import AsyncRollout, Pending, group_versions
from agentenv.training.build import build_runtime
from agentenv.training.trainer import Trainer
from agentenv.types import Generation, Group, SamplingParams, Segment, Trajectory


# ---------------------------------------------------------------- the producer alone
def _group(task, versions: list[int]) -> Group:
    seg = Segment("policy", list(range(len(versions))), [0.0] * len(versions), [0.0] * len(versions), versions)
    return Group(task, [Trajectory(task.id, [Segment("prompt", [1]), seg])])


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_every_batch_holds_the_bound_and_every_drawn_group_is_trained_once(eta):
    """Heavy-tailed group times, a push per step: each batch's staleness <= eta, dropped groups are requeued."""
    tasks = [make_task(task_id=f"t{i}") for i in range(1000)]
    version = [1]
    rng = random.Random(eta)
    cursor = [0]

    def draw():
        cursor[0] += 1
        return tasks[cursor[0] - 1]

    async def sample(p: Pending) -> Group:
        start = version[0]
        await asyncio.sleep(min(rng.lognormvariate(-5.5, 1.2), 0.08))  # median 4 ms, a long tail
        return _group(p.task, [start, version[0]])  # a push landed mid-group: tokens of two versions

    loop = LoopThread("test-rollout")
    source = SimpleNamespace(sample=sample, draw=draw, version=lambda: version[0])  # a `GroupSource`
    producer = AsyncRollout(loop, source, tasks_per_step=4, max_staleness=eta)
    trained: list[int] = []
    try:
        for _ in range(25):
            batch = producer.take()
            assert len(batch.groups) == 4 and all(0 <= s <= eta for s in batch.staleness)
            assert batch.version == version[0]
            for g in batch.groups:
                assert version[0] - group_versions(g, version[0])[0] <= eta
            trained += [int(g.task.id[1:]) for g in batch.groups]
            time.sleep(0.004)  # the update
            version[0] += 1  # the push
            producer.step_done()
        pending, next_seq = producer.snapshot()
    finally:
        producer.close()
        loop.stop()
    assert len(trained) == len(set(trained)) == 100  # no group trained twice
    # every task drawn is trained or still pending (in flight, buffered, requeued): none is lost
    assert sorted(trained + [p.seq for p in pending]) == list(range(next_seq))
    assert len(pending) <= (eta + 1) * 4
    if eta == 0:
        assert trained == list(range(100))  # eta = 0: the synchronous order, no drop
        assert producer.dropped_total == 0
    if eta == 1:
        assert producer.dropped_total > 0  # the tail exceeded the bound, and the batches still held it


# ---------------------------------------------------------------- the decoupled objective
def test_decoupled_loss_matches_areal_on_identical_tensors():
    """AReaL's decoupled PPO loss, `ppo_actor_loss_fn` in inclusionAI/AReaL `areal/utils/functional.py`
    (proximal = recomputed logprobs, old = the inference engine's, `behav_imp_weight_cap`), re-derived here from
    that file's formula: ratio exp(logp - prox) clipped to [1 - eps, 1 + eps_high], max of the two negated
    surrogates, times exp(prox - behav) zeroed where it exceeds the cap, summed over the mask / mask count."""
    from agentenv.algorithms.base import TrainBatch
    from agentenv.algorithms.core import policy_loss
    from agentenv.algorithms.grpo.config import GRPOConfig

    g = torch.Generator().manual_seed(0)
    B, T = 3, 7
    new = (-torch.rand(B, T, generator=g) * 2).requires_grad_(True)
    prox = new.detach() + 0.3 * torch.randn(B, T, generator=g)
    behav = prox + 0.5 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    for cap in (None, 1.5):
        # the reference, written from the file's formula
        ratio = torch.where(mask.bool(), torch.exp(new - prox), torch.zeros_like(new))
        clipped = ratio.clamp(1 - 0.2, 1 + 0.28)
        pg = torch.max(-adv * ratio, -adv * clipped)
        w = torch.exp(prox - behav)
        keep = mask.bool() if cap is None else (w <= cap) & mask.bool()
        pg = pg * torch.where(keep, w, torch.zeros_like(w))
        ref = torch.where(mask.bool(), pg, torch.zeros_like(pg)).sum() / mask.count_nonzero()
        (ref_grad,) = torch.autograd.grad(ref, new)

        cfg = GRPOConfig(clip_low=0.2, clip_high=0.28, off_policy="decoupled", behaviour_weight_cap=cap)
        batch = TrainBatch(torch.zeros(B, T + 1, dtype=torch.long), torch.ones(B, T + 1, dtype=torch.long),
                           mask, adv * mask, prox, behav)  # fmt: skip
        ours, m = policy_loss(batch, new, cfg)
        (our_grad,) = torch.autograd.grad(ours, new)
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(our_grad, ref_grad, rtol=1e-6, atol=1e-7)
        assert (m["behaviour_capped_frac"] > 0) == (cap is not None)
    # the pieces: weights 0 off the mask, the clipped ratio around the proximal policy
    w, over = decoupled_weights(prox, behav, mask, 1.5)
    assert torch.all(w[mask == 0] == 0) and torch.all(w[over] == 0)
    per_token, _ = clipped_pg_loss(new.detach(), prox, adv, 0.2, 0.28)
    assert torch.isfinite(aggregate(per_token * w, mask))


def test_async_refusals_name_the_key():
    with pytest.raises(ConfigError, match="algorithm.off_policy"):
        config_from_dict({}, ["algorithm.off_policy=decoupled", "algorithm.rollout_correction=tis"])
    with pytest.raises(ConfigError, match="trainer.max_staleness"):
        config_from_dict({}, ["trainer.max_staleness=-1"])


def test_dapo_dynamic_sampling_is_refused_under_async(fast_overrides):
    cfg = config_from_dict({}, fast_overrides + ["algorithm.name=dapo", "trainer.max_staleness=1"])
    with pytest.raises(ConfigError, match="dynamic sampling"):
        Trainer(cfg)


# ---------------------------------------------------------------- versions through the rollout
def test_versions_are_exact_when_a_push_lands_mid_generation():
    """hf policy: pushes while one turn decodes; the turn's tokens carry both versions, in order, into the
    trajectory's segments and the staleness the trainer computes."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentenv.envs.agent_env import AgentEnv
    from agentenv.envs.testing import EchoTool, boxed_reward, build_test_tokenizer
    from agentenv.policies.hf import HFPolicy, HFPolicyConfig
    from agentenv.rollout import Episode, RolloutConfig
    from agentenv.types import SamplingParams

    tok = build_test_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)).eval()  # fmt: skip
    policy = HFPolicy(HFPolicyConfig(model="<in-memory>", device="cpu"), model=model, tokenizer=tok)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    stop = threading.Event()

    def pusher():
        while not stop.is_set():
            policy.load_weights(weights)
            time.sleep(0.002)

    env = AgentEnv([EchoTool("search")], tok, reward_fn=boxed_reward, config={"max_context_tokens": 4096})
    ep = Episode(policy, env, SamplingParams(max_tokens=300, temperature=1.0), seed=3, config=RolloutConfig())
    ep.reset(make_task())
    thread = threading.Thread(target=pusher)

    async def turn():
        thread.start()
        try:
            gen = await ep.generate()
        finally:
            stop.set()
        await ep.step(gen)
        return gen

    gen = asyncio.run(turn())
    thread.join()
    assert len(gen.token_ids) > 20
    assert gen.versions == sorted(gen.versions) and len(set(gen.versions)) > 1  # the push showed mid-turn
    traj = ep.trajectory()
    assert traj.versions[: len(gen.versions)] == gen.versions
    seg = next(s for s in traj.segments if s.source == "policy")
    assert seg.versions == gen.versions
    group = Group(make_task(), [traj])
    assert group_versions(group, 0)[:2] == (min(gen.versions), max(gen.versions))
    asyncio.run(ep.aclose())


# ---------------------------------------------------------------- the trainer
class SeededScript(ScriptedPolicy):
    """The same rollouts and rewards on every CPU (sampled ones depend on the CPU's kernels): a request with an even
    seed answers in the format (reward 0 or more), an odd one does not (-1); seeds are hashed, not sampled."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        assert params.seed is not None
        text = "<answer>\\boxed{0}</answer>" if params.seed % 2 == 0 else "no answer"
        return self._gen(self._encode(text) + [self.tokenizer.eos_token_id], "eos")


def _run(overrides, scripted: bool = False, **kw):
    cfg = config_from_dict({}, overrides)
    rt = None
    if scripted:
        rt = build_runtime(cfg, resolve_model_path(cfg.model.path))
        rt.policy = SeededScript(rt.tokenizer, [])
    trainer = Trainer(cfg, runtime=rt, **kw)
    trainer.train()
    out = Path(trainer.cfg.trainer.output_dir)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    batches = (out / "batches.jsonl").read_text()
    weights = {k: v.detach().clone() for k, v in trainer.unwrapped().state_dict().items()}
    return metrics, batches, weights


@pytest.mark.slow
def test_async_path_at_eta_0_equals_the_synchronous_trainer(fast_overrides, tmp_path):
    """The producer at eta = 0 trains on the synchronous loop's batches: same tasks, losses, metrics and weights.
    The rollouts are scripted by seed (`SeededScript`): sampled ones depend on the CPU's kernels, and on one CPU
    every group had the same reward (nothing to learn); these differ in every group on every CPU."""
    base = fast_overrides + ["trainer.eval_tasks=0"]
    sync = _run(base + [f"trainer.output_dir={tmp_path / 'sync'}"], scripted=True)
    asyn = _run(base + [f"trainer.output_dir={tmp_path / 'async'}"], scripted=True, async_rollout=True)
    assert sync[1] == asyn[1]
    timing = ("time",)  # wall-clock values: "time" and "time/..."
    for a, b in zip(sync[0], asyn[0]):
        assert {k: v for k, v in a.items() if not k.startswith(timing)} == {
            k: v for k, v in b.items() if not k.startswith(timing)
        }
    # learned, and learned alike: the scripted rewards (and so the advantages) are the same on every CPU
    assert any(m["train/grad_norm"] > 0 for m in sync[0]), [(m["rollout/reward"], m["train/grad_norm"]) for m in sync[0]]
    assert all(torch.equal(sync[2][k], asyn[2][k]) for k in sync[2])
    assert all(m["async/staleness_max"] == 0 for m in sync[0] + asyn[0])


@pytest.mark.slow
def test_sigkill_under_async_then_resume_regenerates_the_groups_in_flight(fast_overrides, tmp_path, train_until_checkpoint):
    """eta = 1: a checkpoint records the groups drawn and not trained on; after SIGKILL, --resume trains on exactly
    the checkpoint's weights and past batches, rolls those groups out again first, and the bound holds throughout."""
    from safetensors.torch import load_file

    from agentenv.training.checkpoint import latest_checkpoint, read_state

    cfg = config_from_dict({}, fast_overrides + ["trainer.steps=4", "trainer.max_staleness=1", "trainer.eval_tasks=0"])
    out = Path(cfg.trainer.output_dir)
    train_until_checkpoint(cfg, tmp_path / "run.yaml", step=2)
    last = latest_checkpoint(out)
    state = read_state(last)
    k = state["step"]
    assert 2 <= k < 4
    pending = state["pending"]  # [seq, task id, attempt], in draw order
    assert 0 < len(pending) <= 2 * cfg.trainer.tasks_per_step
    assert state["stream"]["cursor"] > max(seq for seq, _, _ in pending)
    before = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]

    trainer = Trainer(cfg, resume=True)
    try:
        assert trainer.start_step == k and [p.task.id for p in trainer.batches.resume] == [t for _, t, _ in pending]
        saved = load_file(str(last / "model" / "model.safetensors"))
        live = trainer.unwrapped().state_dict()
        assert saved and all(torch.equal(saved[key], live[key]) for key in saved)
        trainer.train()
    finally:
        trainer.close()
    after = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]
    assert [r for r in after if r["step"] <= k] == [r for r in before if r["step"] <= k]  # the trained-on past, exact
    first = next(r for r in after if r["step"] == k + 1)
    assert set(first["tasks"]) <= {t for _, t, _ in pending}  # the groups in flight at the kill come first
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "async/staleness_max" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4] and all(m["async/staleness_max"] <= 1 for m in steps)
    assert read_state(latest_checkpoint(out))["step"] == 4
