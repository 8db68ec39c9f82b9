"""`python -m agentenv.toy.tiny [--force] [--out DIR] [field=value ...]`: build the tiny model."""

from __future__ import annotations

import argparse
import json

from agentenv.loader import build_dataclass, field_overrides
from agentenv.toy.tiny.build import build_tiny_model, ensure_tiny_model
from agentenv.toy.tiny.config import TinyBuildConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentenv.toy.tiny", description=__doc__)
    parser.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    parser.add_argument("--out", help="build into this folder instead of the cache")
    parser.add_argument("overrides", nargs="*", help="TinyBuildConfig fields, e.g. sft_steps=200")
    args = parser.parse_args(argv)
    overrides = field_overrides(args.overrides)
    if args.out:
        info = build_tiny_model(args.out, build_dataclass(TinyBuildConfig, overrides, "tiny"))
        print(args.out)
    else:
        path = ensure_tiny_model(force=args.force, **overrides)
        info = json.loads((path / "build_info.json").read_text())
        print(path)
    acc = {mode: res["accuracy"] for mode, res in info["heldout"].items()}
    print(json.dumps({"params": info["params"], "build_seconds": info["build_seconds"], "heldout_accuracy": acc}))


if __name__ == "__main__":
    main()
