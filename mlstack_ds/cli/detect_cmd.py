"""`mlstack-ds detect`: show what this machine and the target Python have."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from mlstack_ds.cli.options import JsonOption, PythonOption
from mlstack_ds.console import Output, make_output
from mlstack_ds.detect import Environment, detect


def register(app: typer.Typer) -> None:
    @app.command("detect")
    def detect_command(
        json_output: JsonOption = False,
        python: PythonOption = None,
        tool_timeout: float = typer.Option(
            30.0, "--tool-timeout", min=0.1, help="Seconds each ROCm/NVIDIA tool may take before it counts as hung."
        ),
    ) -> None:
        """Report the platform (rocm/cuda/cpu), ROCm version, GPU targets, PyTorch build and environment.

        Tools are looked up on PATH first, then under $ROCM_PATH/bin ($ROCM_HOME, /opt/rocm). A missing,
        failing or hanging tool is reported as a warning, never as a crash.
        """
        output = make_output(json_output)
        environment = detect(python=python, tool_timeout=tool_timeout)
        if json_output:
            output.emit_json(environment.to_dict())
        else:
            render(environment, output)


def _gib(size: int | None) -> str:
    return f"{size / 2**30:.1f} GiB" if size else "?"


def render(environment: Environment, output: Output) -> None:
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("platform", environment.platform)
    rocm = environment.rocm
    summary.add_row(
        "ROCm",
        "not found" if rocm is None
        else f"{rocm.version or 'unknown version'}"
        + (f" at {rocm.root}" if rocm.root else " (no ROCm root directory)")
        + f", from {rocm.version_source or 'no source'}",
    )
    torch = environment.torch
    summary.add_row(
        "PyTorch",
        "not installed" if torch is None
        else f"{torch.version} ({torch.build} build"
        + (f", HIP {torch.hip}" if torch.hip else "")
        + (f", CUDA {torch.cuda}" if torch.cuda else "")
        + f", {torch.device_count} device(s))",
    )
    summary.add_row("Python", f"{environment.python.version} ({environment.python.executable})")
    ds = environment.deepspeed
    summary.add_row("DeepSpeed", "not installed" if ds is None else ds.version)
    output.out.print(summary)

    if environment.gpus:
        table = Table(title="GPUs", title_justify="left")
        for column in ("#", "name", "arch", "target id", "family", "wave", "CUs", "VRAM", "kind", "node"):
            table.add_column(column)
        for gpu in environment.gpus:
            kind = "integrated" if gpu.integrated else "discrete"
            table.add_row(
                str(gpu.index), escape(gpu.name), gpu.arch + (" (spoofed)" if gpu.spoofed else ""),
                gpu.target_id, gpu.family, str(gpu.wavefront_size or "?"), str(gpu.compute_units or "?"),
                _gib(gpu.vram_bytes), kind, "" if gpu.node is None else str(gpu.node),
            )
        output.out.print(table)
    else:
        output.out.print("GPUs: none visible")

    set_vars = {k: v for k, v in environment.env.items() if v is not None}
    if set_vars:
        output.out.print("Environment: " + ", ".join(f"{k}={escape(v)}" for k, v in set_vars.items()))
    for warning in environment.warnings:
        output.warn(escape(warning))
