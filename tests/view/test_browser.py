"""`agentenv view` in a real browser: Debian's chromium, headless, driven by Playwright, against the page serving
a real short ARPO run of the tiny model (and a bench, a live run and a metrics-only run made from it).

The curves render, a tree shows its branch points, clicking a node shows its text, the filters narrow the list,
a live run's curves grow, and a run without saved rollouts says why. With AGENTENV_SCREENSHOTS=<folder> the
screenshots are also written there (the docs' are: AGENTENV_SCREENSHOTS=docs/images/view).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from agentenv._loops import LoopThread
from agentenv.configs import config_from_dict
from agentenv.view.loader import Folder
from agentenv.view.server import ViewServer

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"

ARPO = [
    "policy.backend=hf",
    "env.tools=[search]",
    "env.tasks.kinds=[twohop]",
    "env.max_context_tokens=640",
    "env.max_result_tokens=160",
    "policy.max_turn_tokens=48",
    "algorithm.name=arpo",
    "algorithm.group_size=4",
    "algorithm.initial_rollouts=2",
    "algorithm.forks_per_branch=1",
    "algorithm.entropy_window=4",
    "algorithm.tau=0.0",  # P_t = α + β·ΔH > 0: every path branches at its first tool result while slots remain
    "trainer.steps=2",
    "trainer.tasks_per_step=2",
    "trainer.mini_batch_tasks=2",
    "trainer.micro_batch_size=8",
    "trainer.eval_tasks=2",
    "trainer.eval_every=0",
    "trainer.checkpoint_every=2",
    "logging.tensorboard=false",
    "logging.progress=false",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_path) -> Path:
    from agentenv.training.trainer import Trainer

    out = tmp_path_factory.mktemp("view") / "run"
    Trainer(config_from_dict({}, ARPO + [f"trainer.output_dir={out}"])).train()
    return out


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: scripts/test.sh installs Debian's chromium (apt-get)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def serve():
    loop = LoopThread("view-test")
    servers = []

    def start(path: Path) -> str:
        server = loop.run(ViewServer(Folder.open(path)).start())
        servers.append(server)
        return server.url

    yield start
    for s in servers:
        loop.run(s.aclose())
    loop.stop()


def _page(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    return page, errors


def _shot(page, tmp_path: Path, name: str, full: bool = False) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=full)
    where = os.environ.get("AGENTENV_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(where) / path.name)


def _record(run_dir: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((run_dir / "rollouts").glob("train_*.jsonl"))
            for line in f.read_text().splitlines()]  # fmt: skip


def test_the_trainer_recorded_every_step_and_evaluation(run_dir):
    names = sorted(p.name for p in (run_dir / "rollouts").glob("*.jsonl"))
    assert names == ["eval_000002.jsonl", "train_000001.jsonl", "train_000002.jsonl"]  # eval_every=0: the final one
    groups = _record(run_dir)
    assert len(groups) == 4 and all(len(g["trajectories"]) == 4 for g in groups)
    for g in groups:
        for t in g["trajectories"]:
            policy = [s for s in t["segments"] if s["source"] == "policy"]
            assert policy and all(len(s["pieces"]) == len(s["ids"]) == len(s["entropies"]) == len(s["adv"]) for s in policy)
            assert all(set(s["mask"]) <= {0, 1} for s in policy)
            assert len(t["calls"]) == sum(s["source"] == "tool" for s in t["segments"])
    branches = [t for g in groups for t in g["trajectories"] if t["parent"]]
    assert branches, "no path branched (tau=0 branches at every tool result): the tiny model called no tool?"
    assert all(t["tree"]["trigger"]["forks"] >= 1 and t["tree"]["trigger"]["token"] == t["branch_token"] for t in branches)


def test_the_page_shows_curves_a_tree_its_text_and_filters(run_dir, browser, serve, tmp_path):
    groups = _record(run_dir)
    step = next(g["step"] for g in groups if any(t["parent"] for t in g["trajectories"]))
    page, errors = _page(browser, serve(run_dir))
    # the curves: six charts, the reward's line drawn through both steps
    assert page.locator(".chart").count() == 6
    assert page.locator(".chart[data-title='reward'] path.line").get_attribute("d").count("L") == 1
    assert page.locator(".chart[data-title='step time split (s)'] path.line").count() == 4
    # the recorded step with a branch: its tree's branch points
    index = page.locator("#step option", has_text=f"train step {step}").get_attribute("value")
    page.select_option("#step", index)
    page.wait_for_function(f"document.querySelector('#count').textContent.includes('train step {step}')")
    branch_nodes = page.locator("circle.node.branch")
    assert branch_nodes.count() >= 1
    _shot(page, tmp_path, "view_run", full=True)
    # click a branch point: its entropy and the prefix its branches share
    group = next(g for g in groups if g["step"] == step and any(t["parent"] for t in g["trajectories"]))
    parent = next(t for t in group["trajectories"] if any(p["forks"] for p in t["tree"]["probes"]))
    probe = next(p for p in parent["tree"]["probes"] if p["forks"])
    page.locator(f"circle.node.branch[data-uid='{parent['uid']}'][data-token='{probe['token']}']").click()
    panel = page.locator("#panel")
    assert panel.is_visible()
    assert page.locator("#panel-title").text_content() == f"branch point on {parent['tree']['path']} at token {probe['token']}"
    assert "ΔH (normalized)" in panel.text_content() and f"{probe['h_t']:.4f}".rstrip("0")[:5] in panel.text_content()
    first_turn = next(s["text"] for s in parent["segments"] if s["source"] == "policy")
    assert first_turn.strip()[:20] in page.locator("#panel-body .text").text_content()
    page.select_option("#colour", "entropy")
    _shot(page, tmp_path, "view_branch")
    # click a leaf: its own text
    leaf = page.locator(f"circle.node.leaf[data-uid='{parent['uid']}']")
    leaf.click()
    last_turn = [s["text"] for s in parent["segments"] if s["source"] == "policy"][-1]
    assert last_turn.strip()[:20] in page.locator("#panel-body .text").text_content()
    assert page.locator("#panel-body .tok[style*='background']").count() > 0  # coloured by entropy
    _shot(page, tmp_path, "view_leaf")
    page.click("#panel-close")
    # the filters narrow the list: a question's words, then a reward
    total = page.locator(".group").count()
    assert total == 2
    page.fill("#f-text", group["task"]["question"])
    assert page.locator(".group").count() == 1
    page.fill("#f-text", "")
    rewards = [t["reward"] for g in groups if g["step"] == step for t in g["trajectories"]]
    page.select_option("#f-reward", "pos")
    assert page.locator("details.traj").count() == sum(r > 0 for r in rewards)
    page.select_option("#f-reward", "nonpos")
    assert page.locator("details.traj").count() == sum(r <= 0 for r in rewards)
    page.select_option("#f-reward", "")
    trajs = [t for g in groups if g["step"] == step for t in g["trajectories"]]
    page.check("#f-failed")
    assert page.locator("details.traj").count() == sum(t["failed"] for t in trajs)
    page.uncheck("#f-failed")
    kinds: dict[str, int] = {}  # tool error kind -> trajectories with one (a malformed call is the env's answer)
    for t in trajs:
        found = {("malformed call" if c["tool"] == "invalid" else c["kind"] or "error") for c in t["calls"] if c["ok"] is False}
        found |= {k for by_kind in t["tool_errors"].values() for k in by_kind}
        for k in found:
            kinds[k] = kinds.get(k, 0) + 1
    assert sorted(page.locator("#f-err option").all_text_contents()) == sorted(["any", *kinds])
    for kind, n in kinds.items():
        page.select_option("#f-err", kind)
        assert page.locator("details.traj").count() == n, kind
    page.select_option("#f-err", "")
    assert page.locator("details.traj").count() == len(trajs)
    assert "trajectories shown" in page.locator("#count").text_content()
    assert errors == []


def test_a_live_run_refreshes_and_a_metrics_only_run_says_why(run_dir, browser, serve, tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg["logging"]["save_rollouts"] = False
    (live / "config.json").write_text(json.dumps(cfg))
    records = (run_dir / "metrics.jsonl").read_text().splitlines()
    first = [r for r in records if '"rollout/reward"' in r][0]
    (live / "metrics.jsonl").write_text(first + "\n")  # one step so far, no eval.json: live
    page, errors = _page(browser, serve(live) + "?refresh=1")
    assert "live" in page.locator("#badges").text_content()
    assert "logging.save_rollouts=false" in page.locator("#groups").text_content()
    assert "logging.save_rollouts=false" in page.locator("#problems").text_content()
    reward = page.locator(".chart[data-title='reward'] circle")
    assert reward.count() == 1
    step2 = json.loads(first)
    step2["step"] = 2
    with (live / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(step2) + "\n")
    page.wait_for_function("document.querySelectorAll(\".chart[data-title='reward'] circle\").length === 2", timeout=15_000)
    with (live / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rollout/rew')  # a line being written: said, not fatal
    page.wait_for_function("document.querySelector('#problems').textContent.includes('metrics.jsonl line 3')",
                           timeout=15_000)  # fmt: skip
    assert errors == []


def test_a_bench_shows_variants_side_by_side(run_dir, browser, serve, tmp_path):
    bench = tmp_path / "bench"
    for variant in ("arpo", "arpo_hard"):
        for seed in (0, 1):
            shutil.copytree(run_dir, bench / "runs" / variant / f"seed{seed}", ignore=shutil.ignore_patterns("checkpoints"))
    (bench / "bench_config.json").write_text("{}")
    (bench / "results.csv").write_text("variant,algorithm,seeds,heldout_acc\narpo,arpo,2,0.5\narpo_hard,arpo,2,0.5\n")
    page, errors = _page(browser, serve(bench))
    assert page.locator("table.results tbody tr").count() == 2
    legend = page.locator(".chart[data-title^='reward'] .legend").text_content()
    assert "arpo (2 seeds)" in legend and "arpo_hard (2 seeds)" in legend
    assert page.locator(".chart[data-title^='reward'] path.band").count() == 2
    assert page.locator("#run option").count() == 4
    page.locator("button", has_text="this task under each variant").first.click()
    page.wait_for_function("document.querySelectorAll('#panel-body .cmp').length === 4")
    _shot(page, tmp_path, "view_bench_copies")  # the docs show a real bench (docs/training/view.md)
    assert errors == []
