"""The ROCm build matrix the tests rehearse and docs/rocm-build-matrix.md reports.

Why these rows: every machine the issue names (the guide's RX 7900 XTX, MI210/MI250, MI300X, RX 6900 XT,
RX 9070, a node with two wave32 archs), every ROCm release (6.2, 6.4, 7.0) and torch before 2.12, from
2.12 (extensions built as C++20) and from 2.14 (headers refuse C++17) appear at least once, without the
full product of them (each rehearsal runs DeepSpeed's setup.py to a wheel: about 15 s on 2 cores).
Machines with a real rocminfo capture replay it; MI300X and RX 9070 are rehearsed as GPU-less build
hosts (the capture of Debian's rocminfo on this CI machine) with the targets named, which is how
such wheels are built for clusters and images anyway. The second pin (0.19.8) gets the two rows where
its changes bite: the syntax-checked RX 7900 XTX (new csrc) and torch 2.14 (C++20 without
TorchCPUOpBuilder, which 0.19.8 removed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlstack_ds.rehearsal.records import Record
from mlstack_ds.rehearsal.run import RehearsalResult, RehearsalSpec, violations

GFX1100 = "rocminfo_gfx1100_rocm-issue-3949.txt"
GFX90A = "rocminfo_gfx90a_4xMI210_rocm-issue-4563.txt"
GFX1030 = "rocminfo_gfx1030_rocm-issue-2773.txt"
NO_GPU = "rocminfo_no-gpu-visible_debian-rocminfo-5.2.3.txt"


@dataclass(frozen=True)
class Row:
    name: str
    machine: str  # what the docs call it
    captures: tuple[str, ...]  # rocminfo capture file names, spliced in order when more than one
    rocminfo_exit: int = 0
    rocm_version: str = "6.4.1"
    rocm_layout: str = "opt"
    torch_version: str = "2.13.0"
    torch_archs: tuple[str, ...] | None = None
    archs: str | None = None
    user_env: dict[str, str] = field(default_factory=dict)
    patches: bool = True
    all_ops: bool = False
    recipe: str = "deepspeed-0.19.5"  # the pin the row builds (its series with it)
    syntax_check: bool = False  # also run Debian's hipcc -fsyntax-only on each hipified translation unit
    rocm_guess: str = "devel"  # ROCm wheels rows: torch's own ROCM_HOME guess ("venv-root" before pytorch#196503)


# The archs PyTorch's ROCm wheels are built for since the ROCm 6.4/7.0 builder images (PyTorch's
# .ci/docker build scripts; the same 14 printed by a rocm7.2 wheel's get_arch_list(), astral-sh/uv#18730).
TORCH_WHEEL_ARCHS = ("gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1102",
                     "gfx1200", "gfx1201", "gfx950", "gfx1150", "gfx1151")

ROWS: tuple[Row, ...] = (
    Row("rx7900xtx-rocm6.2-torch2.11", "RX 7900 XTX (gfx1100)", (GFX1100,), rocm_version="6.2.2",
        torch_version="2.11.0", torch_archs=TORCH_WHEEL_ARCHS),
    Row("rx7900xtx-rocm6.4-torch2.13", "RX 7900 XTX (gfx1100)", (GFX1100,), rocm_version="6.4.1",
        torch_version="2.13.0", torch_archs=TORCH_WHEEL_ARCHS, syntax_check=True),
    Row("mi210x4-rocm6.4-torch2.12", "4x MI210 (gfx90a)", (GFX90A,), rocm_version="6.4.1", torch_version="2.12.0",
        torch_archs=TORCH_WHEEL_ARCHS, syntax_check=True),
    Row("mi300x-build-host-rocm7.0-torch2.14", "MI300X (gfx942), GPU-less build host, --arch", (NO_GPU,),
        rocminfo_exit=1, rocm_version="7.0.0", torch_version="2.14.0", torch_archs=TORCH_WHEEL_ARCHS,
        archs="gfx942"),
    Row("rx6900xt-distro-rocm6.2-torch2.11", "RX 6900 XT (gfx1030), distro ROCm and torch (no .info/version, "
        "no +rocm tag)",
        (GFX1030,), rocm_version="6.2.4", rocm_layout="distro", torch_version="2.11.0"),
    Row("rx9070-build-host-rocm7.0-torch2.13", "RX 9070 (gfx1201), GPU-less build host, PYTORCH_ROCM_ARCH",
        (NO_GPU,), rocminfo_exit=1, rocm_version="7.0.0", torch_version="2.13.0", torch_archs=TORCH_WHEEL_ARCHS,
        user_env={"PYTORCH_ROCM_ARCH": "gfx1201"}),
    Row("gfx1100+gfx1030-rocm7.0-torch2.12", "RX 7900 XTX + RX 6900 XT in one node (wave32 both)",
        (GFX1100, GFX1030), rocm_version="7.0.0", torch_version="2.12.0", torch_archs=TORCH_WHEEL_ARCHS),
    Row("rx7900xtx-all-ops-rocm6.4-torch2.13", "RX 7900 XTX (gfx1100), DS_BUILD_OPS=1 as upstream documents",
        (GFX1100,), rocm_version="6.4.1", torch_version="2.13.0", torch_archs=TORCH_WHEEL_ARCHS, all_ops=True),
    Row("rx7900xtx-rocm6.4-torch2.13-ds0.19.8", "RX 7900 XTX (gfx1100)", (GFX1100,), rocm_version="6.4.1",
        torch_version="2.13.0", torch_archs=TORCH_WHEEL_ARCHS, recipe="deepspeed-0.19.8", syntax_check=True),
    Row("mi300x-build-host-rocm7.0-torch2.14-ds0.19.8", "MI300X (gfx942), GPU-less build host, --arch", (NO_GPU,),
        rocminfo_exit=1, rocm_version="7.0.0", torch_version="2.14.0", torch_archs=TORCH_WHEEL_ARCHS,
        archs="gfx942", recipe="deepspeed-0.19.8"),
    # ROCm as TheRock's Python wheels in a venv that is not activated, no ROCm root on the host. No rocminfo
    # capture of these GPUs exists here: build hosts with the targets named, as the rows above.
    Row("rx9070-therock7.14-torch2.14", "RX 9070 (gfx1201), ROCm wheels venv, torch guessing ROCM_HOME = the "
        "venv (before pytorch#196503)", (NO_GPU,), rocminfo_exit=1, rocm_version="7.14.0", rocm_layout="wheels",
        torch_version="2.14.1", torch_archs=TORCH_WHEEL_ARCHS, user_env={"PYTORCH_ROCM_ARCH": "gfx1201"},
        rocm_guess="venv-root"),
    Row("rx9070-therock7.14-torch2.14-fixed-torch", "RX 9070 (gfx1201), ROCm wheels venv, torch guessing the "
        "devel tree (pytorch#196503)", (NO_GPU,), rocminfo_exit=1, rocm_version="7.14.0", rocm_layout="wheels",
        torch_version="2.14.1", torch_archs=TORCH_WHEEL_ARCHS, user_env={"PYTORCH_ROCM_ARCH": "gfx1201"}),
    Row("strix-halo-therock7.14-torch2.14", "Strix Halo (gfx1151), ROCm wheels venv, --arch", (NO_GPU,),
        rocminfo_exit=1, rocm_version="7.14.0", rocm_layout="wheels", torch_version="2.14.1",
        torch_archs=TORCH_WHEEL_ARCHS, archs="gfx1151", rocm_guess="venv-root"),
    Row("mi300x-therock10.1-torch2.13", "MI300X (gfx942), ROCm 10 wheels venv, --arch", (NO_GPU,),
        rocminfo_exit=1, rocm_version="10.1.0", rocm_layout="wheels", torch_version="2.13.0",
        torch_archs=TORCH_WHEEL_ARCHS, archs="gfx942"),
    # The new stream's system packages: /opt/rocm/core-10.0, found with no ROCM_PATH, bin not on PATH.
    Row("mi300x-core10.0-torch2.13", "MI300X (gfx942), /opt/rocm/core-10.0 system packages, no ROCM_PATH, --arch",
        (NO_GPU,), rocminfo_exit=1, rocm_version="10.0.0", rocm_layout="core", torch_version="2.13.0",
        torch_archs=TORCH_WHEEL_ARCHS, archs="gfx942"),
)


def rocminfo_text(captures: Sequence[Path]) -> str:
    """One capture as printed, or several machines' GPU agents spliced into the first one's output:
    each added capture's agent blocks (from its first GPU agent on) go after the first's agents."""
    texts = [c.read_text() for c in captures]
    if len(texts) == 1:
        return texts[0]
    base = texts[0]
    end = base.index("*** Done ***") if "*** Done ***" in base else len(base)
    extra = []
    for text in texts[1:]:
        start = _first_gpu_agent(text)
        stop = text.index("*** Done ***") if "*** Done ***" in text else len(text)
        extra.append(text[start:stop])
    return base[:end] + "".join(extra) + base[end:]


def _first_gpu_agent(text: str) -> int:
    """Offset of the `*******\\nAgent N` header of the first agent whose Device Type is GPU."""
    offset = 0
    while True:
        agent = text.index("Agent ", offset)
        device = text.index("Device Type:", agent)
        if text[device:text.index("\n", device)].split(":", 1)[1].strip() == "GPU":
            return text.rindex("*******", 0, agent)
        offset = device


def spec_for(row: Row, find_capture: Callable[[str], Path], syntax_hipcc: str | None = None,
             syntax_stubs: Path | None = None) -> RehearsalSpec:
    """The rehearsal of `row`; `find_capture` turns a capture's file name into its path. The syntax check
    runs on the rows that ask for it when a `syntax_hipcc` is given."""
    check = row.syntax_check and syntax_hipcc is not None
    return RehearsalSpec(
        name=row.name, rocminfo=rocminfo_text([find_capture(c) for c in row.captures]),
        rocminfo_exit=row.rocminfo_exit, rocm_version=row.rocm_version,
        rocm_layout="opt" if row.rocm_layout == "wheels" else row.rocm_layout,  # type: ignore[arg-type]
        rocm_wheels=row.rocm_layout == "wheels", rocm_guess=row.rocm_guess,
        torch_version=row.torch_version, torch_archs=row.torch_archs, archs=row.archs, user_env=row.user_env,
        patches=row.patches, all_ops=row.all_ops, syntax_hipcc=syntax_hipcc if check else None,
        syntax_stubs=str(syntax_stubs) if check and syntax_stubs else None)


def key_flags(hip: Sequence[Record]) -> str:
    """The distinct target, wavefront and C++ standard flags of the recorded hipcc lines."""
    flags = sorted({a for r in hip for a in r.argv
                    if a.startswith(("--offload-arch=", "-DROCM_WAVEFRONT_SIZE=", "-std="))})
    return " ".join(f"`{f}`" for f in flags) or "-"


def syntax_summary(result: RehearsalResult) -> str:
    """`3/9 ok` plus why the others could not be checked, or `-` when no check ran."""
    verdicts = [r.syntax for op in result.ops.values() for r in op.compiles if r.syntax is not None]
    if not verdicts:
        return "-"
    ok = sum(1 for v in verdicts if v["ok"])
    missing = sorted({_missing_header(v.get("first_error") or "") for v in verdicts if not v["ok"]} - {""})
    other = sum(1 for v in verdicts if not v["ok"] and not _missing_header(v.get("first_error") or ""))
    text = f"{ok}/{len(verdicts)} ok"
    if missing:
        text += "; the rest need " + ", ".join(f"`{m}`" for m in missing)
    if other:
        text += f"; {other} with errors"
    return text


def _missing_header(error: str) -> str:
    marker = "fatal error: '"
    if marker in error and "' file not found" in error:
        return error.split(marker, 1)[1].split("'", 1)[0]
    return ""


def matrix_markdown(rows: Sequence[Row], results: Sequence[RehearsalResult]) -> str:
    """docs/rocm-build-matrix.md: one row per rehearsal, key flags, and what this does and does not prove."""
    lines = [
        "# ROCm build matrix (rehearsed)",
        "",
        "Generated by `scripts/rehearse_rocm_build.py --matrix --write-docs`; a test fails when it is stale.",
        "",
        "Each row is one **rehearsal**: the row's pinned DeepSpeed with that pin's patch series, built by our",
        "own build stage (DeepSpeed's real `setup.py` run to a wheel, torch's real `cpp_extension` and hipify)",
        "on a machine that stands in for the ROCm host: torch reports the ROCm release and version in the row (a",
        "start-up shim in the build interpreter only), the ROCm root has `.info/version` unless the row says",
        "distro, `rocminfo` replays a real capture, and hipcc and the host compiler/linker only record their",
        "command lines. The targets are those `install` plans for that machine.",
        "",
        "| machine | DeepSpeed | ROCm | torch | targets (from) | ops built | key hipcc flags, as recorded | "
        "hipcc lines | hipcc syntax check | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, result in zip(rows, results, strict=True):
        plan = result.plan
        hip = [r for op in result.ops.values() for r in op.compiles if r.is_hip]
        problems = violations(result)
        verdict = ("sound" if result.outcome == "built" and not problems else
                   f"{len(problems)} problem(s)" if result.outcome == "built" else f"{result.outcome}: {result.error}")
        targets = f"{', '.join(plan.archs)} ({plan.targets_source})" if plan else "-"
        lines.append(
            f"| {row.machine} | {row.recipe.removeprefix('deepspeed-')} | {row.rocm_version} ({row.rocm_layout}) | "
            f"{row.torch_version} | {targets} | "
            f"{', '.join(sorted(result.ops)) or '-'} | {key_flags(hip)} | {len(hip)} | {syntax_summary(result)} | "
            f"{verdict} |")
    lines += [
        "",
        "## What this proves",
        "",
        "* DeepSpeed's `setup.py` runs to a wheel in ROCm mode with our series on every row: the ops it",
        "  decides to build are exactly the plan's (DeepSpeed's own `installed_ops` agrees), and no CUDA-only op",
        "  (CUTLASS, dskernels, cuFile, triton) is attempted, even under `DS_BUILD_OPS=1`.",
        "* A translation unit that does pass the syntax check has no error that clang's HIP front end can",
        "  see before code generation, for the row's first target.",
        "* Every hipcc compile line carries `--offload-arch` for exactly the plan's targets and the plan's",
        "  `-DROCM_WAVEFRONT_SIZE`. Every compile uses a C++ standard the torch release's headers accept (C++20",
        "  from 2.14, C++17 before), and wherever DeepSpeed chooses the standard itself (host compiles, and hipcc",
        "  lines from `CUDAOpBuilder.nvcc_args()`) it is the one torch builds extensions with (C++20 from 2.12).",
        "* torch's hipify runs on the real sources, and torch's `cpp_extension` writes the real compile lines.",
        "* Rows with ROCm (wheels): ROCm as TheRock's Python wheels in a venv that is not activated, no ROCm root",
        "  on the host (a stand-in laid out as TheRock documents it). The plan sets `ROCM_HOME` and `ROCM_PATH`",
        "  to the wheels' devel tree and takes its hipcc, so every hipcc line reads that tree's headers",
        "  (`-I<devel>/include`) whether torch's own guess is the venv root (before pytorch#196503) or the devel",
        "  tree; the ROCm version checked is the wheels' (7.14.0, 10.1.0), never the HIP version.",
        "",
        "## What it cannot prove",
        "",
        "* Nothing is compiled: no device code is generated, so a kernel that hipcc rejects (or miscompiles)",
        "  is not found here. On the rows with a syntax check, each hipified translation unit is also given to",
        "  Debian's hipcc (ROCm 5.2, clang 15) with the recorded flags, device side only, `-fsyntax-only`;",
        "  most need headers this machine does not have: ROCm's `hip/hip_bf16.h` (ROCm 5.2 is too old), rocThrust",
        "  (`thrust/complex.h`, pulled in by torch's headers) and the ROCm torch headers (`ATen/hip/...`).",
        "* The torch headers are those of the CPU wheel installed here (2.13.0), whatever release the row's",
        "  torch claims: the `-std` check compares the flags with the release's requirement, it does not",
        "  compile against that release's headers.",
        "* Linking is recorded, not done: missing ROCm libraries (`-lamdhip64`, `-lc10_hip`) are not found here.",
        "",
    ]
    return "\n".join(lines)
