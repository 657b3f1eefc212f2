"""Helpers shared by the end-to-end tests (imported by tests/conftest.py and the tests)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .cli import CliResult, run_cli

T = TypeVar("T")

# What verify skips on the CPU platform after a full install of 0.19.5 (each check says why): the ops its CPU
# build does not have (GPU optimizers and kernels; 0.19.5's CPU accelerator has no cpu_adagrad/cpu_lion
# builders), `untested_ops`, which finds none of the CUDA transformer kernels it names built, and
# `lightning_deepspeed`, which Lightning refuses off GPUs (the targets have the clients: lightning is there). The
# shared-memory all-reduce it builds is computed by `shm_comm`, which passes.
CPU_SKIPS = frozenset({"fused_lamb", "fused_lion", "cpu_adagrad", "cpu_lion", "utils", "quantizer", "random_ltd",
                       "untested_ops", "lightning_deepspeed"})
# 0.19.8's CPU accelerator builds cpu_adagrad and cpu_lion (recipes/deepspeed-0.19.8.toml): those checks run.
NEXT_PIN_CPU_SKIPS = CPU_SKIPS - {"cpu_adagrad", "cpu_lion"}

# Loads each prebuilt op the way DeepSpeed does at first use (builder.load()), with JIT made impossible:
# a missing prebuilt op would try to compile into TORCH_EXTENSIONS_DIR, which is a file here.
FIRST_USE = """
import json, sys, time
from deepspeed.ops.op_builder.all_ops import ALL_OPS
times = {}
for name in sys.argv[1:]:
    started = time.monotonic()
    ALL_OPS[name].load()
    times[name] = time.monotonic() - started
print(json.dumps(times))
"""


@dataclass(frozen=True)
class Target:
    venv: Path
    cache: Path

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def cli(self, *args: str, timeout: float = 3600, env: dict[str, str] | None = None) -> CliResult:
        return run_cli(*args, timeout=timeout, env={"COLUMNS": "200", **(env or {})})

    def install(self, *args: str, **kwargs) -> CliResult:
        return self.cli("install", "--python", self.python, "--cache-dir", str(self.cache), *args, **kwargs)

    def status(self) -> dict:
        result = self.cli("status", "--python", self.python, "--json")
        assert result.returncode == 0, result.stderr
        return result.json


def still_there_after(find: Callable[[], list[T]], seconds: float = 60) -> list[T]:
    """What `find` (processes that must be gone) still returns after up to `seconds`. A process killed just
    now stays in /proc, SIGKILL pending, until it gets a CPU to exit on: seconds on a loaded machine (seen at
    a load of 20). Something left running is still there after the wait; the tests' hangs last minutes."""
    deadline = time.monotonic() + seconds
    found = find()
    while found and time.monotonic() < deadline:
        time.sleep(0.5)
        found = find()
    return found


def processes_mentioning(marker: str) -> list[int]:
    """PIDs whose command line contains `marker` (to prove nothing was left running)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def served(directory: Path) -> Iterator[str]:
    """`python -m http.server` on the loopback address serving `directory`; yields its base URL."""
    from mlstack_ds.launch.launcher import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port), "--directory",
                             str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=30)


# What a machine without a compiler still has on PATH (no gcc, g++, c++, cc, clang, hipcc, nvcc).
NO_COMPILER_TOOLS = ("git", "sh", "bash", "env", "uname", "ldconfig", "cat", "ls", "rm", "mkdir", "sleep")
COMPILERS = ("gcc", "g++", "c++", "cc", "clang", "clang++", "hipcc", "nvcc", "ld")


def no_compiler_path(directory: Path) -> str:
    """A PATH directory of links to the few tools a machine without any compiler has; returns the PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    for tool in NO_COMPILER_TOOLS:
        found = shutil.which(tool)
        if found and not (directory / tool).exists():
            (directory / tool).symlink_to(found)
    path = str(directory)
    assert not [c for c in COMPILERS if shutil.which(c, path=path)], "the PATH still has a compiler"
    return path
