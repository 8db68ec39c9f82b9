"""Benchmark configs: variants merged over the base (or a run config file), overrides routed, the shared budget
and the pairing enforced, at least 3 seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agentenv.bench.config import bench_config_from_dict, deep_merge, expand_dotted, load_bench_config, resolve_runs
from agentenv.errors import ConfigError

RAW = {
    "name": "t",
    "output_dir": "OUT",
    "seeds": [3, 5, 8],
    "base": {"algorithm": {"name": "grpo", "group_size": 4}, "trainer": {"steps": 3, "lr": 0.01}},
    "variants": {
        "std": {"algorithm": {"normalize_std": True}},
        "dr": ["algorithm.normalize_std=false", "trainer.lr=0.02"],
        "dotted": {"algorithm.clip_high": 0.3},
    },
}


def test_runs_merge_variant_over_base_and_set_seed_and_dir(tmp_path):
    bench = bench_config_from_dict({**RAW, "output_dir": str(tmp_path)})
    runs = resolve_runs(bench)
    # seed by seed, so that a bench stopped part-way holds whole paired seeds
    assert [(r.variant, r.seed) for r in runs] == [(v, s) for s in (3, 5, 8) for v in ("std", "dr", "dotted")]
    by = {(r.variant, r.seed): r for r in runs}
    dr = by["dr", 5].config
    assert dr.algorithm_config.normalize_std is False and dr.trainer.lr == 0.02
    assert dr.algorithm_config.group_size == 4  # inherited from base
    assert dr.trainer.seed == 5
    assert Path(dr.trainer.output_dir) == tmp_path / "runs" / "dr" / "seed5"
    assert by["dotted", 3].config.algorithm_config.clip_high == 0.3
    assert by["std", 3].config.trainer.lr == 0.01


def test_cli_overrides_go_to_runs_or_to_the_benchmark():
    bench = bench_config_from_dict(RAW, ["trainer.steps=1", "seeds=[7]", "smoke=true", "variants.std.trainer.lr=0.5"])
    assert bench.seeds == (7,)
    assert bench.run_overrides == ("trainer.steps=1",)
    runs = resolve_runs(bench)
    assert {r.config.trainer.steps for r in runs} == {1}
    assert runs[0].config.trainer.lr == 0.5


def test_variant_that_changes_the_budget_is_refused():
    raw = {**RAW, "variants": {"a": {}, "b": {"trainer": {"steps": 9}}}}
    with pytest.raises(ConfigError, match=r"variants\.b.*trainer\.steps is 9 in 'b' but 3 in 'a'"):
        resolve_runs(bench_config_from_dict(raw))


def test_invalid_variant_names_the_variant_and_key():
    raw = {**RAW, "variants": {"bad": {"algorithm": {"group_size": 1}}}}
    with pytest.raises(ConfigError, match=r"variants\.bad -> algorithm\.group_size"):
        resolve_runs(bench_config_from_dict(raw))
    with pytest.raises(ConfigError, match=r"variants\.x\.trainers.*unknown section"):
        bench_config_from_dict({**RAW, "variants": {"x": {"trainers": {}}}})
    with pytest.raises(ConfigError, match="seeds"):
        bench_config_from_dict({**RAW, "seeds": [1, 1, 2]})
    with pytest.raises(ConfigError, match="variants"):
        bench_config_from_dict({**RAW, "variants": {}})


def test_base_path_is_relative_to_the_benchmark_file(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"trainer": {"steps": 2}, "algorithm": {"group_size": 4}}))
    sub = tmp_path / "bench"
    sub.mkdir()
    (sub / "b.yaml").write_text(
        yaml.safe_dump({"base": "../run.yaml", "variants": {"g": {}}, "output_dir": str(tmp_path / "o")})
    )
    bench = load_bench_config(sub / "b.yaml", ["base.trainer.lr=0.3", "seeds=[0]", "smoke=true"])
    (run,) = resolve_runs(bench)
    assert run.config.trainer.steps == 2 and run.config.trainer.lr == 0.3


def test_merge_helpers():
    assert deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"b": 3}, "d": 4}) == {"a": {"b": 3, "c": 2}, "d": 4}
    assert expand_dotted({"a.b": 1, "a": {"c.d": 2}}) == {"a": {"b": 1, "c": {"d": 2}}}


def test_the_toy_benchmark_config_resolves():
    path = Path(__file__).resolve().parents[2] / "configs" / "bench" / "toy_grpo_vs_arpo.yaml"
    runs = resolve_runs(load_bench_config(path))
    names = {r.variant for r in runs}
    assert len(names) >= 2
    assert len({r.config.trainer.steps for r in runs}) == 1


def test_fewer_than_three_seeds_need_smoke():
    with pytest.raises(ConfigError, match=r"seeds: \[3, 5\] has 2; .* at least 3 seeds .* smoke=true"):
        bench_config_from_dict({**RAW, "seeds": [3, 5]})
    assert bench_config_from_dict({**RAW, "seeds": [3], "smoke": True}).seeds == (3,)
    assert bench_config_from_dict({**RAW, "seeds": [3, 5]}, ["smoke=true"]).smoke is True
    with pytest.raises(ConfigError, match="confidence"):
        bench_config_from_dict({**RAW, "confidence": 1.5})


def test_variant_given_as_a_run_config_file(tmp_path):
    """A variant names a whole run config (a path, or `config:` with sections over it); base_overrides apply to it."""
    (tmp_path / "arpo.yaml").write_text(
        yaml.safe_dump({"algorithm": {"name": "arpo", "group_size": 4, "initial_rollouts": 2}, "trainer": {"steps": 5}})
    )
    sub = tmp_path / "bench"
    sub.mkdir()
    raw = {
        "output_dir": str(tmp_path / "o"),
        "base": {"algorithm": {"name": "grpo", "group_size": 4}, "trainer": {"steps": 1}},
        "base_overrides": ["trainer.steps=3"],
        "variants": {
            "grpo": {},
            "arpo_file": "../arpo.yaml",
            "arpo_hard": {"config": "../arpo.yaml", "algorithm": {"advantage": "hard"}},
        },
    }
    (sub / "b.yaml").write_text(yaml.safe_dump(raw))
    runs = {(r.variant, r.seed): r.config for r in resolve_runs(load_bench_config(sub / "b.yaml"))}
    assert runs["grpo", 0].algorithm.name == "grpo"
    f, h = runs["arpo_file", 1], runs["arpo_hard", 2]
    assert f.algorithm.name == "arpo" and f.algorithm_config.initial_rollouts == 2
    assert f.algorithm_config.advantage == "soft" and h.algorithm_config.advantage == "hard"
    assert {c.trainer.steps for c in runs.values()} == {3}  # the file's 5 overridden by base_overrides
    assert h.trainer.seed == 2
    with pytest.raises(ConfigError, match=r"variants\.x\.config: file not found: .*nope\.yaml"):
        bench_config_from_dict({**raw, "variants": {"x": "nope.yaml"}}, root=sub)


def test_runs_of_one_seed_are_paired_across_variants(tmp_path):
    """Same seed -> same trainer seed, task source, evaluation tasks and seeds in every variant; the budget
    check refuses a variant whose evaluation seed differs (it would unpair the held-out comparison)."""
    runs = resolve_runs(bench_config_from_dict({**RAW, "output_dir": str(tmp_path)}))
    for seed in (3, 5, 8):
        same = [r.config for r in runs if r.seed == seed]
        assert len(same) == 3
        assert {c.trainer.seed for c in same} == {seed}
        assert {c.trainer.evaluation_seed for c in same} == {seed}
        assert len({json.dumps(c.to_dict()["env"], sort_keys=True) for c in same}) == 1
        assert len({(c.trainer.eval_tasks, c.trainer.eval_samples, c.trainer.eval_every) for c in same}) == 1
    raw = {**RAW, "variants": {"a": {}, "b": {"trainer": {"eval_seed": 7}}}}
    with pytest.raises(ConfigError, match=r"variants\.b.*trainer\.eval_seed is 7"):
        resolve_runs(bench_config_from_dict(raw))


CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "bench"


@pytest.mark.parametrize("name", ["quick_toy.yaml", "arpo_parquet_smoke.yaml"])
def test_shipped_bench_configs_resolve(name):
    runs = resolve_runs(load_bench_config(CONFIGS / name))
    assert len({r.variant for r in runs}) >= 2
    assert len({r.config.trainer.steps for r in runs}) == 1


def test_paper_table_config_resolves():
    """GRPO, DAPO, REINFORCE++, ARPO soft/hard/hard_once, 3 seeds, one budget."""
    bench = load_bench_config(CONFIGS / "paper_table_toy.yaml")
    assert len(bench.seeds) >= 3 and not bench.smoke
    runs = resolve_runs(bench)
    algos = {r.variant: (r.config.algorithm.name, getattr(r.config.algorithm_config, "advantage", None)) for r in runs}
    assert [a for a, _ in algos.values()] == ["grpo", "dapo", "reinforce_pp", "arpo", "arpo", "arpo"]
    assert {adv for a, adv in algos.values() if a == "arpo"} == {"soft", "hard", "hard_once"}


def test_paper_table_budget_and_estimate():
    """The paper table's sizes: 18 runs of one budget, each algorithm with its own toy config's settings (DAPO's
    token-level loss, not toy_grpo.yaml's), and a prior estimate under the hour (the issue allows 90 minutes)."""
    from agentenv.bench.runner import show_plan

    bench = load_bench_config(CONFIGS / "paper_table_toy.yaml", ["output_dir=/nonexistent/paper_table_toy"])
    runs = resolve_runs(bench)
    assert len(runs) == 18 and {r.seed for r in runs} == {0, 1, 2}
    c = runs[0].config
    assert (c.trainer.steps, c.trainer.tasks_per_step, c.algorithm_config.group_size) == (10, 4, 8)
    algo = {r.variant: r.config.algorithm_config for r in runs}
    assert algo["dapo"].loss_agg == "token_mean" and (algo["dapo"].clip_low, algo["dapo"].clip_high) == (0.2, 0.28)
    assert algo["reinforce_pp"].kl_coef == 0.01 and algo["grpo"].loss_agg == "seq_mean_token_mean"
    assert [algo[v].advantage for v in ("arpo_soft", "arpo_hard", "arpo_hard_once")] == ["soft", "hard", "hard_once"]
    text = show_plan(bench)
    minutes = float(text.rsplit("estimated wall time: ", 1)[1].split(" min")[0])
    assert 45 <= minutes <= 60, text
