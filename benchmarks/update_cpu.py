"""The toy ARPO step's CPU work (old-logprob recompute and update), before and after, side by side in one process.

One step of configs/toy_arpo.yaml's shape on the tiny model: `--tasks` groups
of M = 8 rows (N = 4 roots of a shared prompt, 4 branches forked from them,
at most 512 tokens: the toy runs' lengths), split into mini-batches of
`trainer.mini_batch_tasks` groups and micro-batches of
`trainer.micro_batch_size` rows, packed into prefix trees as the trainer packs
them. The rows are synthetic (seeded), so every machine times the same work.

- before: the recompute scores every row, and both it and the update compute
  each position's entropy, which nothing reads (`sequence_logprobs`);
- after: the trainer's path now: logprobs only (`token_logprobs`), and the
  first mini-batch's forward supplies its rows' old logprobs (no optimizer step
  has run yet), so the recompute scores the other mini-batches' rows only.

Each variant's phases are timed (median of `--repeats`, the variants
alternating, from the same weights and a fresh AdamW each time). Achieved
FLOP/s: the model's FLOPs on the positions it computes (linear layers and
attention at 2 per multiply-add; backward twice the forward) over the time.
The matmul bound: the same GEMMs (every linear layer's forward and two
backward products, the attention's score and value products, at the same
shapes) run as plain `torch.mm`/`torch.bmm` on this CPU; "of bound" is their
time over the variant's. Machine load moves every number; the ratios come
from one process.

    python benchmarks/update_cpu.py [--tasks 8] [--mini-batch-tasks 4] [--repeats 3] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

MAX_TOKENS = 512  # configs/toy_arpo.yaml: env.max_context_tokens
PROMPT = 90  # the toy prompt's tokens (system prompt and question)


def tree_rows(tasks: int, vocab: int, seed: int = 0, m: int = 8, n: int = 4) -> list[np.ndarray]:
    """`tasks` ARPO groups: n roots of one prompt, m - n branches forked from them at a random point."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(tasks):
        prompt = rng.integers(3, vocab, PROMPT)
        roots = [np.concatenate([prompt, rng.integers(3, vocab, int(rng.integers(120, 420)))]) for _ in range(n)]
        rows += roots
        for k in range(m - n):
            base = roots[k % n]
            cut = int(rng.integers(PROMPT + 20, len(base) - 10))
            rows.append(np.concatenate([base[:cut], rng.integers(3, vocab, int(rng.integers(40, max(41, MAX_TOKENS - cut))))]))
    return rows


def make_batch(rows: list[np.ndarray], seed: int = 0):
    from agentenv.algorithms.base import TrainBatch

    B, L = len(rows), max(map(len, rows))
    ids = torch.zeros(B, L, dtype=torch.long)
    att = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros(B, L - 1)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.from_numpy(r)
        att[i, : len(r)] = 1
        mask[i, PROMPT - 1 : len(r) - 1] = 1.0  # the prompt is not the policy's
    g = torch.Generator().manual_seed(seed)
    adv = (torch.randn(B, 1, generator=g) * mask).contiguous()
    zeros = torch.zeros(B, L - 1)
    return TrainBatch(input_ids=ids, attention_mask=att, loss_mask=mask, advantages=adv, old_logprobs=zeros.clone(),
                      sampler_logprobs=zeros)  # fmt: skip


@dataclass
class Shapes:
    """The GEMMs of one pass over a micro-batch: (m, k, n) per product, and batched (b, m, k, n) ones."""

    mm: list[tuple[int, int, int]]
    bmm: list[tuple[int, int, int, int]]

    def flops(self) -> float:
        return 2.0 * (sum(m * k * n for m, k, n in self.mm) + sum(b * m * k * n for b, m, k, n in self.bmm))


