"""`mlstack-ds detect`: show what this machine and the target Python have."""

from __future__ import annotations

import math
from typing import Annotated, cast

import typer
from rich.markup import escape

from mlstack_ds.cli.options import JsonOption, PythonOption
from mlstack_ds.console import Output, make_output, print_records
from mlstack_ds.detect import Environment, detect
from mlstack_ds.errors import UsageError
from mlstack_ds.patience import WAITS


def register(app: typer.Typer) -> None:
    @app.command("detect")
    def detect_command(
        json_output: JsonOption = False,
        python: PythonOption = None,
        tool_timeout_s: Annotated[float, typer.Option(
            "--tool-timeout", min=0.1, help="Seconds a ROCm/NVIDIA tool may go without progress (CPU time, reads) "
            f"before it counts as hung; one still working gets up to {WAITS['rocm tool'].ceiling_s:g} s (or this "
            "if longer).")]
        = cast(float, WAITS["rocm tool"].stall_s),
    ) -> None:
        """Report the platform (rocm/cuda/cpu), ROCm version, GPU targets, PyTorch build and environment.

        Tools are looked up on PATH first, then under $ROCM_PATH/bin ($ROCM_HOME, /opt/rocm). A missing,
        failing or hanging tool is reported as a warning, never as a crash.
        """
        output = make_output(json_output)
        if not math.isfinite(tool_timeout_s):
            raise UsageError(f"--tool-timeout {tool_timeout_s:g}: must be a finite number of seconds", hint="e.g. 30")
        environment = detect(python=python, tool_patience=WAITS["rocm tool"].with_stall(tool_timeout_s))
        if json_output:
            output.emit_json(environment.to_dict())
        else:
            render(environment, output)


def _gib(size: int | None) -> str:
    return f"{size / 2**30:.1f} GiB" if size else "?"


def render(environment: Environment, output: Output) -> None:
    """The environment as a summary and a GPU table (`print_records`: plain lines when piped or narrow)."""
    rocm = environment.rocm
    torch = environment.torch
    ds = environment.deepspeed
    summary: list[tuple[str, str]] = [
        ("platform", environment.platform),
        ("ROCm", "not found" if rocm is None
         else f"{rocm.version or 'unknown version'}"
         + (f" at {rocm.root}" if rocm.root else " (no ROCm root directory)")
         + f", from {rocm.version_source or 'no source'}"),
        ("PyTorch", "not installed" if torch is None
         else f"{torch.version} ({torch.build} build"
         + (f", HIP {torch.hip}" if torch.hip else "")
         + (f", CUDA {torch.cuda}" if torch.cuda else "")
         + f", {torch.device_count} device(s))"),
        ("Python", f"{environment.python.version} ({environment.python.executable})"),
        ("DeepSpeed", "not installed" if ds is None else ds.version),
    ]
    wheels = environment.rocm_wheels
    if wheels is not None:
        devel = ("not installed (rocm[devel])" if not wheels.devel_installed
                 else f"at {wheels.devel_root}" if wheels.devel_expanded else "installed, not expanded (rocm-sdk init)")
        summary.insert(2, ("ROCm wheels", f"{wheels.version or 'unknown version'}; devel {devel}; device targets "
                           + (", ".join(wheels.device_targets) or "none installed")))
    if environment.system_rocm is not None:
        system = environment.system_rocm
        summary.insert(2, ("system ROCm", f"{system.version or 'unknown version'}"
                           + (f" at {system.root}" if system.root else "")
                           + f", from {system.version_source or 'no source'} (not used: the target loads its wheels)"))
    print_records(output.out, ("", ""), summary, keyed=True)

    if environment.gpus:
        rows = [
            (str(gpu.index), gpu.name, gpu.arch + (" (spoofed)" if gpu.spoofed else ""), gpu.target_id, gpu.family,
             str(gpu.wavefront_size or "?"), str(gpu.compute_units or "?"), _gib(gpu.vram_bytes),
             "integrated" if gpu.integrated else "discrete", "" if gpu.node is None else str(gpu.node))
            for gpu in environment.gpus
        ]
        print_records(output.out, ("#", "name", "arch", "target id", "family", "wave", "CUs", "VRAM", "kind", "node"),
                      rows, title="GPUs")
    else:
        output.out.print("GPUs: none visible")

    set_vars = {k: v for k, v in environment.env.items() if v is not None}
    if set_vars:
        output.out.print("Environment: " + ", ".join(f"{k}={escape(v)}" for k, v in set_vars.items()))
    for warning in environment.warnings:
        output.warn(escape(warning))
