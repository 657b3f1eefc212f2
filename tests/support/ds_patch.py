"""Helpers for the AMD patch tests: run DeepSpeed from a source tree, fake absent ROCm tools."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from mlstack_ds.patience import Patience
from mlstack_ds.rehearsal.machine import without_host_variables
from mlstack_ds.runner import RunResult, run

FIXTURES = Path(__file__).resolve().parents[1] / "patches" / "fixtures"


def run_python_in_tree(tree: Path, *args: str | Path, env: Mapping[str, str] | None = None,
                       path_prepend: Sequence[Path] = (), timeout: float = 300,
                       python: str | Path = sys.executable) -> RunResult:
    """Run the test interpreter (or `python`, e.g. a fake venv's) with `args`, importing DeepSpeed from `tree`,
    on the CPU accelerator."""
    # ROCm settings of the machine running the tests must not leak into a test's fake machine.
    child_env = without_host_variables(os.environ)
    child_env.update({
        "PYTHONPATH": str(tree),
        "PYTHONDONTWRITEBYTECODE": "1",
        "DS_ACCELERATOR": "cpu",
        "PATH": os.pathsep.join([*map(str, path_prepend), child_env.get("PATH", "")]),
    })
    child_env.update(env or {})
    return run([str(python), *map(str, args)], env=child_env, cwd=tree, patience=Patience(timeout))



def probe_result(tree: Path, *args: str | Path, env: Mapping[str, str] | None = None, timeout: float = 300) -> Any:
    """Run a probe in `tree` (run_python_in_tree) that prints one `RESULT <json>` line; that JSON."""
    result = run_python_in_tree(tree, *args, env=env, timeout=timeout)
    assert result.ok, result.tail(40)
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))

def fake_tool(directory: Path, name: str, output: str, returncode: int = 0) -> Path:
    """An executable `name` in `directory` that prints `output` (a real capture) and exits."""
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{name}.out"
    data.write_text(output)
    tool = directory / name
    tool.write_text(f"#!/bin/sh\ncat '{data}'\nexit {returncode}\n")
    tool.chmod(0o755)
    return tool


HIPCC = shutil.which("hipcc")
requires_hipcc = pytest.mark.skipif(
    HIPCC is None, reason="hipcc not installed (scripts/test.sh installs Debian's: apt-get install hipcc)")
HIPIFY = """
import sys
from torch.utils.hipify import hipify_python
root, sources = sys.argv[1], sys.argv[2:]
result = hipify_python.hipify(project_directory=root, output_directory=root, includes=[root + "/*"],
                              extra_files=sources, header_include_dirs=[root], show_detailed=False,
                              is_pytorch_extension=True, hipify_extra_files_only=True, show_progress=False)
"""


# A guard against a hang only, not a speed limit: on a machine out of memory (the OOM killer at work beside
# a suite under load) a compile of one probe stalled for minutes, past the 180 s this once was.
HANG_GUARD_S = 900


def hipify(root: Path, sources: Sequence[Path]) -> None:
    """Hipify `sources` and the headers they include under `root` in place, with torch's real hipify."""
    result = run([sys.executable, "-c", HIPIFY, str(root), *map(str, sources)], patience=Patience(HANG_GUARD_S))
    assert result.ok, result.tail()


def hipcc_device_syntax_check(source: Path, arch: str, *, defines: Sequence[str] = (),
                              include_dirs: Sequence[Path] = (), extra_args: Sequence[str] = ()) -> RunResult:
    """Compile `source` for one GPU target, device side only, without a GPU library (what CI can do)."""
    assert HIPCC is not None
    argv = [HIPCC, f"--offload-arch={arch}", "-nogpulib", "--cuda-device-only", "-fsyntax-only",
            "-std=c++17", "-D__HIP_PLATFORM_AMD__=1", *(f"-D{d}" for d in defines),
            *(f"-I{d}" for d in include_dirs), *extra_args, str(source)]
    return run(argv, env={**os.environ, "HIP_PLATFORM": "amd"}, patience=Patience(HANG_GUARD_S))
