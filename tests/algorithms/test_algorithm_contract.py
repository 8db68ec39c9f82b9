"""The algorithm contract: every registered algorithm subclasses `Algorithm`, a plugin that does not is given its
defaults, and one that lacks a required member is refused by name."""

from __future__ import annotations

import pytest
import torch

from agentenv.algorithms import as_algorithm, available, get_algorithm, register
from agentenv.algorithms.base import Algorithm
from agentenv.algorithms.dynamic_sampling import DynamicSampling
from agentenv.errors import ConfigError


class _Cfg:
    group_size = 3
    kl_coef = 0.5
    max_resample_rounds = 2


class DuckAlgorithm:  # an old-style plugin: the required members, no base class
    config_cls = _Cfg

    def __init__(self, cfg=None):
        self.settings = cfg

    def sampler(self, rollout=None): ...

    def advantages(self, group): ...

    def loss(self, batch, new_logprobs, norm=None): ...

    def generated_tokens(self, group): ...


class DuckFilter(DuckAlgorithm):
    def keep_group(self, group) -> bool:
        return bool(group)


class OneProcess:
    """A `StepRollout` on one process: every extra round's groups are empty (rejected); draws and reduces are
    recorded."""

    rank, world = 0, 1

    def __init__(self):
        self.drawn: list[int] = []
        self.reduced: list[torch.Tensor] = []

    def rollout(self, tasks, indices, round_):
        return [[]] * len(tasks)

    def draw(self, n):
        self.drawn.append(n)
        return list(range(n))

    def reduce(self, t):
        self.reduced.append(t.clone())
        return t


def test_every_registered_algorithm_subclasses_the_base():
    for name in available():
        cls = get_algorithm(name)
        assert issubclass(cls, Algorithm), name
        algo = cls()
        assert isinstance(algo.needs_reference(), bool) and isinstance(algo.max_resample_rounds(), int)


def test_base_defaults():
    algo = as_algorithm(DuckAlgorithm)(_Cfg())
    assert isinstance(algo, Algorithm) and isinstance(algo, DuckAlgorithm)
    assert algo.cfg.group_size == 3 and algo.group_size() == 3  # the constructor's argument is kept as cfg
    assert algo.needs_reference()  # kl_coef > 0
    assert algo.grows_trees is False and algo.keep_group(object()) and algo.max_resample_rounds() == 0
    assert algo.finalize(None, [], lambda t: t) == {}
    groups = [object()]
    rollout = OneProcess()
    assert algo.resample(groups, rollout) == (groups, {})  # no filter: as they are, no metrics
    assert rollout.drawn == [] and rollout.reduced == []


def test_an_old_style_group_filter_still_resamples_with_its_config_cap():
    algo = as_algorithm(DuckFilter)(_Cfg())
    assert algo.max_resample_rounds() == 2
    rollout = OneProcess()
    out, m = algo.resample([[], [1]], rollout)
    assert len(out) == 2 and rollout.drawn == [1, 1]  # one slot short for two rounds, then filled with a dropped group
    assert m == {"rollout/resample_rounds": 2.0, "rollout/dropped_groups": 3.0, "rollout/filled_groups": 1.0}


def test_dynamic_sampling_stops_when_every_process_is_full():
    rollout = OneProcess()
    out, m = DynamicSampling(lambda g: True, 3).refill(["a", "b"], rollout)
    assert out == ["a", "b"] and m["rollout/resample_rounds"] == 0.0 and len(rollout.reduced) == 2 and not rollout.drawn


def test_a_plugin_missing_a_member_is_refused_by_name():
    class NoLoss:
        config_cls = _Cfg

        def sampler(self, rollout=None): ...

        def advantages(self, group): ...

        def generated_tokens(self, group): ...

    class HalfSubclass(Algorithm):  # subclasses the base but defines no advantages or loss
        config_cls = _Cfg

        def sampler(self, rollout=None): ...

        def generated_tokens(self, group): ...

    for name, cls, missing in (("_t_noloss", NoLoss, "loss"), ("_t_half", HalfSubclass, "advantages, loss")):
        register(name, cls)
        try:
            with pytest.raises(ConfigError, match=f"lacks {missing}"):
                get_algorithm(name)
        finally:
            from agentenv.algorithms import _REGISTRY

            _REGISTRY._entries.pop(name, None)
