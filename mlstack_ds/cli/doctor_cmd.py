"""`mlstack-ds doctor`: detect + every rule; findings as a table, JSON, or a bug-report block."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.text import Text

from mlstack_ds.bundle.manifest import read_manifest
from mlstack_ds.cli.options import (
    DoctorConfigOption,
    DoctorHostfileOption,
    DoctorSlurmOption,
    IndexOption,
    JsonOption,
    OfflineOption,
    PythonOption,
    RecipeOption,
)
from mlstack_ds.cluster import slurm as slurm_allocation
from mlstack_ds.cluster.hostfile import hostfile_world_size, parse_hostfile
from mlstack_ds.console import Output, make_output, print_records
from mlstack_ds.doctor import diagnose
from mlstack_ds.doctor.bundle import BundleQuestion
from mlstack_ds.doctor.cluster import ClusterDiagnosis, diagnose_cluster, diagnose_slurm
from mlstack_ds.doctor.logs import match_log_file
from mlstack_ds.doctor.model import Finding
from mlstack_ds.doctor.report import render_markdown
from mlstack_ds.doctor.rules import RULES
from mlstack_ds.dsconfig.read import read_nvme_offload
from mlstack_ds.errors import ExitCode, UsageError
from mlstack_ds.patches import series_for_recipe
from mlstack_ds.recipe import DEFAULT_RECIPE, Recipe, find_recipe

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}

LogOption = Annotated[
    Path | None, typer.Option("--log", help="Also match this build/run log or ds_report output (- reads stdin).")
]
ReportOption = Annotated[bool, typer.Option("--report", help="Print a Markdown block for a bug report.")]
SysRootOption = Annotated[
    Path, typer.Option("--sys-root", hidden=True, help="Read /dev, /proc, /sys below this directory.")
]


def _render_table(findings: list[Finding], output: Output) -> None:
    """One record per finding; `print_records` keeps every fix command whole on its line."""
    if not findings:
        output.out.print("[green]No problems found.[/]")
        return
    rows = [
        (f.rule_id, Text(f.severity, style=_STYLE[f.severity]), ("(from log) " if f.origin == "log" else "") + f.title,
         f.evidence, f.docs, list(f.fix))
        for f in findings
    ]
    print_records(output.out, ("rule", "severity", "problem", "evidence", "docs", "fix"), rows,
                  title="mlstack-ds doctor")
    counts = {s: sum(f.severity == s for f in findings) for s in _STYLE}
    output.status(", ".join(f"{n} {s}(s)" for s, n in counts.items()))


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor(
        *,
        python: PythonOption = None,
        json_output: JsonOption = False,
        log: LogOption = None,
        report: ReportOption = False,
        ds_config: DoctorConfigOption = None,
        sys_root: SysRootOption = Path("/"),
        recipe: RecipeOption = DEFAULT_RECIPE,
        hostfile: DoctorHostfileOption = None,
        slurm: DoctorSlurmOption = False,
        index: IndexOption = None,
        offline: OfflineOption = None,
    ) -> None:
        """Find known ways DeepSpeed breaks on ROCm here, and say how to fix each. Exit 3 on errors."""
        if json_output and report:
            raise UsageError("--json and --report both print to stdout", hint="choose one")
        slurm_allocation.refuse_with_hostfile(slurm, hostfile)
        pinned = find_recipe(recipe)  # a bad --recipe is refused before anything is probed
        bundle = ask_bundle(offline, pinned) if offline is not None else None  # and a DIR that is not a bundle
        if slurm:
            _doctor_slurm(python, json_output, {"--log": log, "--ds-config": ds_config, "--report": report or None},
                          bundle)
            return
        if hostfile is not None:
            _doctor_hostfile(hostfile, python, json_output, {"--log": log, "--ds-config": ds_config,
                                                              "--report": report or None}, bundle)
            return
        min_rocm = pinned.min_rocm
        log_findings = match_log_file(log, RULES) if log is not None else []
        nvme = read_nvme_offload(ds_config, python) if ds_config is not None else False
        output = make_output(json_output)
        diagnosis = diagnose(python=python, log_findings=log_findings, root=sys_root, nvme_offload=nvme,
                             min_rocm=min_rocm, index=index or None, bundle=bundle)
        if not json_output:
            for note in diagnosis.notes:
                output.warn(escape(note))
        if json_output:
            output.emit_json(diagnosis.to_dict())
        elif report:
            output.out.print(render_markdown(diagnosis), markup=False, highlight=False, soft_wrap=True)
        else:
            _render_table(diagnosis.findings, output)
        if diagnosis.has_errors:
            raise typer.Exit(int(ExitCode.ENVIRONMENT))


def ask_bundle(offline: Path, recipe: Recipe) -> BundleQuestion:
    """DIR made absolute (the nodes are given this path) once its manifest reads (not a bundle: exit 2 at once),
    with the recipe's whole series, as a plain install --offline checks it."""
    directory = Path(os.path.abspath(offline))
    read_manifest(directory)
    return BundleQuestion(directory, recipe, tuple((p.name, p.sha256) for p in series_for_recipe(recipe).patches))


def _doctor_hostfile(hostfile: Path, python: Path, json_output: bool, others: dict[str, object],
                     bundle: BundleQuestion | None) -> None:
    """`doctor --hostfile`: the nodes, not this machine; the options about this machine do not apply."""
    clash = [name for name, value in others.items() if value is not None]
    if clash:
        raise UsageError(f"--hostfile checks the nodes over ssh; {', '.join(clash)} is about this machine",
                         hint="run doctor without --hostfile for this machine (or on a node, for that node)")
    hosts = parse_hostfile(hostfile)
    hostfile_world_size(hostfile, hosts)
    output = make_output(json_output)
    _emit_cluster(diagnose_cluster(hostfile, hosts, python, bundle=bundle, status=output.status), output,
                  json_output)


def _doctor_slurm(python: Path, json_output: bool, others: dict[str, object], bundle: BundleQuestion | None
                  ) -> None:
    """`doctor --slurm`: the allocation's nodes, through one srun step; like --hostfile, not this machine."""
    clash = [name for name, value in others.items() if value is not None]
    if clash:
        raise UsageError(f"--slurm checks the allocation's nodes; {', '.join(clash)} is about this machine",
                         hint="run doctor without --slurm for this machine (or inside a task, for that node)")
    allocation = slurm_allocation.current(os.environ)
    output = make_output(json_output)
    output.status(f"Slurm job {allocation.job_id}: asking {len(allocation.nodes)} node(s) through srun")
    _emit_cluster(diagnose_slurm(allocation, python, bundle=bundle, status=output.status), output, json_output)


def _emit_cluster(diagnosis: ClusterDiagnosis, output: Output, json_output: bool) -> None:
    if json_output:
        output.emit_json(diagnosis.to_dict())
    else:
        _render_table(diagnosis.findings, output)
    if diagnosis.has_errors:
        raise typer.Exit(int(ExitCode.ENVIRONMENT))
