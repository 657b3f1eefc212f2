"""Run mlstack-ds itself on a node over ssh: the same interpreter and package directory as here.

Why the same paths and not "whatever mlstack-ds the node has": `install --hostfile` builds the wheel
here and has each node install it with its own plan; a node running another version of the tool could
plan (and name the cache entry) differently. So the node runs `<this sys.executable> -m mlstack_ds` with
this package's directory first on PYTHONPATH (a checkout run with PYTHONPATH works as an installed tool
does), and is refused when that does not answer with this version.
Only the variables that change a plan are passed on (ssh gives the remote command the node's own
login environment otherwise).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlstack_ds
from mlstack_ds import __version__
from mlstack_ds.cluster import remote
from mlstack_ds.errors import EnvironmentProblem, ToolTimedOut
from mlstack_ds.patience import WAITS, Patience
from mlstack_ds.target_side import mlstack_package_origin as origin_module
from mlstack_ds.target_side import source

# What makes two hosts plan different builds (detect's TRACKED_ENV_VARS minus device visibility, which is
# each node's own business), and the tool's debug switch.
PLAN_VARIABLES = ("PYTORCH_ROCM_ARCH", "DS_ACCELERATOR", "ROCM_PATH", "ROCM_HOME", "HIP_PLATFORM",
                  "TORCH_CUDA_ARCH_LIST", "CXX", "HSA_OVERRIDE_GFX_VERSION", "MLSTACK_DEBUG")
RUN_MARKER = "mlstack-run="  # `-X mlstack-run=ID` on a node's command line: the run that started it
SAME_PATH_HINT = "install mlstack-ds at the same path on every node, or on a shared file system"


@dataclass(frozen=True)
class ToolRun:
    """A remote `mlstack-ds ... --json`: its exit code, its document (None if it printed none) and stderr."""

    returncode: int
    document: dict[str, Any] | None
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def error_message(self) -> str:
        """The node's own one-line error (its --json error entry), else the last line it printed."""
        error = (self.document or {}).get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        return lines[-1] if lines else f"exit code {self.returncode}"

    def error_hint(self) -> str:
        error = (self.document or {}).get("error")
        return str(error.get("hint") or "") if isinstance(error, dict) else ""


def tool_argv(args: Sequence[str | Path], environ: Mapping[str, str] | None = None, *,
              run_id: str | None = None) -> list[str]:
    """`env VAR=... PYTHONPATH=<this package's parent> <this python> [-X mlstack-run=ID] -m mlstack_ds ARGS`.

    `run_id` marks the node's process with the run it belongs to, so that `SshNodes.stop(run_id)` finds it
    there (`pkill -f`): Python keeps an unknown `-X` option in sys._xoptions and ignores it, and it stays in
    the interpreter's own command line (an environment variable would not show; `env` execs the interpreter)."""
    marker = ["-X", f"{RUN_MARKER}{run_id}"] if run_id else []
    return [*_interpreter_argv(environ), *marker, "-m", "mlstack_ds", *map(str, args)]


def beating_tool_argv(args: Sequence[str | Path]) -> list[str]:
    """`tool_argv(ARGS)` under cluster/heartbeat.py: the node's sign of life on stderr every few seconds while
    it runs (for srun, which has none of its own; ssh has ServerAlive)."""
    return [*_interpreter_argv(), "-m", "mlstack_ds.cluster.heartbeat", "--", *tool_argv(args)]


def _interpreter_argv(environ: Mapping[str, str] | None = None) -> list[str]:
    environ = os.environ if environ is None else environ
    passed = [f"{k}={environ[k]}" for k in PLAN_VARIABLES if environ.get(k)]
    return ["env", *passed, f"PYTHONPATH={_package_file().parent.parent}", sys.executable]


def _package_file() -> Path:
    return Path(mlstack_ds.__file__).resolve()


def check_tool(host: str) -> None:
    """The node runs this very mlstack-ds: the same interpreter path imports the package from the same
    file, at the same version (a node with its own install elsewhere is refused too); EnvironmentProblem
    otherwise."""
    # From stdin, not by path: a node without this package must answer as an interpreter that cannot
    # import it, not as one that cannot open a file of it.
    result = remote.run_on(host, [*_interpreter_argv(), "-", "mlstack_ds"], input_text=source(origin_module),
                           patience=WAITS["ssh command"])
    gone = remote.unreachable(result, host)
    if gone is not None:
        raise gone.error()
    expected = f"{__version__} {_package_file()}"
    if result.ok and result.stdout.strip() == expected:
        return
    said = (f"it has mlstack-ds {result.stdout.strip()}" if result.ok
            else result.tail(1) or f"exit code {result.returncode}")
    raise EnvironmentProblem(f"node {host}: mlstack-ds {__version__} is not at {sys.executable} with its package "
                             f"at {_package_file().parent} there ({said})", hint=SAME_PATH_HINT)


def run_tool(host: str, args: Sequence[str | Path], *, patience: Patience, run_id: str | None = None) -> ToolRun:
    """`mlstack-ds ARGS --json` on `host` (marked with `run_id`: see `tool_argv`); ssh failing (not the
    command) is EnvironmentProblem."""
    try:
        result = remote.run_on(host, tool_argv([*args, "--json"], run_id=run_id), patience=patience)
    except ToolTimedOut as exc:
        raise tool_timed_out(host, args, patience) from exc
    gone = remote.unreachable(result, host)
    if gone is not None:
        raise gone.error()
    return ToolRun(result.returncode, parse_document(result.stdout), result.stderr)


def tool_timed_out(host: str, args: Sequence[str | Path], patience: Patience) -> EnvironmentProblem:
    """The one error of a node whose `mlstack-ds ARGS` outlived its time, whatever reached the node."""
    return EnvironmentProblem(f"node {host}: mlstack-ds {args[0]} did not finish within {patience.ceiling_s:g} s",
                              hint="see what the node is doing; nothing else waits for it")


def parse_document(text: str) -> dict[str, Any] | None:
    """The tool's `--json` document in what a node printed; None when it printed none (a crash, a missing
    tool), so the caller falls back to the node's stderr."""
    try:
        document = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def answered_code(document: dict[str, Any] | None, fallback: int) -> int:
    """A node's exit code from its document, for transports that see only the whole step's (srun): the
    error's own exit code, 0 for a document without an error, else `fallback`."""
    if document is None:
        return fallback or 1
    error = document.get("error")
    if not isinstance(error, dict):
        return 0
    code = error.get("exit_code")
    return code if isinstance(code, int) and code else fallback or 1
