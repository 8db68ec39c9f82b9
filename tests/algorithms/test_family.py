"""GRPO's family: ARPO, DAPO, GiGPO and the presets extend GRPO without copying its hooks; a variant is a config
class plus a registered estimator and policy loss; each config has exactly the keys its algorithm reads, and a key
a variant fixes is accepted at its value and refused otherwise, by name."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest
import torch

from agentenv.algorithms import _REGISTRY, available, get_algorithm, register
from agentenv.algorithms.arpo import ARPO, ARPOConfig
from agentenv.algorithms.base import Algorithm, TrainBatch, group_generated_tokens
from agentenv.algorithms.core import _LOSSES, clipped_loss, estimator_for, get_estimator, get_loss, register_loss
from agentenv.algorithms.grpo import GRPO, GroupConfig, GRPOConfig, MeanLossConfig
from agentenv.configs import config_from_dict
from agentenv.envs.testing import make_task
from agentenv.errors import ConfigError
from agentenv.types import Group, Segment, Trajectory

BUILT_IN = ["grpo", "arpo", "dapo", "reinforce_pp", "reinforce_pp_baseline", "rloo", "gspo", "dr_grpo", "gigpo", "arpo_gigpo"]


def _batch() -> TrainBatch:
    """Two rows, three predicted tokens, the second row's last token masked."""
    return TrainBatch(
        input_ids=torch.zeros(2, 4, dtype=torch.long),
        attention_mask=torch.ones(2, 4, dtype=torch.long),
        loss_mask=torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
        advantages=torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, 0.0]]),
        old_logprobs=torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, 0.0]]),
        sampler_logprobs=torch.zeros(2, 3),
    )


def _group() -> Group:
    """A root and a branch off it after its tool result (token 9): 4 + 6 policy tokens, then 5 of the branch's own."""

    def traj(uid: str, reward: float, last: int, parent: str | None = None, branch: int | None = None) -> Trajectory:
        tokens = [("prompt", 3), ("policy", 4), ("tool", 2), ("policy", last)]
        segs = [Segment(s, [1] * n, [0.0] * n if s == "policy" else None, [0.0] * n if s == "policy" else None) for s, n in tokens]
        return Trajectory(task_id="t", segments=segs, reward=reward, uid=uid, parent_uid=parent, branch_token=branch)

    return Group(task=make_task(), trajectories=[traj("a", 1.0, 6), traj("b", 0.0, 5, parent="a", branch=9)])


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_is_grpo_with_its_hooks_not_copied(name):
    cls = get_algorithm(name)
    assert issubclass(cls, GRPO)
    assert cls.loss is GRPO.loss  # the loss is chosen by name (`loss_name`), never overridden
    assert cls.generated_tokens is Algorithm.generated_tokens  # the base's default serves them all


def test_arpo_extends_grpo_and_keeps_its_finalize_after_hard_once():
    assert ARPO.__mro__[1] is GRPO
    own = {k for k, v in vars(ARPO).items() if callable(v) and not k.startswith("_") and not isinstance(v, type)}
    assert own == {"estimator", "sampler", "advantages", "finalize", "rollout_metrics"}


def test_grpo_without_std_is_dr_grpo_in_one_place():
    assert estimator_for("grpo", GRPOConfig(normalize_std=False)) is get_estimator("dr_grpo")
    assert estimator_for("grpo", GRPOConfig(normalize_std=True)) is get_estimator("grpo")
    assert estimator_for("rloo", MeanLossConfig()) is get_estimator("rloo")  # no normalize_std asked for
    assert GRPO(GRPOConfig(normalize_std=False)).estimator() is get_estimator("dr_grpo")
    assert ARPO(ARPOConfig(normalize_std=False)).estimator() is get_estimator("dr_grpo")
    assert ARPO(ARPOConfig(estimator="rloo", normalize_std=False)).estimator() is get_estimator("rloo")


@pytest.mark.parametrize(
    ("name", "loss"), [("grpo", "clipped"), ("rloo", "clipped"), ("reinforce_pp", "clipped"), ("arpo", "clipped"),
                       ("dapo", "clipped"), ("gigpo", "clipped"), ("dr_grpo", "dr_grpo"), ("gspo", "gspo")],
)  # fmt: skip
def test_each_algorithm_names_a_registered_loss(name, loss):
    algo = get_algorithm(name)()
    assert algo.loss_name == loss
    batch, new = _batch(), torch.tensor([[-0.9, -2.1, -0.4], [-1.4, -1.2, 0.0]])
    want, want_m = get_loss(loss)(batch, new, algo.cfg, None, kl_in_return=algo.estimator().kl_in_return)
    got, got_m = algo.loss(batch, new)
    assert torch.equal(got, want) and got_m == want_m


