"""`mlstack-ds verify`: prove ZeRO-1/2/3, offload and the prebuilt kernels work, on several ranks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mlstack_ds.cli.options import (
    JsonOption,
    PythonOption,
    VerifyConfigOption,
    VerifyHostfileOption,
    VerifySlurmOption,
    VerifyTimeoutOption,
    WorldSizeOption,
)
from mlstack_ds.cluster.slurm import sbatch_script
from mlstack_ds.console import make_output
from mlstack_ds.dsconfig.check import load_checked_config
from mlstack_ds.errors import UsageError, VerifyFailed
from mlstack_ds.patience import VERIFY_TIMEOUT_S
from mlstack_ds.verify.checks import CHECK_NAMES
from mlstack_ds.verify.report import render_report
from mlstack_ds.verify.suite import VerifyOptions, run_verify

VERIFY_HELP = (
    "Run real training steps through the installed DeepSpeed on several ranks, check by check. "
    f"Checks: {', '.join(CHECK_NAMES)}. Exit code 8 if any check failed."
)


def register(app: typer.Typer) -> None:
    @app.command(help=VERIFY_HELP)
    def verify(
        *,
        python: PythonOption = None,
        world_size: WorldSizeOption = None,
        only: Annotated[str | None, typer.Option("--only", help="Comma-separated checks to run.")] = None,
        skip: Annotated[str | None, typer.Option("--skip", help="Comma-separated checks to leave out.")]
        = None,
        json_output: JsonOption = False,
        timeout_s: VerifyTimeoutOption = VERIFY_TIMEOUT_S,
        hostfile: VerifyHostfileOption = None,
        isolate: Annotated[bool, typer.Option("--isolate", help="One launch per check (slower; for triage).")]
        = False,
        config: VerifyConfigOption = None,
        slurm: VerifySlurmOption = False,
        print_sbatch: Annotated[bool, typer.Option(
            "--print-sbatch", help="With --slurm: print an sbatch script that runs doctor --slurm and this verify "
            "--slurm (submit it with `sbatch FILE`), and exit.")] = False,
    ) -> None:
        if print_sbatch:
            _print_sbatch(slurm, python, world_size, only, skip, timeout_s)
            return
        output = make_output(json_output)
        ds_config = load_checked_config(config, python) if config is not None else None
        report = run_verify(
            VerifyOptions(python=python, world_size=world_size, only=only, skip=skip, timeout_s=timeout_s,
                          hostfile=hostfile, isolate=isolate, ds_config=ds_config,
                          slurm=slurm),
            status=output.status,
        )
        failure = None
        if not report.ok:
            failed = [c.name for c in report.checks if c.status == "fail"]
            failure = VerifyFailed(f"{len(failed)} check(s) failed: {', '.join(failed)}",
                                   hint="see the reasons above; --only CHECK --isolate reruns one on its own")
        if json_output:
            output.emit_json(report.to_json(), error=failure)
        else:
            render_report(report, output.out)
        if failure is not None:
            raise failure


def _print_sbatch(slurm: bool, python: Path, world_size: int | None, only: str | None, skip: str | None,
                  timeout_s: float) -> None:
    """`verify --slurm --print-sbatch`: the batch script on stdout; needs no allocation (it makes one)."""
    if not slurm:
        raise UsageError("--print-sbatch goes with --slurm", hint="mlstack-ds verify --slurm --print-sbatch > job.sh")
    if world_size is not None:
        raise UsageError("--world-size cannot be combined with --slurm",
                         hint="the script's #SBATCH --ntasks-per-node decides the ranks per node")
    args = [*(["--only", only] if only else []), *(["--skip", skip] if skip else []),
            *(["--timeout", f"{timeout_s:g}"] if timeout_s != VERIFY_TIMEOUT_S else [])]
    tool = [sys.executable, "-m", "mlstack_ds"]
    sys.stdout.write(sbatch_script(tool, str(python), args))
