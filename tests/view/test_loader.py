"""`agentenv view`'s loader and API over crafted folders: what is read, what is capped, and the messages for
what cannot be (a missing folder, a truncated line, a run with no saved rollouts), over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from agentenv.view import loader
from agentenv.view.loader import Folder, ViewError
from agentenv.view.server import ViewServer


def _traj(uid: str, reward: float, parent: str | None = None, branch: int | None = None, probes=(), text="ab") -> dict:
    return {
        "uid": uid, "parent": parent, "branch_token": branch, "reward": reward, "correct": reward > 0,
        "failed": False, "error": None, "finish_reason": "answer", "tool_calls": {"search": 1}, "tool_errors": {},
        "calls": [{"segment": 2, "tool": "search", "ok": True, "kind": None}], "advantage": reward - 0.5,
        "tree": {"role": "branch" if parent else "initial", "path": uid, "probes": list(probes)},
        "segments": [
            {"source": "prompt", "ids": [1, 2], "text": "Q?"},
            {"source": "policy", "ids": [3, 4], "text": text, "pieces": list(text), "logprobs": [-0.1, -2.0],
             "entropies": [0.2, 1.5]},
            {"source": "tool", "ids": [5], "text": "<result>x</result>"},
        ],
    }  # fmt: skip


def _group(task_id: str, kind: str = "twohop", step: int = 1) -> dict:
    probe = {"token": 4, "h_t": 1.2, "h_initial": 0.3, "delta_h": 0.09, "forks": 1, "forks_wanted": 1}
    return {
        "task": {"id": task_id, "kind": kind, "question": f"question {task_id}", "ground_truth": "Paris"},
        "info": {"branch_points": 1}, "step": step, "split": "train",
        "trajectories": [_traj("i0", 1.0, probes=[probe]), _traj("i0.t1.b0", 0.0, parent="i0", branch=4)],
    }  # fmt: skip


def make_run(path: Path, steps: int = 3, save_rollouts: bool | None = True, groups: int = 2) -> Path:
    path.mkdir(parents=True)
    logging_cfg = {} if save_rollouts is None else {"save_rollouts": save_rollouts}
    (path / "config.json").write_text(json.dumps(
        {"algorithm": {"name": "arpo"}, "policy": {"backend": "hf"}, "trainer": {"steps": steps}, "logging": logging_cfg}
    ))  # fmt: skip
    lines = [json.dumps({"step": 0, "eval/accuracy": 0.2})]
    lines += [json.dumps({"step": s, "rollout/reward": s / 10, "rollout/entropy": 0.5, "time/step_s": 1.0})
              for s in range(1, steps + 1)]  # fmt: skip
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if save_rollouts:
        (path / "rollouts").mkdir()
        for s in range(1, steps + 1):
            rows = [json.dumps(_group(f"t{s}-{g}", step=s)) for g in range(groups)]
            (path / "rollouts" / f"train_{s:06d}.jsonl").write_text("\n".join(rows) + "\n")
    return path


def test_a_run_folder_reads_metrics_steps_and_groups(tmp_path):
    folder = Folder.open(make_run(tmp_path / "run"))
    assert folder.kind == "run" and list(folder.runs) == ["."]
    run = folder.run(".")
    metrics = run.metrics()
    assert [r["step"] for r in metrics.data] == [0, 1, 2, 3] and metrics.problems == []
    steps = run.rollout_files()
    assert [(f["split"], f["step"]) for f in steps.data] == [("train", 1), ("train", 2), ("train", 3)]
    got = run.groups("train", 2)
    assert got.data["total"] == 2 and [g["task"]["id"] for g in got.data["groups"]] == ["t2-0", "t2-1"]
    info = folder.info()
    assert info["runs"]["."]["algorithm"] == "arpo" and info["runs"]["."]["backend"] == "hf"


def test_truncated_and_broken_lines_are_skipped_and_named(tmp_path):
    run_dir = make_run(tmp_path / "run")
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "rollout/rew')  # a live run's line half-written
    path = run_dir / "rollouts" / "train_000002.jsonl"
    path.write_text(path.read_text() + "[1, 2]\n" + '{"task": {"id": "cut"')
    run = Folder.open(run_dir).run(".")
    metrics = run.metrics()
    assert [r["step"] for r in metrics.data] == [0, 1, 2, 3]
    assert any("metrics.jsonl line 5" in p and "still being written" in p for p in metrics.problems), metrics.problems
    got = run.groups("train", 2)
    assert got.data["total"] == 2
    assert any("line 3: a JSON list" in p for p in got.problems), got.problems
    assert any("line 4: not valid JSON" in p for p in got.problems), got.problems


def test_nonfinite_metrics_become_gaps(tmp_path):
    run_dir = make_run(tmp_path / "run", steps=1)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 2, "rollout/reward": None, "nonfinite": ["rollout/reward"]}) + "\n")
    data = Folder.open(run_dir).run(".").metrics().data
    assert data[-1]["rollout/reward"] is None and "nonfinite" not in data[-1]


def test_a_huge_run_is_capped_and_paged(tmp_path, monkeypatch):
    run_dir = make_run(tmp_path / "run", steps=60, groups=7)
    monkeypatch.setattr(loader, "MAX_POINTS", 10)
    monkeypatch.setattr(loader, "MAX_METRIC_BYTES", 2_000)
    run = Folder.open(run_dir).run(".")
    metrics = run.metrics()
    train = [r for r in metrics.data if "rollout/reward" in r]
    assert len(train) == 10 and train[-1]["step"] == 60  # the newest step is always shown
    assert any("only its last" in p for p in metrics.problems), metrics.problems
    assert any("the curves show 10 of them" in p for p in metrics.problems), metrics.problems
    first = run.groups("train", 5, offset=0, limit=3)
    rest = run.groups("train", 5, offset=3, limit=100)
    assert first.data["total"] == 7 and len(first.data["groups"]) == 3
    assert len(rest.data["groups"]) == 4  # the rest; a page is never above MAX_GROUPS_PER_PAGE
    monkeypatch.setattr(loader, "MAX_GROUP_FILE_BYTES", 3_000)
    capped = run.groups("train", 5)
    assert 0 < capped.data["total"] < 7 and any("only its first" in p for p in capped.problems), capped.problems


@pytest.mark.parametrize(
    ("save", "words"),
    [(False, "logging.save_rollouts=false"), (None, "made before the trainer recorded them")],
)
def test_a_run_without_rollouts_says_why(tmp_path, save, words):
    run = Folder.open(make_run(tmp_path / "run", save_rollouts=save)).run(".")
    steps = run.rollout_files()
    assert steps.data == [] and words in steps.problems[0] and "metrics only" in steps.problems[0]
    assert run.metrics().data  # the curves are still there


def test_a_half_written_run_and_bad_folders(tmp_path):
    half = tmp_path / "half"
    half.mkdir()
    (half / "config.json").write_text('{"algorithm": {"na')  # the run's first write, cut
    run = Folder.open(half).run(".")
    assert run.metrics().data == [] and "no metrics.jsonl yet" in run.metrics().problems[0]
    info = Folder.open(half).info()
    assert any("config.json: cannot be read as JSON" in p for p in info["runs"]["."]["problems"])
    with pytest.raises(ViewError, match="no such folder"):
        Folder.open(tmp_path / "missing")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ViewError, match="not a folder"):
        Folder.open(tmp_path / "file.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ViewError, match="neither a run .* nor a bench"):
        Folder.open(tmp_path / "empty")
    with pytest.raises(ViewError, match="no run 'x'"):
        Folder.open(half).run("x")


def make_bench(root: Path) -> Path:
    root.mkdir()
    (root / "bench_config.json").write_text("{}")
    (root / "results.csv").write_text("variant,algorithm,heldout_acc\ngrpo,grpo,0.21\narpo,arpo,0.26\n")
    for variant, seed, bias in (("grpo", 0, 0.0), ("grpo", 1, 0.2), ("arpo", 0, 0.1)):
        make_run(root / "runs" / variant / f"seed{seed}", steps=3)
        path = root / "runs" / variant / f"seed{seed}" / "metrics.jsonl"
        recs = [json.loads(line) for line in path.read_text().splitlines()]
        for r in recs:
            if "rollout/reward" in r:
                r["rollout/reward"] += bias
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    (root / "runs" / "_base").mkdir()  # the base probe: not a variant
    return root


def test_a_bench_folder_overlays_variants_with_bands(tmp_path):
    folder = Folder.open(make_bench(tmp_path / "bench"))
    assert folder.kind == "bench"
    assert folder.variants == {"arpo": ["arpo/seed0"], "grpo": ["grpo/seed0", "grpo/seed1"]}
    info = folder.info()
    assert info["table"]["columns"] == ["variant", "algorithm", "heldout_acc"] and len(info["table"]["rows"]) == 2
    curves = folder.bench_curves(["rollout/reward", "eval/accuracy"]).data
    grpo = curves["rollout/reward"]["grpo"]
    assert grpo["steps"] == [1, 2, 3] and grpo["seeds"] == 2
    assert grpo["lo"] == pytest.approx([0.1, 0.2, 0.3]) and grpo["hi"] == pytest.approx([0.3, 0.4, 0.5])
    assert grpo["mean"] == pytest.approx([0.2, 0.3, 0.4])
    assert curves["eval/accuracy"]["arpo"]["steps"] == [0]
    same = folder.run("grpo/seed1").task_groups("t2-1").data
    assert [(g["task"]["id"], g["step"]) for g in same] == [("t2-1", 2)]


def test_a_bench_before_its_report_says_so(tmp_path):
    root = make_bench(tmp_path / "bench")
    (root / "results.csv").unlink()
    info = Folder.open(root).info()
    assert info["table"] is None and any("no results.csv yet" in p for p in info["problems"])


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with session.get(url) as r:
        return r.status, await r.json()


async def test_the_api_over_http_answers_json_and_clear_errors(tmp_path):
    server = await ViewServer(Folder.open(make_bench(tmp_path / "bench"))).start()
    base = server.url.rstrip("/")
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(base + "/") as r:
                page = await r.text()
                assert r.status == 200 and "/static/app.js" in page
            async with s.get(base + "/static/app.js") as r:
                assert r.status == 200 and "function treeView" in await r.text()
            status, body = await _get(s, base + "/api/info")
            assert status == 200 and body["data"]["kind"] == "bench"
            status, body = await _get(s, base + "/api/groups?run=grpo/seed0&split=train&step=2&limit=1")
            assert status == 200 and body["data"]["total"] == 2 and len(body["data"]["groups"]) == 1
            status, body = await _get(s, base + "/api/task?task=t3-0")
            assert status == 200 and {k: len(v) for k, v in body["data"].items()} == {
                "arpo/seed0": 1, "grpo/seed0": 1, "grpo/seed1": 1}
            status, body = await _get(s, base + "/api/bench_curves?key=rollout/reward")
            assert status == 200 and body["data"]["rollout/reward"]["grpo"]["seeds"] == 2
            for url, words in [
                ("/api/groups?run=grpo/seed0&split=train&step=two", "?step= must be an integer, got 'two'"),
                ("/api/groups?run=grpo/seed0&split=dev&step=1", "split must be train or eval, got 'dev'"),
                ("/api/metrics?run=nope", "no run 'nope'"),
                ("/api/bench_curves", "needs ?key="),
            ]:
                status, body = await _get(s, base + url)
                assert status == 400 and words in body["problems"][0], (url, body)
            status, body = await _get(s, base + "/api/groups?run=grpo/seed0&split=train&step=9")
            assert status == 200 and "no recorded train step 9" in body["problems"][0]
    finally:
        await server.aclose()


def test_the_command_names_a_bad_folder_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "agentenv", "view", str(tmp_path / "nowhere"), "--port", "0"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip().startswith("error:") and "nowhere: no such folder" in out.stderr
    assert "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "agentenv", "view", str(make_run(tmp_path / "run")), "--port", "70000"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "'--port'" in out.stderr and "65535" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "OverflowError" not in out.stderr



async def test_bytes_that_are_not_utf8_nan_and_odd_values_answer_200_with_problems(tmp_path):
    run_dir = make_run(tmp_path / "bench" / "runs" / "grpo" / "seed0")
    odd = make_run(tmp_path / "bench" / "runs" / "grpo" / "seed1", save_rollouts=False)
    (odd / "config.json").write_text(json.dumps({"algorithm": "grpo", "policy": None, "logging": ["x"]}))
    (tmp_path / "bench" / "results.csv").write_bytes(b"variant,acc\n\xffgrpo,0.5\n")
    (run_dir / "rollouts" / "STOPPED").write_bytes(b"the record stops \xff\xfe\n")
    with (run_dir / "metrics.jsonl").open("a") as f:  # Python's json writes NaN; a foreign tool, strings
        f.write('{"step": 4, "rollout/reward": NaN, "rollout/entropy": "high"}\n{"step": NaN}\n')
    group = _group("t9", step=2)
    group["trajectories"][0]["reward_parts"] = {"format": float("nan")}
    (run_dir / "rollouts" / "train_000002.jsonl").write_text(json.dumps(group) + "\n")  # NaN, as the writer would
    server = await ViewServer(Folder.open(tmp_path / "bench")).start()
    base = server.url.rstrip("/")
    try:
        async with aiohttp.ClientSession() as s:
            status, body = await _get(s, base + "/api/info")
            assert status == 200 and body["data"]["table"]["rows"] == [["\ufffdgrpo", "0.5"]]
            assert body["data"]["runs"]["grpo/seed1"]["algorithm"] is None
            status, body = await _get(s, base + "/api/steps?run=grpo/seed1")
            assert status == 200 and "no saved rollouts" in body["problems"][0], body
            status, body = await _get(s, base + "/api/steps?run=grpo/seed0")
            assert status == 200 and "the record stops \ufffd\ufffd" in body["problems"], body
            status, body = await _get(s, base + "/api/metrics?run=grpo/seed0")
            assert status == 200 and body["data"][-1] == {"step": 4, "rollout/reward": None}, body["data"][-1]
            assert any("not numbers" in p and "rollout/entropy" in p for p in body["problems"]), body["problems"]
            assert any("1 records without a step" in p for p in body["problems"]), body["problems"]
            status, body = await _get(s, base + "/api/groups?run=grpo/seed0&split=train&step=2")
            assert status == 200 and body["data"]["groups"][0]["trajectories"][0]["reward_parts"] == {"format": None}
            status, body = await _get(s, base + "/api/task?task=t9")
            assert status == 200 and len(body["data"]["grpo/seed0"]) == 1, body
            status, body = await _get(s, base + "/api/bench_curves?key=rollout/entropy")
            assert status == 200 and body["data"]["rollout/entropy"]["grpo"]["seeds"] == 2, body
    finally:
        await server.aclose()


async def test_only_a_loopback_host_name_is_answered(tmp_path):
    """DNS rebinding: a web page whose name now points at 127.0.0.1 must not read the run through the browser."""
    server = await ViewServer(Folder.open(make_run(tmp_path / "run"))).start()
    base = server.url.rstrip("/")
    try:
        async with aiohttp.ClientSession() as s:
            for host in ("attacker.example", f"attacker.example:{server.port}", "127.0.0.1.attacker.example"):
                for path in ("/", "/static/app.js", "/api/groups?run=.&split=train&step=1"):
                    async with s.get(base + path, headers={"Host": host}) as r:
                        assert r.status == 403, (host, path)
                        assert "answers only at http://127.0.0.1:" in (await r.json())["problems"][0]
            for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", f"[::1]:{server.port}", "localhost"):
                async with s.get(base + "/api/steps?run=.", headers={"Host": host}) as r:
                    assert r.status == 200, host
    finally:
        await server.aclose()
