"""Benchmark configs: variants merged over the base, overrides routed, the shared budget enforced."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentenv.bench.config import bench_config_from_dict, deep_merge, expand_dotted, load_bench_config, resolve_runs
from agentenv.errors import ConfigError

RAW = {
    "name": "t",
    "output_dir": "OUT",
    "seeds": [3, 5],
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
    assert [(r.variant, r.seed) for r in runs] == [(v, s) for v in ("std", "dr", "dotted") for s in (3, 5)]
    by = {(r.variant, r.seed): r for r in runs}
    dr = by["dr", 5].config
    assert dr.algorithm_config.normalize_std is False and dr.trainer.lr == 0.02
    assert dr.algorithm_config.group_size == 4  # inherited from base
    assert dr.trainer.seed == 5
    assert Path(dr.trainer.output_dir) == tmp_path / "runs" / "dr" / "seed5"
    assert by["dotted", 3].config.algorithm_config.clip_high == 0.3
    assert by["std", 3].config.trainer.lr == 0.01


def test_cli_overrides_go_to_runs_or_to_the_benchmark():
    bench = bench_config_from_dict(RAW, ["trainer.steps=1", "seeds=[7]", "variants.std.trainer.lr=0.5"])
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
        bench_config_from_dict({**RAW, "seeds": [1, 1]})
    with pytest.raises(ConfigError, match="variants"):
        bench_config_from_dict({**RAW, "variants": {}})


def test_base_path_is_relative_to_the_benchmark_file(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"trainer": {"steps": 2}, "algorithm": {"group_size": 4}}))
    sub = tmp_path / "bench"
    sub.mkdir()
    (sub / "b.yaml").write_text(
        yaml.safe_dump({"base": "../run.yaml", "variants": {"g": {}}, "output_dir": str(tmp_path / "o")})
    )
    bench = load_bench_config(sub / "b.yaml", ["base.trainer.lr=0.3"])
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
