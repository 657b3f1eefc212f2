"""The tests' fake machine as `mlstack-ds doctor` sees it, so doctor's output depends on the test alone, never on
this machine's own state (its JIT cache, /dev/shm, processes): one doctor call and the next agree."""

from __future__ import annotations

import sys
from pathlib import Path

from .cli import CliResult, run_cli
from .fakemachine import FakeMachine


class DoctorMachine:
    """The tests' fake machine (support.fakemachine) as doctor sees it: ROCm 6.2.2 with a hipcc, rocminfo
    replaying `capture`, a /dev, /proc, /sys root, and a JIT cache of its own (never the user's)."""

    def __init__(self, tmp: Path, capture: Path | None, kfd_targets: tuple[int, ...] = (),
                 python: Path | str = sys.executable) -> None:
        self.python = str(python)
        self.fake = FakeMachine(tmp)
        if capture is not None:
            self.fake.tool("rocminfo", capture)
        self.rocm = self.fake.rocm_root({".info/version": "6.2.2-116\n"})
        self.fake.executable("rocm/bin/hipcc")
        self.extensions = tmp / "torch_extensions"
        self.fake.extra_env["TORCH_EXTENSIONS_DIR"] = str(self.extensions)
        self.root = self.fake.sys_root(gpu=capture is not None, kfd_targets=kfd_targets)

    def run(self, *args: str, stdin: str | None = None, columns: str | None = None, **env: str) -> CliResult:
        return run_cli("doctor", "--python", self.python, "--sys-root", self.root, *args,
                       base_env={**self.fake.host_environ(), **env}, timeout=300, input=stdin, columns=columns)
