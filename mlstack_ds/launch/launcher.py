"""Start the worker package on N ranks, bound the launch in time, and leave nothing of it running.

`python -m torch.distributed.run` on one machine (loopback, a free port); over several nodes a launch's
own `RankStart` (launch/pdsh.py: DeepSpeed's launcher; launch/srun.py: srun tasks) builds the argv. The
subprocess goes through `mlstack_ds.runner.run`, which kills the launcher's process group on time-out.
torchrun starts each rank in a session of its own, so that is not enough: every process of a launch
carries `MLSTACK_VERIFY_RUN_ID=<id>` in its environment (children inherit it), ranks ask the kernel to
kill them when their launcher dies, and after every launch `sweep` kills whatever still carries the
marker. The whole sequence around a launch (nodes, results) is session.py's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlstack_ds import runner
from mlstack_ds.errors import ToolError, ToolStalled, ToolTimedOut
from mlstack_ds.patience import Patience

RUN_ID_ENV = "MLSTACK_VERIFY_RUN_ID"
# The worker package (mlstack_ds/worker/) is copied into each launch's directory under this name
# and run with `-m`, so the target interpreter imports it without the tool being installed there.
WORKER_PACKAGE = Path(__file__).resolve().parents[1] / "worker"
WORKER_MODULE = "mlstack_verify_worker"


def new_run_id() -> str:
    return f"mlstack-verify-{uuid.uuid4().hex[:16]}"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it; small race window, as with torchrun)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def stage_worker(directory: Path) -> Path:
    """Copy the worker package to `directory/mlstack_verify_worker`; returns the directory for PYTHONPATH.

    A copy, not the tool's own path on PYTHONPATH: that would put every other module of the tool's
    environment in front of the target's (its torch, if it has one)."""
    package = directory / WORKER_MODULE
    package.mkdir(parents=True, exist_ok=True)
    for source in sorted(WORKER_PACKAGE.glob("*.py")):
        shutil.copy2(source, package / source.name)
    return directory


def worker_env(base: Mapping[str, str], staged: Path) -> dict[str, str]:
    """`base` with the staged worker first on PYTHONPATH (the user's PYTHONPATH is kept after it)."""
    existing = base.get("PYTHONPATH", "")
    return {**base, "PYTHONPATH": os.pathsep.join(p for p in (str(staged), existing) if p)}


def worker_args(checks: Sequence[str], out_dir: Path, timeout_s: float, run_id: str,
                receipt: Path | None = None, *, ds_config: Path | None = None) -> list[str]:
    """The worker's module name and arguments; the launcher's own module flag goes before them."""
    args = [WORKER_MODULE, "--checks", ",".join(checks), "--out", str(out_dir), "--timeout", f"{timeout_s:g}",
            "--run-id", run_id]
    if receipt is not None:
        args += ["--receipt", str(receipt)]
    if ds_config is not None:
        args += ["--ds-config", str(ds_config)]
    return args


def torchrun_argv(python: Path, world_size: int, port: int, args: Sequence[str]) -> list[str]:
    """Single node: `python -m torch.distributed.run` on loopback, no restarts (a failure is a result)."""
    return [str(python), "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world_size),
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "0", "--module", *args]


@dataclass(frozen=True)
class LaunchOutcome:
    returncode: int | None
    duration_s: float
    timed_out: bool
    log_tail: str
    rank_exit_codes: Mapping[int, int] = field(default_factory=dict)
    ended_by: str = ""  # what ended the ranks from outside (a Slurm job's time limit): the reason to give
    stalled: bool = False  # timed out by the stall rule (no progress for stall_s), not the ceiling


def run_launch(argv: Sequence[str], *, patience: Patience, run_id: str,
               env: Mapping[str, str] | None = None, cwd: Path | None = None,
               progress: Callable[[], object] | None = None) -> LaunchOutcome:
    """Run one launch to completion or time-out; afterwards no process of it is left. With
    `patience.stall_s`, it is also stopped when `progress()` (the ranks' result files) stays the same that long."""
    launch_env = {**(env if env is not None else os.environ), RUN_ID_ENV: run_id, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    try:
        result = runner.run(argv, patience=patience, env=launch_env, cwd=cwd, progress=progress)
    except ToolStalled:
        return LaunchOutcome(None, time.monotonic() - started, True, "", stalled=True)
    except ToolTimedOut:
        return LaunchOutcome(None, time.monotonic() - started, True, "")
    except ToolError as exc:
        return LaunchOutcome(None, time.monotonic() - started, False, exc.message)
    finally:  # also on Ctrl-C: runner kills the launcher's group, this kills the ranks' sessions
        sweep(run_id)
    return LaunchOutcome(result.returncode, result.duration_s, False, result.tail(40),
                         rank_exit_codes(result.stderr + result.stdout))


def rank_exit_codes(log: str) -> dict[int, int]:
    """torchrun's failure summary (`rank : 1 (local_rank: 1)` / `exitcode : 17`) as {rank: code}."""
    codes = {}
    for match in re.finditer(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", log):
        codes[int(match.group(1))] = int(match.group(2))
    return codes


def processes_with_marker(run_id: str) -> list[int]:
    """PIDs whose environment carries this launch's marker (Linux /proc; the caller itself excluded)."""
    needle = f"{RUN_ID_ENV}={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def sweep(run_id: str, grace_s: float = 5.0) -> list[int]:
    """SIGKILL every process of the launch still alive; wait until they are gone. Returns the PIDs hit."""
    if not sys.platform.startswith("linux"):
        return []
    killed: list[int] = []
    deadline = time.monotonic() + grace_s
    while True:
        alive = [pid for pid in processes_with_marker(run_id) if not _is_zombie(pid)]
        if not alive or time.monotonic() > deadline:
            return killed
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"