def forward_shapes(cfg, seqs: int, length: int) -> Shapes:
    """A forward over `seqs` sequences of `length` positions (packs or padded rows)."""
    h, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    t = seqs * length
    layer = [(t, h, heads * d), (t, h, kv * d), (t, h, kv * d), (t, heads * d, h), (t, h, f), (t, h, f), (t, f, h)]
    mm = layer * cfg.num_hidden_layers + [(t, h, v)]
    bmm = [(seqs * heads, length, d, length), (seqs * heads, length, length, d)] * cfg.num_hidden_layers
    return Shapes(mm, bmm)


def backward_shapes(fwd: Shapes) -> Shapes:
    """Each product's two gradients: dX = dY W^T and dW = X^T dY (same FLOPs, other shapes)."""
    mm = [s for m, k, n in fwd.mm for s in ((m, n, k), (k, m, n))]
    bmm = [s for b, m, k, n in fwd.bmm for s in ((b, m, n, k), (b, k, m, n))]
    return Shapes(mm, bmm)


class MatmulBound:
    """Seconds this CPU takes for given GEMMs as plain torch.mm / torch.bmm (each shape timed once, cached)."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[int, ...], float] = {}

    def _time(self, shape: tuple[int, ...]) -> float:
        if shape not in self.seconds:
            if len(shape) == 3:
                m, k, n = shape
                a, b = torch.randn(m, k), torch.randn(k, n)
                run = lambda: torch.mm(a, b)  # noqa: E731
            else:
                bs, m, k, n = shape
                a, b = torch.randn(bs, m, k), torch.randn(bs, k, n)
                run = lambda: torch.bmm(a, b)  # noqa: E731
            run()
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            self.seconds[shape] = min(times)
        return self.seconds[shape]

    def of(self, shapes: Shapes) -> float:
        return sum(self._time(s) for s in shapes.mm) + sum(self._time(s) for s in shapes.bmm)


def passes(batch, micro: int, pack: bool):
    """(sequences, length) of each micro-batch's forward, as the trainer computes it (packed when it saves)."""
    from agentenv.training.batching import chunks
    from agentenv.training.packing import plan_packing
    from agentenv.training.scoring import PACK_MIN_SAVING

    out = []
    for s in chunks(len(batch), micro):
        part = batch.select(s).trimmed()
        plan = plan_packing(part.input_ids, part.attention_mask) if pack else None
        if plan is not None and plan.saving >= PACK_MIN_SAVING:
            out.append(tuple(plan.input_ids.shape))
        else:
            out.append(tuple(part.input_ids.shape))
    return out


def run_step(model, alg, batch, mb_rows: list[torch.Tensor], micro: int, temperature: float, after: bool) -> dict[str, float]:
    """One step's recompute and update; seconds per phase."""
    from agentenv.algorithms.base import LossNorm
    from agentenv.training.batching import chunks
    from agentenv.training.scoring import sequence_logprobs, token_logprobs

    def score(part):
        if after:
            return token_logprobs(model, part.input_ids, part.attention_mask, temperature, pack=True)
        return sequence_logprobs(model, part.input_ids, part.attention_mask, temperature, pack=True)[0]

    opt = torch.optim.AdamW(model.parameters(), lr=3e-5)
    t0 = time.perf_counter()
    model.eval()
    recompute = torch.cat([torch.arange(0), *mb_rows[1:]]).long() if after else torch.arange(len(batch))
    with torch.no_grad():
        for s in chunks(len(recompute), micro):
            rows = recompute[s]
            part = batch.select(rows).trimmed()
            lp = score(part)
            batch.old_logprobs[rows, : lp.shape[1]] = lp * part.loss_mask
    t1 = time.perf_counter()
    model.train()
    for i, rows in enumerate(mb_rows):
        mb = batch.select(rows)
        norm = LossNorm.of(mb.loss_mask)
        for s in chunks(len(mb), micro):
            part = mb.select(s).trimmed()
            lp = score(part)
            if after and i == 0:
                part.old_logprobs = lp.detach() * part.loss_mask
            loss, _ = alg.loss(part, lp, norm=norm)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    t2 = time.perf_counter()
    return {"recompute_s": t1 - t0, "update_s": t2 - t1, "step_s": t2 - t0}


