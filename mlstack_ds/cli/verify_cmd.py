"""`mlstack-ds verify`: prove ZeRO-1/2/3, offload and the prebuilt kernels work, on several ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlstack_ds.cli.options import JsonOption, PythonOption
from mlstack_ds.console import make_output
from mlstack_ds.detect.environment import resolve_python
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
        world_size: Annotated[int | None, typer.Option(
            "--world-size", help="Ranks to launch (default: the GPU count; 2 on CPU).")] = None,
        only: Annotated[str | None, typer.Option("--only", help="Comma-separated checks to run.")] = None,
        skip: Annotated[str | None, typer.Option("--skip", help="Comma-separated checks to leave out.")]
        = None,
        json_output: JsonOption = False,
        timeout: Annotated[float, typer.Option(
            "--timeout", help="Seconds for the whole run; on expiry every process is killed.")]
        = DEFAULT_TIMEOUT_S,
        hostfile: Annotated[Path | None, typer.Option(
            "--hostfile",
            help="Multi-node: run the suite through DeepSpeed's launcher (pdsh over ssh) on the nodes of this "
            "DeepSpeed hostfile (`host slots=N` lines). Needs passwordless ssh to every node, pdsh here and the "
            "target --python at the same path on every node; the launch files are copied to nodes that do not "
            "share this host's file system. See docs/multinode.md.")] = None,
        isolate: Annotated[bool, typer.Option("--isolate", help="One launch per check (slower; for triage).")]
        = False,
        config: Annotated[Path | None, typer.Option(
            "--config", metavar="FILE",
            help="Your DeepSpeed config: the `config` check trains the suite's model under it (stage, offload, "
            "precision, buckets as given) against the torch reference. DeepSpeed's parser judges it first; "
            "a rejected key is an error before anything is launched. Alone, runs only that check.")] = None,
    ) -> None:
        output = make_output(json_output)
        target = resolve_python(python)
        ds_config = load_checked_config(config, target) if config is not None else None
        report = run_verify(
            VerifyOptions(python=target, world_size=world_size, only=only, skip=skip, timeout_s=timeout,
                          hostfile=hostfile, isolate=isolate, ds_config=ds_config),
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
