"""The router (sticky by trajectory, least-loaded for new ones) and the `rollout.ray` config; no Ray started."""

from __future__ import annotations

import pytest

from agentenv.configs import config_from_dict
from agentenv.distributed.router import Router
from agentenv.errors import ConfigError, InfraError


def test_new_keys_go_to_the_least_loaded_worker():
    r = Router(3)
    a = r.pick("a")
    r.started(a)
    b = r.pick("b")
    r.started(b)
    c = r.pick("c")
    assert sorted([a, b, c]) == [0, 1, 2]  # one each while loads are equal
    r.started(c)
    r.started(c)
    r.finished(a)
    assert r.pick("d") == a  # the least loaded now


def test_a_key_stays_on_its_worker_whatever_the_load():
    r = Router(2)
    i = r.pick("traj")
    for _ in range(5):
        r.started(i)
    assert r.pick("traj") == i and r.sticky_hits == 1
    assert r.pick("other") == 1 - i


def test_a_key_moves_when_its_worker_is_down_and_stays_where_it_moved():
    r = Router(2)
    i = r.pick("traj")
    r.mark_down(i)
    j = r.pick("traj")
    assert j != i and r.moved == 1
    r.mark_up(i)
    assert r.pick("traj") == j  # no flapping back: its cache is now on j
    r.mark_down(0)
    r.mark_down(1)
    with pytest.raises(InfraError, match="none of the 2 rollout workers is up"):
        r.pick("traj")


def test_ties_rotate_and_old_keys_are_forgotten():
    r = Router(2, max_keys=2)
    assert [r.pick(k) for k in "abcd"] == [0, 1, 0, 1]  # equal loads: the one chosen least recently
    assert r.pick("a") in (0, 1) and r.sticky_hits == 0  # "a" was forgotten (2 keys kept)
    assert r.pick("d") == 1 and r.sticky_hits == 1


def test_random_mode_spreads_one_key():
    r = Router(2, "random", seed=0)
    assert {r.pick("traj") for _ in range(50)} == {0, 1}


@pytest.mark.parametrize(
    "override, key",
    [
        ("rollout.placement=cluster", "rollout.placement"),
        ("rollout.ray.workers=0", "rollout.ray.workers"),
        ("rollout.ray.tensor_parallel_size=-1", "rollout.ray.tensor_parallel_size"),
        ("rollout.ray.deadline_s=0", "rollout.ray.deadline_s"),
        ("rollout.ray.timeout_s=-1", "rollout.ray.timeout_s"),
        ("rollout.ray.max_restarts=-2", "rollout.ray.max_restarts"),
        ("rollout.ray.worker_resources={rollout: 0}", "rollout.ray.worker_resources.rollout"),
        ("rollout.ray.worker_resources={GPU: 1}", "rollout.ray.worker_resources.GPU"),
        ("rollout.ray.tools={python: docker}", "rollout.ray.tools.python"),
        ("rollout.ray.namespace=''", "rollout.ray.namespace"),
        ("rollout.ray.adress=auto", "rollout.ray.adress"),
    ],
)
def test_bad_ray_settings_name_their_key(override, key):
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, [override])
    assert e.value.key == key


def test_a_ray_tool_must_be_one_of_the_envs_tools():
    with pytest.raises(ConfigError, match=r"rollout.ray.tools.python: names no tool of env.tools \(search\)"):
        config_from_dict({}, ["env.tools=[search]", "rollout.placement=ray", "rollout.ray.tools={python: {docker: 1}}"])


def test_import_agentenv_does_not_import_ray():
    import subprocess
    import sys

    code = "import sys, agentenv, agentenv.training.build, agentenv.rollout; print('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
