"""The one place that starts subprocesses.

Why one place: argv lists only (never a shell), a `Patience` on every call (mlstack_ds/patience.py: the
one table of the tool's waits, so no caller brings a number of its own), the child's whole process
group killed on time-out so nothing is left running, and uniform errors (`ToolMissing`,
`ToolTimedOut`, `ToolStalled`) that callers turn into warnings or user-facing messages.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from mlstack_ds.errors import ToolError, ToolMissing, ToolStalled, ToolTimedOut
from mlstack_ds.patience import WAITS, Patience

T = TypeVar("T")


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
    patience: Patience,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    input_text: str | None = None,
    pass_fds: Sequence[int] = (),
    terminate_s: float = 0.0,
    progress: Callable[[], object] | None = None,
    stall_on_stderr: bool = False,
) -> RunResult:
    """Run `argv` to completion, capturing text output; raise ToolMissing/ToolTimedOut/ToolError.

    A non-zero exit is *not* an exception: callers decide what it means. `pass_fds`: descriptors the
    child keeps (an install lock, held as long as the pip holding it runs). On time-out or Ctrl-C the
    child's session is SIGKILLed; with `terminate_s`, it gets SIGTERM first and that long to exit (srun:
    SIGTERM makes it kill its job step on every node, SIGKILL would leave the step running).
    `patience` (an entry of patience.WAITS, or a user's option made into one), `progress`: see
    `wait_patiently`. `stall_on_stderr`: progress is what the child has written to stderr so far (a remote
    task's heartbeat through srun, cluster/heartbeat.py: the local srun itself is idle however the task
    fares), so `patience.stall_s` is how long it may stay silent.
    """
    args = tuple(os.fspath(a) for a in argv)
    started = time.monotonic()
    # stderr into a file when its growth is the progress: communicate() shows a pipe's text only at the end
    err_file = (tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # noqa: SIM115 closed below
                if stall_on_stderr else None)
    try:
        proc = _start(args, stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                      stdout=subprocess.PIPE, stderr=err_file or subprocess.PIPE, env=env, cwd=cwd,
                      pass_fds=pass_fds)
        first = [True]

        def communicate(seconds: float) -> tuple[str, str]:
            # Retrying communicate() after its TimeoutExpired loses no output and no input (Popen keeps both).
            sent, first[0] = input_text if first[0] else None, False
            return proc.communicate(input=sent, timeout=seconds)

        how = ""
        if err_file is not None:
            progress, how = _file_size(err_file), " (printed nothing)"
        try:
            stdout, stderr = wait_patiently(proc, communicate, args, started=started, patience=patience,
                                            progress=progress, how=how)
        except BaseException:
            _terminate(proc, terminate_s)
            raise
        if err_file is not None:
            err_file.seek(0)
            stderr = err_file.read()
        return RunResult(args, proc.returncode, stdout, stderr, time.monotonic() - started)
    finally:
        if err_file is not None:
            err_file.close()


def _file_size(file: Any) -> Callable[[], int]:
    return lambda: os.fstat(file.fileno()).st_size


POLL_S = 1.0  # how often a patient wait looks at the child's progress


def wait_patiently(proc: subprocess.Popen[str], wait: Callable[[float], T], args: tuple[str, ...], *,
                   started: float, patience: Patience, progress: Callable[[], object] | None = None,
                   how: str = "") -> T:
    """`wait(seconds)` (raising TimeoutExpired) until the child ends; ToolTimedOut when `patience.ceiling_s`
    have passed since `started`, or, with `patience.stall_s`, ToolStalled when it made no progress for that long:
    `progress()` returned the same value all that time (default: its session's CPU, faults and I/O).

    Why progress and not only wall time: a torch import takes 10 s on a quiet machine and minutes on one
    thrashing under parallel compiles (measured: 111 s at a load of 25, against a 120 s limit). Killed
    there, the tool answered "PyTorch is not installed". A hung driver or lock uses no CPU and reads
    nothing, so it is still stopped after `stall_s`; a slow import keeps going up to the ceiling. `how`: what
    "no progress" meant, for the message (a given `progress`'s own words)."""
    ceiling_s, stall_s = patience.ceiling_s, patience.stall_s
    deadline = started + ceiling_s
    if stall_s is None:
        try:
            return wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as exc:
            raise _timed_out(args, ceiling_s) from exc
    look = progress if progress is not None else lambda: session_progress(proc.pid)
    seen, moved = look(), time.monotonic()
    while True:
        now = time.monotonic()
        try:
            return wait(max(0.0, min(POLL_S, deadline - now, moved + stall_s - now)))
        except subprocess.TimeoutExpired as exc:
            now = time.monotonic()
            current = look()
            if current != seen:
                seen, moved = current, now
            if now >= deadline:
                raise _timed_out(args, ceiling_s) from exc
            if now - moved >= stall_s:
                raise _stalled(args, stall_s, how if progress is not None else
                               " (no CPU time, page faults or reads)") from exc


def _terminate(proc: subprocess.Popen[str], grace_s: float) -> None:
    """SIGTERM to the child's group and up to `grace_s` to exit (when positive), then `_kill_group`."""
    if grace_s > 0 and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            proc.communicate(timeout=grace_s)
    _kill_group(proc)


class Background:
    """A subprocess started now and collected later: one thread asks the slow probe (an interpreter
    importing torch) and, meanwhile, runs the quick tools, and Ctrl-C still stops both at once."""

    def __init__(self, args: tuple[str, ...], patience: Patience, env: Mapping[str, str] | None,
                 input_text: str | None = None, stall_on_stderr: bool = False, *, pass_fds: Sequence[int] = (),
                 stdout_file: IO[str] | None = None) -> None:
        self.args = args
        self.patience = patience
        self.stall_on_stderr = stall_on_stderr
        self.started = time.monotonic()
        # Files, not pipes: nobody reads the output until result(), and a full pipe would stall the child.
        self._out = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # noqa: SIM115 close()
        self._err = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # noqa: SIM115 close()
        self._in = None  # `input_text`, from a file too: nobody writes to a pipe while the caller waits
        if input_text is not None:
            self._in = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # noqa: SIM115 close()
            self._in.write(input_text)
            self._in.seek(0)
        self._proc: subprocess.Popen[str] | None = None
        self._start_error: ToolError | None = None
        try:
            self._proc = _start(args, stdin=self._in if self._in is not None else subprocess.DEVNULL,
                                stdout=stdout_file or self._out, stderr=self._err if stdout_file is None else
                                subprocess.STDOUT, env=env, cwd=None, pass_fds=pass_fds)
        except ToolError as exc:
            self._start_error = exc

    def result(self) -> RunResult:
        """Wait for the rest of the time-out; raise like `run` does (missing, failed to start, timed out)."""
        if self._start_error is not None:
            raise self._start_error
        assert self._proc is not None
        try:
            wait_patiently(self._proc, lambda seconds: self._proc.wait(timeout=seconds),  # type: ignore[union-attr]
                           self.args, started=self.started, patience=self.patience,
                           progress=_file_size(self._err) if self.stall_on_stderr else None,
                           how=" (printed nothing)" if self.stall_on_stderr else "")
        except ToolTimedOut:
            _kill_group(self._proc)
            raise
        self._out.seek(0)
        self._err.seek(0)
        return RunResult(self.args, self._proc.returncode, self._out.read(), self._err.read(),
                         time.monotonic() - self.started)

    def partial_stdout(self) -> str:
        """What the child wrote to stdout before it stopped, also after `result()` raised on a time-out: a
        probe that prints in stages keeps the stages it finished when a later one hangs."""
        if self._proc is None or self._out.closed:
            return ""
        self._out.seek(0)
        return self._out.read()

    def close(self) -> None:
        """Kill the process group if it is still running (an early exit, Ctrl-C); drop the output files."""
        if self._proc is not None and self._proc.poll() is None:
            _kill_group(self._proc)
        self._out.close()
        self._err.close()
        if self._in is not None:
            self._in.close()


@contextlib.contextmanager
def run_in_background(
    argv: Sequence[str | os.PathLike[str]],
    *,
    patience: Patience,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
    stall_on_stderr: bool = False,
    pass_fds: Sequence[int] = (),
    stdout_file: IO[str] | None = None,
) -> Iterator[Background]:
    """Start `argv` for the duration of the block; whatever is left running at its end is killed.
    `patience`: see `wait_patiently`; `stall_on_stderr`: see `run`; `pass_fds`: kept open in the child;
    `stdout_file`: where its stdout and stderr go together (a log), instead of files for `result()`."""
    handle = Background(tuple(os.fspath(a) for a in argv), patience, env, input_text, stall_on_stderr,
                        pass_fds=pass_fds, stdout_file=stdout_file)
    try:
        yield handle
    finally:
        handle.close()


def _start(args: tuple[str, ...], *, stdin: Any, stdout: Any, stderr: Any, env: Mapping[str, str] | None,
           cwd: Path | None, line_buffered: bool = False, pass_fds: Sequence[int] = (),
           own_session: bool = True) -> subprocess.Popen[str]:
    """Popen in a new session (so the whole group can be killed; `own_session=False`: in this one, for
    `run_beating`'s child); start failures become ToolErrors.

    Either the child is returned running, or it is killed and the error (or Ctrl-C) raised: no child is
    ever left without a Popen object the caller can kill. Ctrl-C or SIGTERM are therefore held while the
    child starts: CPython runs their handler as `_fork_exec` returns, before Popen has stored the child's
    pid, so the child ran on unseen (measured: 29 of 40 signals sent by a starting child landed there).
    """
    proc: subprocess.Popen[str] = subprocess.Popen.__new__(subprocess.Popen)
    try:
        with _interrupts_held() as held:
            try:
                proc.__init__(  # type: ignore[misc]
                    args, stdin=stdin, stdout=stdout, stderr=stderr, env=dict(env) if env is not None else None,
                    cwd=cwd, text=True, errors="replace", start_new_session=own_session,
                    bufsize=1 if line_buffered else -1, pass_fds=tuple(pass_fds),
                )
            except FileNotFoundError as exc:
                raise ToolMissing(f"{args[0]}: not found", hint="install it or put it on PATH") from exc
            except OSError as exc:
                raise ToolError(f"{args[0]}: cannot start ({exc.strerror or exc})") from exc
            if held:  # the caller is being stopped: it never gets this child, so the child goes now
                _kill_unreturned(proc.pid)
    except BaseException:
        # Whatever leaves here leaves without the child: a held stop raised on leaving the block, a start
        # error, or a stop that arrives while the handlers are put back (the restored handler raises it there).
        _kill_unreturned(getattr(proc, "pid", None))
        raise
    return proc


def _kill_unreturned(pid: int | None) -> None:
    if not pid:
        return
    for kill in (os.killpg, os.kill):  # its group, and itself if it has not made the group yet
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


@contextlib.contextmanager
def _interrupts_held() -> Iterator[list[tuple[int, Any]]]:
    """SIGINT and SIGTERM recorded instead of handled for the block, then handled on leaving it (which
    raises KeyboardInterrupt). Only the main thread runs Python signal handlers; elsewhere nothing is held."""
    held: list[tuple[int, Any]] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    recorded = {sig: handler for sig, handler in previous.items() if callable(handler)}
    for sig in recorded:
        signal.signal(sig, lambda signum, frame: held.append((signum, frame)))
    try:
        yield held
    finally:
        for sig, handler in recorded.items():
            signal.signal(sig, handler)
        for signum, frame in held[:1]:  # one stop is enough; the handler raises
            recorded[signum](signum, frame)


def _processes(proc_root: Path) -> Iterator[tuple[int, int, int]]:
    """(pid, parent pid, session id) of every process in /proc/<pid>/stat; nothing where /proc is absent."""
    with contextlib.suppress(OSError):
        for entry in proc_root.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
                fields = stat[stat.rindex(")") + 2:].split()  # after "(comm)", which may hold spaces
                yield int(entry.name), int(fields[1]), int(fields[3])
            except (OSError, ValueError, IndexError):
                continue


def session_progress(session: int, proc_root: Path = Path("/proc")) -> tuple[int, ...]:
    """What the processes of `session` have done so far: CPU ticks, page faults (major ones are page-ins
    from disk: a thrashing import makes them while it gets no CPU) and bytes read or written, per process.
    Any change means progress; a process that starts or ends changes it too."""
    done = []
    for pid in session_members(session, proc_root):
        try:
            stat = (proc_root / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
            fields = stat[stat.rindex(")") + 2:].split()
            counters = [int(fields[i]) for i in (7, 8, 9, 10, 11, 12, 13, 14)]  # faults, then CPU ticks
        except (OSError, ValueError, IndexError):
            continue
        with contextlib.suppress(OSError, ValueError, KeyError):  # io: absent without task accounting
            io = dict(line.split(": ") for line in (proc_root / str(pid) / "io").read_text().splitlines())
            counters += [int(io["rchar"]), int(io["wchar"])]
        done.append((pid, *counters))
    return tuple(x for entry in sorted(done) for x in entry)


def session_members(session: int, proc_root: Path = Path("/proc")) -> list[int]:
    """Processes whose session id is `session`."""
    return [pid for pid, _ppid, sid in _processes(proc_root) if sid == session]


def kill_child_sessions(parent: int | None = None, proc_root: Path = Path("/proc")) -> list[int]:
    """SIGKILL everything the runner started for this process that is still running: each child that
    leads its own session (every `_start` does), with its whole session. Returns the children killed.

    For Ctrl-C while other threads wait on commands (the fan-out over nodes): the interrupt reaches only
    the main thread, and the interpreter waits for the others at exit, so their commands must end now.
    """
    parent = os.getpid() if parent is None else parent
    leaders = [pid for pid, ppid, sid in _processes(proc_root) if ppid == parent and sid == pid]
    for leader in leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
        for member in session_members(leader, proc_root):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member, signal.SIGKILL)
    return leaders


def _stalled(args: tuple[str, ...], stall_s: float, how: str) -> ToolStalled:
    return ToolStalled(
        f"{Path(args[0]).name} made no progress for {stall_s:g} s{how}",
        hint="it is hanging, e.g. on a driver, a device or a lock; run it by hand to see",
    )


def _timed_out(args: tuple[str, ...], ceiling_s: float) -> ToolTimedOut:
    return ToolTimedOut(
        f"{Path(args[0]).name} did not finish within {ceiling_s:g} s",
        hint="the tool may be hanging on a driver or device; run it by hand to see",
    )


def run_beating(argv: Sequence[str | os.PathLike[str]], *, every_s: float, beat: Callable[[], None]) -> int:
    """Run `argv` with this process's stdin, stdout and stderr, calling `beat()` every `every_s` seconds until
    it ends (cluster/heartbeat.py: a node task's sign of life); its exit code, 128+N when signal N ended it.

    No patience: whoever started this process decides how long it may run and stops it with a signal. The
    child stays in this process's group and session (not a session of its own, as `_start` otherwise gives),
    so what stops a task (slurmstepd signals every process of the step, or its process group) reaches it
    directly; this process then only outlives the signal (SIGTERM: the tool finishes a package swap it is
    in) and reports how the child ended. Passing the signal on would deliver it twice."""
    args = tuple(os.fspath(a) for a in argv)
    proc = _start(args, stdin=None, stdout=None, stderr=None, env=None, cwd=None, own_session=False)
    outlived = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {signum: signal.signal(signum, lambda _signum, _frame: None) for signum in outlived}
    try:
        while True:
            try:
                code = proc.wait(timeout=every_s)
                return code if code >= 0 else 128 - code
            except subprocess.TimeoutExpired:
                beat()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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
        proc = _start(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                      cwd=cwd, line_buffered=True)
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
    """Kill the child and everything it started (it leads its own session).

    Its process group is not enough: ninja starts each compile in a process group of its own, so a
    build killed by group leaves its compilers running. They stay in the child's session, so every
    process of that session is killed too.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in session_members(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=WAITS["reap killed child"].ceiling_s)
    except (subprocess.TimeoutExpired, ValueError):
        proc.kill()
