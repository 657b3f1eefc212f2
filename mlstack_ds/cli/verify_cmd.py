"""`mlstack-ds verify`: prove ZeRO-1/2/3, offload and the prebuilt kernels work, on several ranks."""

from __future__ import annotations

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
from mlstack_ds.console import make_output
from mlstack_ds.dsconfig.check import load_checked_config
from mlstack_ds.errors import VerifyFailed
from mlstack_ds.verify.checks import CHECK_NAMES
from mlstack_ds.verify.report import render_report
from mlstack_ds.verify.suite import DEFAULT_TIMEOUT_S, VerifyOptions, run_verify

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
        timeout: VerifyTimeoutOption = DEFAULT_TIMEOUT_S,
        hostfile: VerifyHostfileOption = None,
        isolate: Annotated[bool, typer.Option("--isolate", help="One launch per check (slower; for triage).")]
        = False,
        config: VerifyConfigOption = None,
        slurm: VerifySlurmOption = False,
    ) -> None:
        output = make_output(json_output)
        ds_config = load_checked_config(config, python) if config is not None else None
        report = run_verify(
            VerifyOptions(python=python, world_size=world_size, only=only, skip=skip, timeout_s=timeout,
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
