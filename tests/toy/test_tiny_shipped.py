"""The tiny model is the same on every machine: its weights ship with the package, and a build here reproduces
their held-out numbers.

The shipped folder was made by `agentenv tiny build --force` (its build_info.json
says where). A config with the shipped cache key gets those weights copied, not
built; the slow test builds the model afresh and compares the held-out numbers.
"""

from __future__ import annotations

import json

import pytest

from agentenv.toy.tiny import TinyBuildConfig
from agentenv.toy.tiny.build import SHIPPED_DIR, build_tiny_model, ensure_tiny_model, shipped_key, tiny_dir


def test_the_shipped_weights_are_the_default_build():
    # A change of the toy data or the build changes the key: then ship a new build.
    assert shipped_key() == TinyBuildConfig().cache_key()
    info = json.loads((SHIPPED_DIR / "build_info.json").read_text())
    assert info["params"] == 2_890_496 and (SHIPPED_DIR / "model.safetensors").stat().st_size > 10_000_000


def test_a_fresh_cache_gets_the_shipped_weights_without_a_build(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path))
    said = []
    path = ensure_tiny_model(log=said.append)
    assert path.parent.parent == tmp_path and said == [f"tiny model ready at {path} (the shipped weights)"]
    for f in SHIPPED_DIR.iterdir():
        assert (path / f.name).read_bytes() == f.read_bytes(), f.name
    assert shipped_key() != TinyBuildConfig(seed=1).cache_key()  # another config is built, not copied
    assert tiny_dir(TinyBuildConfig(seed=1)) != path


@pytest.mark.slow
def test_a_fresh_build_reproduces_the_shipped_models_numbers(tmp_path):
    """Minutes: the whole build (SFT and held-out evaluation) into a temporary folder: the same config (cache key)
    and a model that learned every kind. Not the shipped numbers: a CPU whose kernels sum in another order (AVX2
    vs AVX-512, another thread count) trains other weights, and the SFT amplifies the difference into a model
    whose accuracies differ by more than sampling noise (an AVX2 build: greedy arith/both/twohop 73/23/47% against
    the shipped 70/10/17%). Bits equal to the shipped ones only where the kernels are the same (printed)."""
    built = build_tiny_model(tmp_path / "tiny", TinyBuildConfig(), log=lambda m: None)
    shipped = json.loads((SHIPPED_DIR / "build_info.json").read_text())
    assert built["cache_key"] == shipped["cache_key"]
    assert built["heldout"]["greedy"]["n"] == shipped["heldout"]["greedy"]["n"]
    greedy = built["heldout"]["greedy"]
    # an untrained model solves none: every kind solved at least once, and all together at least half the shipped
    # build's rate (29 of 90; the AVX2 build: 43 of 90)
    solved = {kind: round(acc * greedy["n"][kind]) for kind, acc in greedy["accuracy"].items()}
    assert all(n >= 1 for n in solved.values()), built["heldout"]
    shipped_solved = sum(acc * shipped["heldout"]["greedy"]["n"][k] for k, acc in shipped["heldout"]["greedy"]["accuracy"].items())
    assert sum(solved.values()) >= shipped_solved / 2, built["heldout"]
    from safetensors.torch import load_file

    mine, theirs = load_file(tmp_path / "tiny" / "model.safetensors"), load_file(SHIPPED_DIR / "model.safetensors")
    assert mine.keys() == theirs.keys() and all(mine[k].shape == theirs[k].shape for k in theirs)
    drift = max(float((mine[k] - theirs[k]).abs().max()) for k in theirs)
    print(f"largest weight difference from the shipped build: {drift:.3g}")  # 0 where the kernels are the same