def test_a_variant_is_a_config_class_and_two_names():
    def doubled(batch, new_logprobs, cfg, norm, *, kl_in_return):
        loss, metrics = clipped_loss(batch, new_logprobs, cfg, norm, kl_in_return=kl_in_return)
        return cfg.scale * loss, metrics

    @dataclasses.dataclass(frozen=True)
    class ScaledConfig(MeanLossConfig):
        scale: float = 2.0

    class Scaled(GRPO):
        config_cls: ClassVar[type] = ScaledConfig
        estimator_name: ClassVar[str] = "rloo"
        loss_name: ClassVar[str] = "_t_doubled"

    register_loss("_t_doubled", doubled)
    register("_t_scaled", Scaled)
    try:
        cfg = config_from_dict({"algorithm": {"name": "_t_scaled", "group_size": 2, "scale": 3.0}})
        algo = get_algorithm("_t_scaled")(cfg.algorithm_config)
        rloo = get_algorithm("rloo")(get_algorithm("rloo").config_cls(group_size=2))
        batch, new = _batch(), torch.tensor([[-0.9, -2.1, -0.4], [-1.4, -1.2, 0.0]])
        assert torch.equal(algo.loss(batch, new)[0], 3.0 * rloo.loss(batch, new)[0])
        g = _group()
        assert all(torch.equal(a, b) for a, b in zip(algo.advantages(g), rloo.advantages(g)))
    finally:
        _REGISTRY._entries.pop("_t_scaled", None)
        _LOSSES._entries.pop("_t_doubled", None)


def test_a_variant_reads_only_the_keys_its_estimator_and_loss_take():
    class SequenceRLOO(GRPO):  # GroupConfig: no normalize_std, no kl_coef, and none asked for
        config_cls: ClassVar[type] = GroupConfig
        estimator_name: ClassVar[str] = "rloo"
        loss_name: ClassVar[str] = "gspo"

    algo = SequenceRLOO(GroupConfig(group_size=2, clip_low=3e-4, clip_high=4e-4))
    batch, new = _batch(), torch.tensor([[-0.9, -2.1, -0.4], [-1.4, -1.2, 0.0]])
    assert torch.equal(algo.loss(batch, new)[0], get_algorithm("gspo")().loss(batch, new)[0])
    assert [a[0].item() for a in algo.advantages(_group())] == [1.0, -1.0]  # r_i - r_j
    assert not algo.needs_reference()


def test_an_unknown_loss_or_estimator_name_fails_when_the_algorithm_is_built():
    class Typo(GRPO):
        loss_name: ClassVar[str] = "clippd"

    class EstimatorTypo(GRPO):
        estimator_name: ClassVar[str] = "rlo"

    with pytest.raises(ConfigError, match=r"unknown policy loss 'clippd'\. Did you mean 'clipped'"):
        Typo()
    with pytest.raises(ConfigError, match=r"unknown advantage estimator 'rlo'\. Did you mean 'rloo'"):
        EstimatorTypo()


def test_a_plugin_without_generated_tokens_gets_the_base_count():
    class Minimal:  # no generated_tokens, no subclassing
        config_cls = GRPOConfig

        def __init__(self, cfg=None): ...

        def sampler(self, rollout=None): ...

        def advantages(self, group): ...

        def loss(self, batch, new_logprobs, norm=None): ...

    register("_t_minimal", Minimal)
    try:
        g = _group()
        assert get_algorithm("_t_minimal")().generated_tokens(g) == group_generated_tokens(g) == 4 + 6 + 5
    finally:
        _REGISTRY._entries.pop("_t_minimal", None)


@pytest.mark.parametrize("name", BUILT_IN)
def test_no_config_has_a_field_it_fixes(name):
    cls = get_algorithm(name).config_cls
    fields = {f.name for f in dataclasses.fields(cls)}
    assert not fields & set(getattr(cls, "fixed_keys", {}))


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [("rloo", "normalize_std", False), ("dr_grpo", "normalize_std", False), ("gspo", "kl_coef", 0),
     ("gspo", "rollout_correction", "none"), ("gspo", "off_policy", "none"), ("arpo_gigpo", "episode_weighting", "trajectory")],
)  # fmt: skip
def test_a_fixed_key_at_its_value_is_accepted_as_before(name, key, value):
    cfg = config_from_dict({"algorithm": {"name": name, key: value}}).algorithm_config
    assert getattr(cfg, key) == value and key not in {f.name for f in dataclasses.fields(cfg)}


@pytest.mark.parametrize(
    ("name", "key", "value", "says"),
    [("rloo", "normalize_std", True, "is fixed at False for"), ("gspo", "off_policy", "decoupled", "is fixed at 'none' for"),
     ("arpo_gigpo", "episode_weighting", "step", "is fixed at 'trajectory' for"),
     ("dr_grpo", "loss_agg", "token_mean", "is not a setting of"), ("gspo", "loss_agg", "token_mean", "is not a setting of"),
     ("gspo", "rollout_correction_cap", 3.0, "is not a setting of"), ("gspo", "behaviour_weight_cap", 2.0, "is not a setting of")],
)  # fmt: skip
def test_a_key_the_algorithm_does_not_read_is_refused_by_name(name, key, value, says):
    with pytest.raises(ConfigError, match=rf"algorithm\.{key}: {says} this algorithm, got .*; leave the key out"):
        config_from_dict({"algorithm": {"name": name, key: value}})


def test_the_family_takes_every_key_it_reads():
    """GRPO's config is the union of the layers; ARPO, DAPO, GiGPO and REINFORCE++ keep every GRPO key."""
    grpo = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert grpo == {"group_size", "clip_low", "clip_high", "kl_coef", "rollout_correction", "rollout_correction_level",
                    "rollout_correction_cap", "off_policy", "behaviour_weight_cap", "loss_agg", "normalize_std"}  # fmt: skip
    for name in ("arpo", "dapo", "gigpo", "reinforce_pp", "arpo_gigpo"):
        assert grpo <= {f.name for f in dataclasses.fields(get_algorithm(name).config_cls)}, name
    assert set(available()) >= set(BUILT_IN)
