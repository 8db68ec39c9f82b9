"""The table of the SmolLM2 SFT-then-RL recipe (docs/training/sft.md): held-out accuracy with 95% Wilson
intervals, tool calls per episode and wall time of each stage, from the `agentenv eval --out` reports.

    python3 benchmarks/sft_recipe.py --stage base=EVAL.json:SECONDS --stage sft=EVAL.json:SECONDS ...

SECONDS is the wall time of the stage (the training that made the model; 0 for the base model).
"""

from __future__ import annotations

import argparse
import json

from agentenv.bench.stats import wilson_interval


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", action="append", required=True, help="name=eval.json:seconds")
    args = ap.parse_args()
    print("| stage | held-out accuracy | 95% interval | tool calls / episode | policy tokens / episode | training wall time |")
    print("|---|---|---|---|---|---|")
    for item in args.stage:
        name, rest = item.split("=", 1)
        path, _, seconds = rest.rpartition(":")
        rep = json.loads(open(path).read())
        n = int(rep["n_samples"])  # every sample of every task
        iv = wilson_interval(round(rep["accuracy"] * n), n)
        wall = f"{float(seconds) / 60:.1f} min" if float(seconds) else "-"
        print(f"| {name} | {iv.mean:.3f} ({round(iv.mean * n)}/{n}) | [{iv.low:.3f}, {iv.high:.3f}] | "
              f"{rep['tool_calls']:.2f} | {rep['tokens']:.1f} | {wall} |")


if __name__ == "__main__":
    main()
