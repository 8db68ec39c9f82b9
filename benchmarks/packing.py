"""The update on packed prefix trees against the unpacked rows, side by side in one process.

Real groups first: the tiny model grows them on the toy tasks with the run
config's tools (ARPO trees, and GRPO groups whose rows share only the prompt),
through the trainer's own rollout. Then, on the same rows and the same
micro-batches (`trainer.micro_batch_size` rows each, whole groups), the two
parts of a step that score sequences are timed, unpacked and packed
(`trainer.pack_prefixes`): the old-logprob recompute (forward, no gradient) and
the update (forward, the algorithm's loss, backward). Tokens: the rows' real
tokens; the positions the model computes unpacked (rows padded to the longest
of their micro-batch) and packed (packs padded to the longest pack). Each
timing is the median of `--repeats`, unpacked and packed alternating.

    python benchmarks/packing.py [--tasks 4] [--repeats 3] [--backend hf] [--only toy_arpo,paper_arpo,toy_grpo]

Workloads (the tiny model, the toy config's tasks and tools):
- toy_arpo: configs/toy_arpo.yaml (M = 8, N = 4, Z = 2, k = 10);
- paper_arpo: ARPO at the paper's M = 16, N = 8, k = 20, with toy_arpo's Z = 2 (one tree per micro-batch of 16);
- toy_grpo: configs/toy_grpo.yaml (G = 8), for comparison.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch

WORKLOADS = {
    "toy_arpo": ("configs/toy_arpo.yaml", []),
    "paper_arpo": (
        "configs/toy_arpo.yaml",
        ["algorithm.group_size=16", "algorithm.initial_rollouts=8", "algorithm.entropy_window=20"],
    ),
    "toy_grpo": ("configs/toy_grpo.yaml", []),
}


@dataclass
class Row:
    workload: str
    groups: int
    rows: int
    micro_batches: int
    tokens: int
    unpacked_positions: int
    packed_positions: int
    recompute_s: tuple[float, float]  # (unpacked, packed)
    update_s: tuple[float, float]


def sample_batch(name: str, tasks: int, backend: str):
    """Roll out `tasks` groups through the trainer of the workload's config; the trainer and the collated batch."""
    from agentenv.configs import load_config
    from agentenv.training.batching import collate
    from agentenv.training.trainer import Trainer

    path, extra = WORKLOADS[name]
    out = tempfile.mkdtemp(prefix=f"bench-packing-{name}-")
    cfg = load_config(path, extra + [f"policy.backend={backend}", f"trainer.output_dir={out}", "logging.progress=false",
                                     "logging.tensorboard=false"])  # fmt: skip
    trainer = Trainer(cfg)
    groups = trainer.run(trainer.rollouts.groups(trainer.stream.next_batch(tasks), 0, list(range(tasks))))
    trajs, advs = [], []
    for g in groups:
        trajs += g.trajectories
        advs += trainer.algorithm.advantages(g)
    return trainer, collate(trajs, advs, trainer.pad_id), len(groups)


def time_parts(trainer, batch, pack: bool) -> tuple[float, float]:
    """(recompute seconds, update seconds) over every micro-batch of the batch, packed or not."""
    from agentenv.training.batching import chunks
    from agentenv.training.scoring import sequence_logprobs

    trainer.updater.pack = pack
    model = trainer.unwrapped()
    model.eval()
    t0 = time.perf_counter()
    batch.old_logprobs = trainer.updater.recompute(batch, model)
    t1 = time.perf_counter()
    model.train()
    micro = chunks(len(batch), trainer.cfg.trainer.micro_batch_size)
    for s in micro:
        part = batch.select(s).trimmed()
        lp, _ = sequence_logprobs(model, part.input_ids, part.attention_mask, trainer.cfg.policy.temperature, pack=pack)
        loss, _ = trainer.algorithm.loss(part, lp)
        (loss / len(micro)).backward()
    t2 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    return t1 - t0, t2 - t1


def positions(batch, micro_batch_size: int) -> tuple[int, int, int]:
    """(real tokens, positions computed unpacked, positions computed packed)."""
    from agentenv.training.batching import chunks
    from agentenv.training.packing import plan_packing
    from agentenv.training.scoring import PACK_MIN_SAVING

    tokens = unpacked = packed = 0
    for s in chunks(len(batch), micro_batch_size):
        part = batch.select(s).trimmed()
        plan = plan_packing(part.input_ids, part.attention_mask)
        tokens += plan.tokens
        unpacked += part.input_ids.numel()
        packed += plan.input_ids.numel() if plan.saving >= PACK_MIN_SAVING else part.input_ids.numel()
    return tokens, unpacked, packed


def measure(name: str, tasks: int, repeats: int, backend: str) -> Row:
    trainer, batch, n_groups = sample_batch(name, tasks, backend)
    try:
        mb = trainer.cfg.trainer.micro_batch_size
        tokens, unpacked, packed = positions(batch, mb)
        time_parts(trainer, batch, False)  # warm-up
        times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(repeats):
            for pack in (False, True):
                times[pack].append(time_parts(trainer, batch, pack))
        med = {p: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for p, ts in times.items()}
        return Row(
            name, n_groups, len(batch), -(-len(batch) // mb), tokens, unpacked, packed,
            (med[False][0], med[True][0]), (med[False][1], med[True][1]),
        )  # fmt: skip
    finally:
        trainer.close()


def table(rows: list[Row]) -> str:
    head = ("workload | groups | rows | micro-batches | real tokens | positions unpacked | positions packed | "
            "recompute s unpacked | packed | x | update s unpacked | packed | x")  # fmt: skip
    lines = [f"| {head} |", "|" + "---|" * 2 + "---:|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r.workload} | {r.groups} | {r.rows} | {r.micro_batches} | {r.tokens} | {r.unpacked_positions} | "
            f"{r.packed_positions} ({r.packed_positions / r.unpacked_positions:.0%}) | "
            f"{r.recompute_s[0]:.2f} | {r.recompute_s[1]:.2f} | {r.recompute_s[0] / r.recompute_s[1]:.2f} | "
            f"{r.update_s[0]:.2f} | {r.update_s[1]:.2f} | {r.update_s[0] / r.update_s[1]:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=4, help="groups (tasks) per workload: the toy mini-batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", default="hf", help="the policy that grows the groups (hf or vllm)")
    ap.add_argument("--only", default=",".join(WORKLOADS))
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in args.only.split(","):
        rows.append(measure(name, args.tasks, args.repeats, args.backend))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\ntorch threads {torch.get_num_threads()}; {args.tasks} groups per workload; median of {args.repeats}\n")
    print(table(rows))


if __name__ == "__main__":
    main()
