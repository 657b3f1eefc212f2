"""The one place that starts subprocesses.

Why one place: argv lists only (never a shell), a time-out on every call, the child's whole process
group killed on time-out so nothing is left running, and uniform errors (`ToolMissing`,
`ToolTimedOut`) that callers turn into warnings or user-facing messages.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlstack_ds.errors import ToolError, ToolMissing, ToolTimedOut

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RunResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, lines: int = 20) -> str:
        """The last lines of stderr (or stdout when stderr is empty): what a user needs to see."""
        text = self.stderr.strip() or self.stdout.strip()
        # Drop caret/tilde underline lines of Python tracebacks: they say nothing on their own.
        meaningful = [ln for ln in text.splitlines() if ln.strip() and set(ln.strip()) - set("^~ ")]
        return "\n".join(meaningful[-lines:])


def which(name: str, extra_dirs: Iterable[Path] = (), path: str | None = None) -> Path | None:
    """Find an executable on PATH first, then in `extra_dirs` (e.g. `<rocm>/bin`)."""
    found = shutil.which(name, path=path)
    if found:
        return Path(found)
    for directory in extra_dirs:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    input_text: str | None = None,
) -> RunResult:
    """Run `argv` to completion, capturing text output; raise ToolMissing/ToolTimedOut/ToolError.

    A non-zero exit is *not* an exception: callers decide what it means.
    """
    args = tuple(os.fspath(a) for a in argv)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise ToolMissing(f"{args[0]}: not found", hint="install it or put it on PATH") from exc
    except OSError as exc:
        raise ToolError(f"{args[0]}: cannot start ({exc.strerror or exc})") from exc
    try:
        stdout, stderr = proc.communicate(input=input_text, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        raise ToolTimedOut(
            f"{Path(args[0]).name} did not finish within {timeout:g} s",
            hint="the tool may be hanging on a driver or device; run it by hand to see",
        ) from exc
    except BaseException:
        _kill_group(proc)
        raise
    return RunResult(args, proc.returncode, stdout, stderr, time.monotonic() - started)


def run_streaming(
    argv: Sequence[str | os.PathLike[str]],
    *,
    log_path: Path,
    on_line: Callable[[str], None] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> RunResult:
    """Run a long job (a build): stdout+stderr go line by line to `log_path` and to `on_line`.

    On KeyboardInterrupt (Ctrl-C, or SIGTERM turned into it by the caller) the whole process group is
    killed before the exception propagates, so no compiler keeps running behind the user's back.
    The result's stdout is the last 200 lines of output; the full text is in the log.
    """
    args = tuple(os.fspath(a) for a in argv)
    started = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=200)
    with log_path.open("w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(args)}\n")
        try:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None, cwd=cwd, text=True, errors="replace",
                start_new_session=True, bufsize=1,
            )
        except FileNotFoundError as exc:
            raise ToolMissing(f"{args[0]}: not found", hint="install it or put it on PATH") from exc
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                tail.append(line.rstrip("\n"))
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            proc.wait()
        except BaseException:
            _kill_group(proc)
            raise
    return RunResult(args, proc.returncode, "\n".join(tail), "", time.monotonic() - started)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the child and everything it started (it leads its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError):
        proc.kill()
