"""The benchmark on a two-node Ray cluster: runs in parallel, one killed mid-way and trained again, resume.

Two tiny runs (hf backend, 1 step) reserve 1 CPU each on a cluster of two 1-CPU
nodes, so they run at once, one per node. When the second has built its trainer,
the test kills its worker process (SIGKILL, as a lost node would): Ray retries
the task, the run is trained again from scratch into the same folder, and the
benchmark finishes with the same layout as a local one. Called again, it
trains nothing.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import yaml

pytestmark = pytest.mark.slow

TINY = [
    "policy.backend=hf",  # no engine inside the Ray worker: the lightest real run
    "env.tools=[search]",
    "env.tasks.kinds=[twohop]",
    "env.max_context_tokens=768",
    "env.max_result_tokens=160",
    "policy.max_turn_tokens=32",
    "algorithm.group_size=2",
    "trainer.steps=1",
    "trainer.tasks_per_step=2",
    "trainer.mini_batch_tasks=2",
    "trainer.micro_batch_size=4",
    "trainer.eval_every=0",
    "trainer.eval_tasks=2",
    "trainer.eval_samples=1",
    "trainer.checkpoint_every=1",
    "logging.tensorboard=false",
    "logging.progress=false",
]


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    # Ray's memory monitor kills the newest task when the machine's memory is nearly full (on a shared machine,
    # other programs' memory); the kill this test makes must be its only one, so the monitor is off for its nodes.
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        del os.environ["RAY_memory_monitor_refresh_ms"]


def test_runs_in_parallel_on_two_nodes_a_killed_run_is_trained_again_and_resume_skips(cluster, tmp_path, tiny_model_path, capsys):
    from agentenv.bench import run_benchmark
    from agentenv.bench.runner import RUN_FILE, WORKER_FILE

    out = tmp_path / "bench"
    cfg = {
        "name": "ray", "output_dir": str(out), "seeds": [0, 1], "smoke": True,
        "base": {"model": {"path": str(tiny_model_path)}},
        "variants": {"grpo": {"algorithm": {"name": "grpo"}}},
        "probe": {"tasks": 0},
        "ray": {"num_cpus": 1, "max_retries": 2},
    }  # fmt: skip
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    overrides = [*TINY, f"ray.address={cluster.address}"]

    victim = out / "runs" / "grpo" / "seed1"
    killed: dict = {}

    def kill_mid_way() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            # the trainer has written its config: the run is under way, far from its bench_run.json
            if (victim / "config.json").exists() and (victim / WORKER_FILE).exists():
                killed.update(json.loads((victim / WORKER_FILE).read_text()))
                os.kill(killed["pid"], signal.SIGKILL)
                killed["at"] = time.time()
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_mid_way, daemon=True)
    killer.start()
    result = run_benchmark(path, overrides)
    killer.join(timeout=5)
    assert "pid" in killed, "the run was never seen under way"
    err = capsys.readouterr().err
    assert "ray: 2 runs on" in err and err.count("finished (held-out accuracy") == 2

    workers = {}
    for seed in (0, 1):
        d = out / "runs" / "grpo" / f"seed{seed}"
        assert (d / RUN_FILE).exists() and (d / "eval.json").exists() and (d / "metrics.jsonl").exists()
        workers[seed] = json.loads((d / WORKER_FILE).read_text())
    assert workers[1]["pid"] != killed["pid"]  # trained again, in another worker process
    assert workers[0]["pid"] != os.getpid() and workers[1]["pid"] != os.getpid()  # not in the driver
    # seed 0 was still training when seed 1 was killed: in flight together, each on the only CPU of its node
    seed0_end = workers[0]["started"] + json.loads((out / "runs/grpo/seed0" / RUN_FILE).read_text())["wall_s"]
    assert workers[0]["started"] < killed["at"] < seed0_end + 5  # + the 5 s of its start before its clock
    assert killed["ray_node"] != workers[0]["ray_node"]
    assert [r.seed for r in result.runs] == [0, 1] and "| grpo | grpo | 2 |" in result.markdown

    again = run_benchmark(path, overrides)
    err = capsys.readouterr().err
    assert "(2 reused, 0 to train)" in err and "ray:" not in err
    assert [r.eval for r in again.runs] == [r.eval for r in result.runs]
