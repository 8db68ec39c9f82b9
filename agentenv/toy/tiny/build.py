"""Build the tiny model once and cache it: tokenizer, SFT traces, SFT, held-out score."""

from __future__ import annotations

import asyncio
import json
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentenv.cache import build_once
from agentenv.loader import build_dataclass
from agentenv.toy.tiny.config import BUILD_VERSION, TinyBuildConfig, cache_root

KINDS = ("arith", "twohop", "both")


def _log(msg: str) -> None:
    print(f"[tiny] {msg}", file=sys.stderr, flush=True)


def sft_toy_config(cfg: TinyBuildConfig) -> Any:
    """The toy suite the SFT traces come from: train split only, knowledge base scaled by `kb_scale`."""
    from agentenv.toy.tasks import ToyConfig

    return ToyConfig(
        seed=cfg.seed,
        n_arith_train=cfg.n_train_arith,
        n_twohop_train=cfg.n_train_twohop,
        n_both_train=cfg.n_train_both,
        n_arith_heldout=0,
        n_twohop_heldout=0,
        n_both_heldout=0,
    ).with_kb_scale(cfg.kb_scale)


def tiny_dir(cfg: TinyBuildConfig | None = None) -> Path:
    """Where the build of `cfg` lives (whether or not it is built yet)."""
    cfg = cfg or TinyBuildConfig()
    return cache_root() / "tiny" / cfg.cache_key()


SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
"""The default build as shipped with the package (`agentenv tiny build --force` made it; its
`build_info.json` says where and how), so every machine starts from the same weights."""


def _is_built(path: Path) -> bool:
    return (path / "build_info.json").is_file() and (path / "config.json").is_file()


def shipped_key() -> str | None:
    """The cache key of the shipped build, or None when the package ships none."""
    info = SHIPPED_DIR / "build_info.json"
    return json.loads(info.read_text())["cache_key"] if info.is_file() else None


def _copy_shipped(tmp: Path) -> None:
    for f in SHIPPED_DIR.iterdir():
        if f.is_file():
            shutil.copyfile(f, tmp / f.name)


def ensure_tiny_model(force: bool = False, log: Callable[[str], None] = _log, **overrides: Any) -> Path:
    """The cached tiny model's folder: the shipped weights, or a build, made once.

    A config whose cache key is the shipped build's (the default) is copied
    from the package; any other config, or `force`, is built here (minutes).
    Safe across processes: one builds under a file lock, the others wait and
    then reuse its result.

    Args:
        force: Build here even if a build or the shipped weights exist.
        log: Progress sink (default: stderr).
        **overrides: Fields of `TinyBuildConfig` to change.

    Returns:
        A `save_pretrained` folder (model, tokenizer, `build_info.json`).
    """
    cfg = build_dataclass(TinyBuildConfig, overrides, "tiny")
    final = tiny_dir(cfg)
    if _is_built(final) and not force:
        return final
    shipped = not force and shipped_key() == cfg.cache_key()
    build_once(
        final,
        _copy_shipped if shipped else lambda tmp: build_tiny_model(tmp, cfg, log=log),
        force=force,
        on_wait=lambda: log(f"waiting for another process building the tiny model ({final})"),
    )
    log(f"tiny model ready at {final}" + (" (the shipped weights)" if shipped else ""))
    return final


def _tokenizer_dir(cfg: TinyBuildConfig) -> Path:
    return cache_root() / "tiny" / f"tokenizer-{cfg.tokenizer_key()}"


def load_tiny_tokenizer(**overrides: Any) -> Any:
    """The tiny model's tokenizer, without building the model.

    Reads it from the built model when there is one, else trains it (a couple
    of seconds, deterministic) and caches it.

    Returns:
        A `PreTrainedTokenizerFast` with the ChatML chat template.
    """
    from transformers import PreTrainedTokenizerFast

    cfg = build_dataclass(TinyBuildConfig, overrides, "tiny")
    built = tiny_dir(cfg)
    if _is_built(built):
        return PreTrainedTokenizerFast.from_pretrained(built)
    return _cached_tokenizer(cfg)


def _cached_tokenizer(cfg: TinyBuildConfig) -> Any:
    from transformers import PreTrainedTokenizerFast

    from agentenv.toy.tiny.tokenizer import train_tokenizer

    path = build_once(_tokenizer_dir(cfg), lambda tmp: train_tokenizer(cfg.seed, cfg.vocab_size).save_pretrained(tmp))
    return PreTrainedTokenizerFast.from_pretrained(path)


