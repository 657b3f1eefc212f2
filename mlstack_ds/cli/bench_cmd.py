"""`mlstack-ds bench`: throughput and memory per ZeRO stage on this machine, beside the guide's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mlstack_ds.bench.config import checked_base_config
from mlstack_ds.bench.plot import require_plotting, write_plot
from mlstack_ds.bench.reference import this_machine
from mlstack_ds.bench.reference_view import render_reference
from mlstack_ds.bench.report import build_report, render
from mlstack_ds.bench.run import run_bench
from mlstack_ds.bench.spec import (
    DEFAULT_STAGES,
    MODELS,
    BenchSpec,
    default_seq_len,
    parse_model,
    parse_node_counts,
    parse_precision,
    parse_stages,
    parse_world_sizes,
    positive,
    positive_seconds,
)
from mlstack_ds.bench.verdicts import reference_document
from mlstack_ds.cli.options import (
    BenchConfigOption,
    BenchHostfileOption,
    BenchNodesOption,
    BenchSeqLenOption,
    BenchSlurmOption,
    BenchTimeoutOption,
    JsonOption,
    MicroBatchOption,
    PythonOption,
    WorldSizesOption,
)
from mlstack_ds.config.sizes import parse_size
from mlstack_ds.console import make_output
from mlstack_ds.errors import BenchFailed, UsageError
from mlstack_ds.launch.target import refuse_world_size_with_hostfile
from mlstack_ds.patience import BENCH_TIMEOUT_S

BENCH_HELP = (
    "Measure training throughput (samples/s, tokens/s, model TFLOP/s) and peak memory per rank of a GPT-like "
    "model under plain DDP and each ZeRO stage, on this machine, with the installed DeepSpeed's prebuilt ops "
    "only (a JIT compile fails the stage). Out of memory is a result (OOM), not a failure. Several world "
    "sizes (--world-size 1,2) give scaling efficiency. The guide's numbers are shown beside only where the "
    f"hardware and model match, each with its verdict. --reference prints the guide's tables with a physics "
    f"verdict on every cell and runs nothing. Models: {', '.join(MODELS)}. Exit code 10 if a stage failed. See "
    "docs/benchmarks.md."
)


def register(app: typer.Typer) -> None:
    @app.command("bench", help=BENCH_HELP)
    def bench_command(
        model: Annotated[str, typer.Option("--model", help=f"Model: {', '.join(MODELS)}.")] = "tiny",
        stages: Annotated[str, typer.Option(
            "--stages", help="Comma-separated: ddp (plain DistributedDataParallel) and ZeRO stages 0-3.")]
        = ",".join(DEFAULT_STAGES),
        world_size: WorldSizesOption = None,
        hostfile: BenchHostfileOption = None,
        slurm: BenchSlurmOption = False,
        nodes: BenchNodesOption = None,
        steps: Annotated[int, typer.Option("--steps", help="Timed steps per stage.")] = 10,
        warmup: Annotated[int, typer.Option("--warmup", help="Untimed steps before them.")] = 2,
        micro_batch: MicroBatchOption = 2,
        seq_len: BenchSeqLenOption = None,
        config: BenchConfigOption = None,
        precision: Annotated[str, typer.Option(
            "--precision", help="auto (fp32 on CPU; bf16 where the GPU has it, else fp16), fp32, bf16, fp16.")]
        = "auto",
        memory_cap: Annotated[str | None, typer.Option(
            "--memory-cap", metavar="SIZE",
            help="Memory each rank may use for the model and its training (e.g. 8GiB); beyond it the stage is "
            "OOM. Plans a smaller card on a larger one.")] = None,
        timeout_s: BenchTimeoutOption = BENCH_TIMEOUT_S,
        plot: Annotated[Path | None, typer.Option(
            "--plot", metavar="FILE.png", help="Also draw throughput, memory and scaling (needs mlstack-ds[plot]).")]
        = None,
        reference: Annotated[bool, typer.Option(
            "--reference", help="Run nothing: print the AMD guide's throughput, memory and scaling tables with a "
            "verdict on every cell, computed from the ZeRO memory formulas and the GPUs' peak FLOP/s.")] = False,
        json_output: JsonOption = False,
        python: PythonOption = None,
    ) -> None:
        output = make_output(json_output)
        if reference:
            refuse_run_options(world_size=world_size, hostfile=hostfile, slurm=slurm, nodes=nodes, seq_len=seq_len,
                               config=config, memory_cap=memory_cap, plot=plot)
            document = reference_document()
            if json_output:
                output.emit_json(document)
            else:
                render_reference(document, output.out)
            return
        chosen = parse_model(model)
        parse_precision(precision)
        refuse_world_size_with_hostfile(world_size, hostfile)
        if plot is not None:
            require_plotting(plot)
        config_json = None
        if config is not None:
            config_json = json.dumps(checked_base_config(config, python, micro_batch, stages))
        spec = BenchSpec(
            model=chosen, stages=parse_stages(stages), world_sizes=parse_world_sizes(world_size),
            steps=positive("--steps", steps), warmup=positive("--warmup", warmup, zero_ok=True),
            micro_batch=positive("--micro-batch", micro_batch),
            seq_len=positive("--seq-len", seq_len if seq_len is not None else default_seq_len(chosen)),
            precision=precision, config=config, config_json=config_json,
            memory_cap=parse_size("--memory-cap", memory_cap) if memory_cap is not None else 0,
            hostfile=hostfile, timeout_s=positive_seconds("--timeout", timeout_s), slurm=slurm,
            node_counts=parse_node_counts(nodes, slurm))
        runs, platform = run_bench(spec, python, status=output.status)
        report = build_report(spec, runs, str(python), this_machine(platform))
        if plot is not None:
            write_plot(report, plot)
            output.status(f"plot: {plot}")
        failure = None
        if not report["ok"]:
            failed = [f"{r['stage']}@{r['world_size']}" for r in report["runs"] if r["status"] == "failed"]
            failure = BenchFailed(f"{len(failed)} stage run(s) failed: {', '.join(failed)}",
                                  hint="see the reasons above; --stages STAGE reruns one", reported=json_output)
        if json_output:
            output.emit_json(report, error=failure)
        else:
            render(report, output.out)
        if failure is not None:
            raise failure


def refuse_run_options(**given: object) -> None:
    """`--reference` runs nothing: an option that only shapes a run is a mistake, not something to ignore."""
    named = [f"--{name.replace('_', '-')}" for name, value in given.items() if value not in (None, False)]
    if named:
        raise UsageError(f"--reference runs nothing, so {', '.join(named)} would do nothing",
                         hint="drop them, or drop --reference to measure this machine")
