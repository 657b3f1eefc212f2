"""The one fake AMD machine of the tests: executables on PATH that replay real captured tool outputs, a ROCm
root, and for doctor a fake /dev, /proc, /sys root (`--sys-root`).

Only the hardware is fake: the CLI runs as a real subprocess, finds the tools on PATH, runs them and
parses what they print. Scripts use absolute paths (/bin/cat, /bin/sleep) so PATH can hold only them.
The real machine's ROCm and GPU settings are left out by the rehearsal's own list
(`without_host_variables`), so the fake host answers for itself here as it does in a rehearsal.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from mlstack_ds.rehearsal.machine import without_host_variables

from .cli import CliResult, run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = FIXTURES / "real"


@dataclass
class FakeMachine:
    root: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.bin = self.root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)

    def tool(
        self,
        name: str,
        capture: str | Path | None = None,
        *,
        text: str | None = None,
        exit_code: int = 0,
        stderr: str = "",
        hang: bool = False,
    ) -> Path:
        """Install `name` printing a real capture (a file name under fixtures/real) or `text`."""
        lines = ["#!/bin/sh"]
        if hang:
            lines.append("exec /bin/sleep 600")
        if capture is not None:
            path = capture if isinstance(capture, Path) else REAL / capture
            lines.append(f"/bin/cat {shlex.quote(str(path))}")
        if text is not None:
            data = self.root / f"{name}.out"
            data.write_text(text)
            lines.append(f"/bin/cat {shlex.quote(str(data))}")
        if stderr:
            lines.append(f"echo {shlex.quote(stderr)} >&2")
        lines.append(f"exit {exit_code}")
        script = self.bin / name
        script.write_text("\n".join(lines) + "\n")
        script.chmod(0o755)
        return script

    def rocm_root(self, files: dict[str, str] | None = None) -> Path:
        """A ROCm install directory with the given files (relative path -> contents); sets ROCM_PATH."""
        root = self.root / "rocm"
        root.mkdir(exist_ok=True)
        for relative, content in (files or {}).items():
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        self.extra_env["ROCM_PATH"] = str(root)
        return root

    def executable(self, relative: str, text: str = "#!/bin/sh\nexit 0\n") -> Path:
        """An executable file under the machine's root (e.g. `rocm/bin/hipcc`)."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
        return path

    def sys_root(self, *, gpu: bool = True, kfd_targets: tuple[int, ...] = ()) -> Path:
        """A /dev, /proc, /sys tree for `doctor --sys-root`: /dev/shm, a boot command line, libaio's header, and
        with `gpu` the /dev/kfd device, an IOMMU and one KFD topology node per `gfx_target_version`."""
        root = self.root / "root"
        files = {"proc/cmdline": "BOOT_IMAGE=/vmlinuz ro quiet\n", "usr/include/libaio.h": ""}
        if gpu:
            files.update({"dev/kfd": "", "sys/class/iommu/ivhd0/name": "ivhd0"})
        files.update({f"sys/class/kfd/kfd/topology/nodes/{n}/properties": f"gfx_target_version {target}\n"
                      for n, target in enumerate(kfd_targets, start=1)})
        (root / "dev" / "shm").mkdir(parents=True, exist_ok=True)
        for relative, content in files.items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(content)
        return root

    def host_environ(self) -> dict[str, str]:
        """The real machine's environment (its PATH after the fake tools) less its ROCm and GPU settings: for
        commands that need the real system's tools beside the fake ones (doctor)."""
        return {**without_host_variables(os.environ), "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
                **self.extra_env}

    def environ(self) -> dict[str, str]:
        """A clean environment: PATH holds only the fake tools, no ROCm/GPU variables leak in."""
        keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")}
        return {**keep, "PATH": str(self.bin), "COLUMNS": "200", **self.extra_env}

    def run_cli(self, *args: str, timeout: float = 600) -> CliResult:
        """The CLI run on this machine: only its environment (`environ()`). `timeout` only guards against a
        hang: it stays above the CLI's own limits (a target's torch import may take 180 s), so that a busy
        machine is not a failure (`config --hf` took over 120 s at a load of 27 and was killed here)."""
        return run_cli(*args, base_env=self.environ(), timeout=timeout)

    def detect_json(self, *args: str) -> dict:
        result = self.run_cli("detect", "--json", *args)
        assert result.returncode == 0, result.stderr
        return result.json