def build_tiny_model(out_dir: str | Path, cfg: TinyBuildConfig | None = None, log: Callable[[str], None] = _log) -> dict:
    """Build the tiny model into `out_dir` (no cache, no lock).

    Steps: tokenizer; toy tasks and corpus; SFT traces through the real env and
    tools; cold-start SFT; save; held-out evaluation (greedy and sampled at `eval_temperature`).

    Returns:
        The build info, also written to `out_dir/build_info.json`.
    """
    import torch

    from agentenv.toy.tasks import ToyConfig, build_toy_suite
    from agentenv.toy.tiny.sft import init_model, train_sft
    from agentenv.toy.tiny.traces import make_tools, make_traces_async, pick_estimates

    cfg = cfg or TinyBuildConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t_start, cpu_start = time.perf_counter(), time.process_time()
    times: dict[str, float] = {}

    def lap(name: str, t: float) -> float:
        times[name] = round(time.perf_counter() - t, 1)
        return time.perf_counter()

    try:
        log(f"building the tiny model (key {cfg.cache_key()}) into {out}")
        t = time.perf_counter()
        tokenizer = _cached_tokenizer(cfg)
        t = lap("tokenizer_s", t)
        log(f"tokenizer: {len(tokenizer)} tokens ({times['tokenizer_s']}s)")

        # SFT data: a toy suite with a larger knowledge base (its own corpus); held-out score: the
        # default suite's held-out split over the default corpus, which is what RL evaluates on.
        sft_suite = build_toy_suite(sft_toy_config(cfg))
        eval_suite = build_toy_suite(
            ToyConfig(seed=cfg.seed, n_arith_train=0, n_twohop_train=0, n_both_train=0,
                      n_arith_heldout=cfg.n_heldout, n_twohop_heldout=cfg.n_heldout, n_both_heldout=cfg.n_heldout)
        )  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="agentenv-tiny-corpus-") as corpus_dir:
            sft_tools = make_tools(sft_suite.write_corpus(Path(corpus_dir) / "sft_corpus.jsonl"), cfg.search_k)
            eval_tools = make_tools(eval_suite.write_corpus(Path(corpus_dir) / "toy_corpus.jsonl"), cfg.search_k)
            env_kw = {"max_result_tokens": cfg.max_result_tokens, "max_context_tokens": cfg.max_context_tokens}
            estimates = pick_estimates(sft_suite.train, cfg.estimate_share, cfg.seed)
            traces, dropped = asyncio.run(
                make_traces_async(sft_suite.train, sft_tools, tokenizer, **env_kw, estimate_ids=estimates)
            )
            t = lap("traces_s", t)
            by_kind = {k: sum(tr.kind == k for tr in traces) for k in KINDS}
            n_est = sum(tr.estimate for tr in traces)
            n_tok = sum(len(tr) for tr in traces)
            log(
                f"traces: {len(traces)} kept {by_kind} ({n_est} arith without the tool), {dropped} dropped, "
                f"{n_tok} tokens ({times['traces_s']}s)"
            )

            model, hooks = init_model(cfg, tokenizer)
            n_params = sum(p.numel() for p in model.parameters())
            log(f"model: Qwen2 {cfg.num_layers}x{cfg.hidden_size}, {n_params / 1e6:.2f}M parameters")
            sft = train_sft(model, traces, cfg, tokenizer.pad_token_id, log=log)
            for h in hooks:
                h.remove()
            t = lap("sft_s", t)

            model.save_pretrained(out, safe_serialization=True)
            tokenizer.save_pretrained(out)
            t = lap("save_s", t)

            log(f"held-out evaluation (greedy and T={cfg.eval_temperature:g}) with the real tools ...")
            scores = asyncio.run(_evaluate(model, tokenizer, eval_suite.heldout, eval_tools, cfg))
            t = lap("eval_s", t)
        for mode, res in scores.items():
            acc = ", ".join(f"{k} {res['accuracy'].get(k, 0.0):.0%}" for k in KINDS)
            log(f"held-out accuracy ({mode}): {acc}")
        info = {
            "build_version": BUILD_VERSION,
            "cache_key": cfg.cache_key(),
            "config": {k: v for k, v in cfg.__dict__.items()},
            "params": n_params,
            "vocab_size": len(tokenizer),
            "traces": {"kept": by_kind, "estimates": n_est, "dropped": dropped, "tokens": n_tok},
            "sft": sft,
            "heldout": scores,
            "env": {
                "search_k": cfg.search_k,
                "max_result_tokens": cfg.max_result_tokens,
                "max_context_tokens": cfg.eval_context_tokens,
                "max_turn_tokens": cfg.eval_max_tokens,
                "sampled_temperature": cfg.eval_temperature,
            },
            "times_s": times,
            "build_seconds": round(time.perf_counter() - t_start, 1),
            "cpu_seconds": round(time.process_time() - cpu_start, 1),
            "torch_threads": torch.get_num_threads(),
            "versions": {"torch": torch.__version__, "python": platform.python_version()},
        }
        (out / "build_info.json").write_text(json.dumps(info, indent=2))
        log(f"built in {info['build_seconds']}s wall, {info['cpu_seconds']}s CPU")
        return info
    finally:
        torch.set_num_threads(threads_before)


async def _evaluate(model: Any, tokenizer: Any, heldout: list, tools: list, cfg: TinyBuildConfig) -> dict[str, Any]:
    from agentenv.policies.hf import HFPolicy, HFPolicyConfig
    from agentenv.toy.tiny.evaluate import evaluate_policy

    policy = HFPolicy(HFPolicyConfig(model="<in-memory>", device="cpu", max_batch_size=64), model, tokenizer)
    kw = {
        "max_turn_tokens": cfg.eval_max_tokens,
        "max_result_tokens": cfg.max_result_tokens,
        "max_context_tokens": cfg.eval_context_tokens,
        "seed": cfg.seed,
    }
    greedy, sampled = await asyncio.gather(
        evaluate_policy(policy, heldout, tools, tokenizer, temperature=0.0, **kw),
        evaluate_policy(policy, heldout, tools, tokenizer, temperature=cfg.eval_temperature, **kw),
    )
    return {"greedy": greedy, "sampled": sampled}
