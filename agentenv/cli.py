"""The `agentenv` command: sft, train, eval, export, bench, view, tiny, sandbox."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

from agentenv.errors import AgentEnvError, ConfigError, InfraError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Train tool-using LLM agents with RL.")
tiny_app = typer.Typer(no_args_is_help=True, help="The embedded tiny model.")
sandbox_app = typer.Typer(no_args_is_help=True, help="The Docker Python sandbox.")
app.add_typer(tiny_app, name="tiny")
app.add_typer(sandbox_app, name="sandbox")


def _fail(e: Exception, code: int | None = None, *, say: bool = True) -> None:
    """One line on stderr (unless `say` is False: another process says it) and an exit code: 2 for a bad config,
    1 for anything else we raised on purpose."""
    if say:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code if code is not None else 2 if isinstance(e, ConfigError) else 1)


def _load(config: Path, overrides: list[str]):
    from agentenv.configs import load_config

    try:
        return load_config(config, overrides)
    except ConfigError as e:
        _fail(e)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
    config: Path = typer.Argument(..., help="YAML run config, e.g. configs/toy_arpo.yaml"),
    overrides: list[str] | None = typer.Argument(None, help="dotted.key=value overrides"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in trainer.output_dir."),
) -> None:
    """Train with the algorithm the config names."""
    cfg = _load(config, overrides or [])
    from agentenv.training.batches import refuse_async_world
    from agentenv.training.trainer import Trainer

    try:  # before any process loads anything; under torchrun every process refuses, rank 0 says why
        refuse_async_world(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as e:
        _fail(e, say=os.environ.get("RANK", "0") == "0")
    try:
        result = Trainer(cfg, resume=resume).train()
    except AgentEnvError as e:  # a bad config (exit 2), an infrastructure fault or a stopped run (exit 1)
        _fail(e)
    rep, start = result.final_eval, result.initial_eval
    if rep is not None:
        out = {"output_dir": str(result.output_dir), "heldout_accuracy": rep.accuracy, "by_kind": rep.by_kind}
        if start is not None:  # the same held-out tasks and sampling seeds before the first step
            out.update(heldout_accuracy_at_start=start.accuracy, by_kind_at_start=start.by_kind)
        typer.echo(json.dumps(out, indent=1))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def sft(
    config: Path = typer.Argument(..., help="YAML run config with an `sft` section, e.g. configs/smollm2_sft_grpo.yaml"),
    overrides: list[str] | None = typer.Argument(None, help="dotted.key=value overrides"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in sft.output_dir."),
) -> None:
    """Cold-start SFT on tool-use conversations (the RL loss mask); exports sft.output_dir/model for `train`."""
    cfg = _load(config, overrides or [])
    from agentenv.training.sft import SFTTrainer

    try:
        result = SFTTrainer(cfg, resume=resume).train()
    except AgentEnvError as e:
        _fail(e)
    typer.echo(json.dumps({"output_dir": str(result.output_dir), "model": str(result.model_dir), **result.metrics},
                          indent=1))  # fmt: skip


@app.command("eval")
def eval_(
    config: Path = typer.Argument(..., help="YAML run config (its env and tasks are used)."),
    overrides: list[str] | None = typer.Argument(None, help="dotted.key=value overrides"),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", help="A checkpoint dir (step_*/ or its model/), or a model dir. Default: the config's model."
    ),
    samples: int | None = typer.Option(None, help="Samples per task (k of pass@k); default trainer.eval_samples."),
    tasks: int | None = typer.Option(None, help="Held-out tasks to use; default trainer.eval_tasks."),
    out: Path | None = typer.Option(None, help="Write the report as JSON here."),
) -> None:
    """Evaluate a checkpoint on held-out tasks: accuracy, pass@k, tool calls and tokens per task."""
    cfg = _load(config, overrides or [])
    import asyncio

    from agentenv.policies.models import resolve_model_path
    from agentenv.tasks.task import balanced_subset
    from agentenv.training.build import build_runtime
    from agentenv.training.evaluate import evaluate

    if checkpoint is not None:
        model_path = str(checkpoint / "model" if (checkpoint / "model").is_dir() else checkpoint)
        if any((checkpoint / d).is_dir() for d in ("sharded", "adapter")):
            _fail(ConfigError("--checkpoint", f"{checkpoint} is sharded or LoRA: `agentenv export {checkpoint} --out DIR`, "
                                              "then --checkpoint DIR"))
        if not Path(model_path, "config.json").exists():
            _fail(ConfigError("--checkpoint", f"{checkpoint} holds no model (no config.json in it or in its model/)"))
    else:
        try:
            model_path = resolve_model_path(cfg.model.path)
        except ConfigError as e:
            _fail(e)
    if out is not None:  # checked before minutes of evaluation, not after
        if out.is_dir():
            _fail(ConfigError("--out", f"{out} is a directory; give a file path such as {out / 'eval.json'}"))
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            _fail(ConfigError("--out", f"cannot create the folder of {out}: {e}"))
    tc = cfg.trainer
    n_samples = samples or tc.eval_samples
    temperature = tc.eval_temperature if n_samples == 1 else (tc.eval_temperature or cfg.policy.temperature)
    params = cfg.policy.sampling_params(temperature=temperature)

    async def go():
        rt = build_runtime(cfg, model_path)
        try:
            heldout = balanced_subset(rt.tasks.heldout, tasks or tc.eval_tasks)
            if not heldout:
                raise ConfigError("env.tasks.eval_path", "no held-out tasks to evaluate on")
            await rt.health_check()
            return await evaluate(
                rt.policy, rt.make_env, heldout, samples=n_samples, params=params, seed=tc.evaluation_seed,
                rollout=cfg.rollout, sampler=rt.agent_sampler(n_samples),
            )  # fmt: skip
        finally:
            await rt.aclose()

    try:
        report = asyncio.run(go())
    except AgentEnvError as e:
        _fail(e)
    for line in report.tool_stats.warnings("in the evaluation"):
        typer.secho(f"warning: {line}", fg=typer.colors.YELLOW, err=True)
    text = json.dumps(report.to_json(), indent=1, default=str)
    typer.echo(text)  # printed first: a failed write below loses nothing
    if out:
        try:
            out.write_text(text)
        except OSError as e:
            _fail(InfraError(f"the report above could not be written to {out}: {e}"))


@app.command()
def export(
    source: Path = typer.Argument(
        ..., metavar="RUN_OR_CHECKPOINT", help="A run folder (its newest intact checkpoint) or a checkpoint folder."
    ),
    out: Path = typer.Option(..., "--out", help="The transformers folder to write (must not exist)."),
) -> None:
    """Write a checkpoint (plain, sharded or LoRA) as a transformers folder that `from_pretrained` loads."""
    from agentenv.training.export import export as export_checkpoint

    try:
        typer.echo(str(export_checkpoint(source, out)))
    except AgentEnvError as e:
        _fail(e)


@app.command()
def bench(
    config: Path = typer.Argument(..., help="Benchmark config, e.g. configs/bench/toy_grpo_vs_arpo.yaml"),
    overrides: list[str] | None = typer.Argument(None, help="dotted.key=value overrides"),
    plan: bool = typer.Option(False, "--plan", help="Print the plan and the estimated wall time; run nothing."),
    report_only: bool = typer.Option(
        False, "--report-only", help="Train nothing: write the tables and plots again from the finished runs."
    ),
) -> None:
    """Train several algorithms side by side on the same seeds and tasks; write tables and plots."""
    from agentenv.bench import run_benchmark

    try:
        run_benchmark(config, overrides or [], plan_only=plan, report=report_only)
    except AgentEnvError as e:
        _fail(e)


@app.command()
def view(
    folder: Path = typer.Argument(..., metavar="RUN_OR_BENCH_DIR", help="A run's trainer.output_dir or a bench's output_dir."),
    port: int = typer.Option(8765, min=0, max=65535, help="Port on 127.0.0.1 (0: a free one)."),
) -> None:
    """Serve a local page over a run or a bench: curves, rollouts, ARPO trees (Ctrl-C stops it)."""
    import asyncio

    from agentenv.view.server import serve

    def started(url: str) -> None:
        typer.echo(f"agentenv view: serving {folder} at {url} (Ctrl-C stops)")

    try:
        asyncio.run(serve(folder, port=port, on_start=started))
    except AgentEnvError as e:
        _fail(e)
    except OSError as e:  # the port is taken
        _fail(InfraError(f"cannot listen on 127.0.0.1:{port}: {e.strerror or e}; pick another with --port (0: any free one)"))


@tiny_app.command("build")
def tiny_build(
    overrides: list[str] | None = typer.Argument(None, help="TinyBuildConfig fields, e.g. sft_steps=200."),
    force: bool = typer.Option(False, help="Build here (minutes) even if a cached build or the shipped weights exist."),
) -> None:
    """Find (in the cache or the package) or build the embedded tiny model; print its build info and folder."""
    from agentenv.loader import build_dataclass, field_overrides
    from agentenv.toy.tiny import TinyBuildConfig, ensure_tiny_model

    try:
        fields = field_overrides(overrides or [])
        build_dataclass(TinyBuildConfig, fields, "tiny")  # a bad value fails here, before any work
    except ConfigError as e:
        _fail(e)
    path = ensure_tiny_model(force=force, **fields)
    info = Path(path, "build_info.json")
    if info.exists():
        typer.echo(info.read_text())
    typer.echo(str(path))


@sandbox_app.command("build")
def sandbox_build(image: str | None = typer.Option(None, help="Image name (default: the sandbox config's).")) -> None:
    """Make the sandbox image: use it if present, else pull, else build offline with debootstrap."""
    from agentenv.tools.python_sandbox import PythonSandboxConfig, build_image

    cfg = PythonSandboxConfig(image=image) if image else PythonSandboxConfig()
    try:
        typer.echo(build_image(cfg))
    except InfraError as e:
        _fail(e, code=1)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
