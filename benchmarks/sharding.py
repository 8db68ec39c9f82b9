"""Peak memory per process of ddp, fsdp2 and LoRA, and the time of one weight push, on two CPU processes.

For each model shape and strategy, `torchrun --nproc_per_node 2` (gloo) runs
the trainer's own sharding code (`agentenv.training.sharding.Strategy`): load
the model, wrap it (LoRA, sharding), build AdamW, take one update on a random
batch (forward, backward, clipping, optimizer step), then push the weights into
an hf rollout policy (`full_weights` -> `HFPolicy.load_weights`: gathered one
tensor at a time, LoRA merged). Memory is the process's peak resident set
(`ru_maxrss`) after the update, before the policy exists; the push is timed
alone (median of 3). Shapes: the tiny model, and a random-initialised Qwen2 of
about 0.2 B parameters.

    python benchmarks/sharding.py [--shapes tiny,qwen2-0.2b] [--seq 256]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    # hidden, layers, intermediate, heads, kv heads, vocab
    "qwen2-0.2b": dict(hidden_size=1024, num_hidden_layers=12, intermediate_size=2816, num_attention_heads=16,
                       num_key_value_heads=4, vocab_size=32000, head_dim=64),
}  # fmt: skip
STRATEGIES = {"ddp": ("ddp", 0), "fsdp2": ("fsdp2", 0), "ddp+lora": ("ddp", 16), "fsdp2+lora": ("fsdp2", 16)}


def worker(shape: str, strategy: str, seq: int, out: Path) -> None:
    import torch
    from accelerate import Accelerator
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentenv.configs import LoraConfig
    from agentenv.policies.config import HFPolicyConfig
    from agentenv.policies.hf import HFPolicy
    from agentenv.policies.models import resolve_model_path
    from agentenv.training import sharding

    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    name, r = STRATEGIES[strategy]
    if shape == "tiny":
        path = resolve_model_path("tiny")
        make = lambda: AutoModelForCausalLM.from_pretrained(path)  # noqa: E731
    else:
        config = AutoConfig.for_model("qwen2", tie_word_embeddings=False, **SHAPES[shape])
        make = lambda: AutoModelForCausalLM.from_config(config)  # noqa: E731
    model = make()
    n_params = sum(p.numel() for p in model.parameters())
    strat = sharding.Strategy(acc, name, LoraConfig(r=r, alpha=2 * r if r else 16.0))
    model, opt, _ = strat.prepare(
        model, lambda ps: torch.optim.AdamW(ps, lr=1e-4), lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda u: 1.0)
    )
    vocab = acc.unwrap_model(model).config.vocab_size
    ids = torch.randint(0, vocab, (4, seq))
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    acc.backward(loss)
    strat.clip_grad_norm_(model, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    step_s = time.perf_counter() - t0
    peak_train = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny"))  # the policy only needs its EOS ids here
    policy = HFPolicy(HFPolicyConfig(model="unused", device="cpu"), model=make(), tokenizer=tokenizer)
    pushes = []
    for _ in range(3):
        acc.wait_for_everyone()
        t0 = time.perf_counter()
        policy.load_weights(sharding.full_weights(acc.unwrap_model(model)))
        pushes.append(time.perf_counter() - t0)
    rec = {"params": n_params, "peak_mib": peak_train, "step_s": step_s, "push_s": sorted(pushes)[1]}
    (out / f"rank{acc.process_index}.json").write_text(json.dumps(rec))


def run(shape: str, strategy: str, seq: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(port), __file__, "--worker", shape, strategy, str(seq), tmp]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            raise RuntimeError(f"{shape}/{strategy} failed:\n{proc.stderr[-3000:]}")
        ranks = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))]
    return {
        "params": ranks[0]["params"],
        "peak_mib": max(r["peak_mib"] for r in ranks),
        "step_s": max(r["step_s"] for r in ranks),
        "push_s": max(r["push_s"] for r in ranks),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="tiny,qwen2-0.2b")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--worker", nargs=4)
    args = ap.parse_args()
    if args.worker:
        shape, strategy, seq, out = args.worker
        worker(shape, strategy, int(seq), Path(out))
        return
    print(f"two CPU processes (gloo), batch 4 x {args.seq} tokens, fp32; peak RSS per process after one update")
    print(f"{'model':<12} {'params':>8} {'strategy':<11} {'peak MiB':>9} {'update s':>9} {'push s':>8}")
    for shape in args.shapes.split(","):
        for strategy in STRATEGIES:
            r = run(shape, strategy, args.seq)
            print(f"{shape:<12} {r['params'] / 1e6:>7.1f}M {strategy:<11} {r['peak_mib']:>9.0f} {r['step_s']:>9.2f} "
                  f"{r['push_s']:>8.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