def main() -> None:
    from transformers import AutoModelForCausalLM

    from agentenv.algorithms import get_algorithm
    from agentenv.configs import load_config
    from agentenv.policies.models import resolve_model_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=8, help="groups in the step (configs/toy_arpo.yaml: 8)")
    ap.add_argument("--mini-batch-tasks", type=int, default=0, help="groups per mini-batch (0: the config's, 4)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config("configs/toy_arpo.yaml", [])
    tc = cfg.trainer
    alg = get_algorithm(cfg.algorithm.name)(cfg.algorithm_config)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(cfg.model.path), dtype=torch.float32)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    batch = make_batch(tree_rows(args.tasks, model.config.vocab_size))
    m = cfg.algorithm_config.group_size
    per_mb = (args.mini_batch_tasks or tc.mini_batch_tasks) * m
    mb_rows = [torch.arange(i, min(i + per_mb, len(batch))) for i in range(0, len(batch), per_mb)]

    # FLOPs and the matmul bound of what each variant computes: forwards with no gradient, then forward + backward
    bound = MatmulBound()
    fwd_all = [forward_shapes(model.config, r, p) for r, p in passes(batch, tc.micro_batch_size, True)]
    fwd_rest = [forward_shapes(model.config, r, p) for r, p in passes(batch.select(torch.cat(mb_rows[1:])), tc.micro_batch_size, True)] if len(mb_rows) > 1 else []  # noqa: E501
    upd = [s for rows in mb_rows for s in (forward_shapes(model.config, r, p) for r, p in passes(batch.select(rows), tc.micro_batch_size, True))]  # noqa: E501
    work = {}
    for name, rec in (("before", fwd_all), ("after", fwd_rest)):
        gemms = rec + upd + [backward_shapes(s) for s in upd]
        work[name] = (sum(s.flops() for s in gemms), sum(bound.of(s) for s in gemms))

    times: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(args.repeats + 1):  # the first round warms up
        for name in ("before", "after"):
            model.load_state_dict(start)
            t = run_step(model, alg, batch, mb_rows, tc.micro_batch_size, cfg.policy.temperature, after=name == "after")
            if r:
                times[name].append(t)
    med = {n: {k: statistics.median(t[k] for t in ts) for k in ts[0]} for n, ts in times.items()}

    tokens = int(batch.attention_mask.sum())
    print(f"toy ARPO step: {args.tasks} groups, {len(batch)} rows, {tokens} tokens, {len(mb_rows)} mini-batches of "
          f"{per_mb} rows, micro-batches of {tc.micro_batch_size}; torch threads {torch.get_num_threads()}, "
          f"ATen CPU capability {torch.backends.cpu.get_cpu_capability()}; median of {args.repeats}\n")  # fmt: skip
    print("| variant | recompute s | update s | step s | GFLOP | GFLOP/s | matmul bound s | of bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("before", "after"):
        t, (flops, mm_s) = med[name], work[name]
        print(f"| {name} | {t['recompute_s']:.2f} | {t['update_s']:.2f} | {t['step_s']:.2f} | {flops / 1e9:.1f} | "
              f"{flops / t['step_s'] / 1e9:.1f} | {mm_s:.2f} | {mm_s / t['step_s']:.0%} |")  # fmt: skip
    b, a = med["before"], med["after"]
    print(f"\nafter / before: step {b['step_s'] / a['step_s']:.2f}x faster (recompute "
          f"{b['recompute_s'] / max(a['recompute_s'], 1e-9):.2f}x, update {b['update_s'] / a['update_s']:.2f}x)")


if __name__ == "__main__":
    main()
