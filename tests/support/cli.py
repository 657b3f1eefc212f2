"""The one place the tests start the CLI: `mlstack-ds` as a real subprocess (`python -m mlstack_ds`), as a
user's shell would run it. Nothing is mocked; tests read its exit code, stdout and stderr.

`run_cli(...)` runs it to the end and returns a `CliResult` (a `subprocess.CompletedProcess` with `.json`
and `.one_error()`); `start_cli(...)` returns the running `Popen`, for the tests that signal it (Ctrl-C),
read it while it runs or close its pipes. `prefix` runs it under another command (`nice`, `nsenter` into a
test host), `python` under another interpreter than the test venv's.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import IO, Any

PathLike = str | os.PathLike[str]


class CliResult(subprocess.CompletedProcess[str]):
    """What one run of the CLI did: `returncode`, `stdout`, `stderr`, `args`."""

    @cached_property
    def json(self) -> Any:
        """stdout parsed as the one JSON document `--json` prints (fails the test, with stderr, if it is not)."""
        try:
            return json.loads(self.stdout)
        except (TypeError, json.JSONDecodeError) as exc:
            raise AssertionError(f"stdout is not one JSON document ({exc}); exit {self.returncode}\n"
                                 f"stdout: {str(self.stdout)[-2000:]}\nstderr: {str(self.stderr)[-3000:]}") from exc

    def one_error(self) -> tuple[str, str]:
        """The CLI's failure contract: stderr holds exactly one `error: ` line and one `hint: ` line, after
        it, and no traceback. Returns (error line, hint line)."""
        return assert_one_error(self.stderr)


def assert_one_error(stderr: str) -> tuple[str, str]:
    """`CliResult.one_error()` for stderr read some other way (a `start_cli` process)."""
    lines = stderr.splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    hints = [i for i, line in enumerate(lines) if line.startswith("hint: ")]
    assert len(errors) == 1 and len(hints) == 1, f"not one error and one hint:\n{stderr[-3000:]}"
    assert errors[0] < hints[0], f"the hint comes before the error:\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    return lines[errors[0]], lines[hints[0]]


def cli_argv(*args: PathLike, python: PathLike | None = None, prefix: Sequence[PathLike] = ()) -> list[str]:
    """The command line that starts `mlstack-ds ARGS` (under `prefix`, with `python`)."""
    return [*map(str, prefix), str(python or sys.executable), "-m", "mlstack_ds", *map(str, args)]


def cli_env(env: Mapping[str, str] | None = None, *, base: Mapping[str, str] | None = None,
            columns: int | str | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with `env` on top, and COLUMNS when given."""
    merged = {**(os.environ if base is None else base), **(env or {})}
    if columns is not None:
        merged["COLUMNS"] = str(columns)
    return merged


def run_cli(*args: PathLike, python: PathLike | None = None, env: Mapping[str, str] | None = None,
            base_env: Mapping[str, str] | None = None, columns: int | str | None = None,
            input: str | None = None, timeout: float = 600, cwd: PathLike | None = None,
            prefix: Sequence[PathLike] = (), stdout: int | IO[Any] | None = subprocess.PIPE,
            stderr: int | IO[Any] | None = subprocess.PIPE, **popen: Any) -> CliResult:
    """Run `mlstack-ds ARGS` to the end (killed after `timeout` s, a guard against hangs). The environment
    is `base_env` (default os.environ) with `env` on top (and COLUMNS=`columns` when given); `input` is its
    stdin (default: none given, it inherits the test's). `stdout`/`stderr` may be a file instead of a pipe;
    other Popen arguments (`preexec_fn`) pass through."""
    argv = cli_argv(*args, python=python, prefix=prefix)
    done = subprocess.run(argv, input=input, stdout=stdout, stderr=stderr, text=True, timeout=timeout,
                          env=cli_env(env, base=base_env, columns=columns), cwd=cwd, check=False, **popen)
    return CliResult(done.args, done.returncode, done.stdout, done.stderr)


def start_cli(*args: PathLike, python: PathLike | None = None, env: Mapping[str, str] | None = None,
              base_env: Mapping[str, str] | None = None, columns: int | str | None = None,
              cwd: PathLike | None = None, prefix: Sequence[PathLike] = (), text: bool = True,
              **popen: Any) -> subprocess.Popen[Any]:
    """Start `mlstack-ds ARGS` and return it running (stdout and stderr piped unless `popen` says
    otherwise; other Popen arguments pass through). The caller waits for it, or kills it."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(cli_argv(*args, python=python, prefix=prefix), text=text,
                            env=cli_env(env, base=base_env, columns=columns),
                            cwd=Path(cwd) if cwd is not None else None, **popen)


WRAPPER = Path(__file__).resolve().parents[2] / "scripts" / "install_deepspeed.sh"


def run_wrapper(*args: PathLike, timeout: float = 1200, env: Mapping[str, str] | None = None) -> CliResult:
    """Run the README's main command, `scripts/install_deepspeed.sh ARGS` (which installs the tool into a
    venv and starts it there), to the end; COLUMNS=200 as the CLI tests use."""
    done = subprocess.run(["bash", str(WRAPPER), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=cli_env(env, columns=200), check=False)
    return CliResult(done.args, done.returncode, done.stdout, done.stderr)

def readme_main_command() -> list[str]:
    """The arguments of the README's main command (its one `scripts/install_deepspeed.sh ...` line in the
    "Set-up on a fresh machine" section), so the test of that command runs what the README says."""
    readme = (WRAPPER.parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Set-up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    (line,) = [line for line in section.splitlines() if line.startswith("scripts/install_deepspeed.sh")]
    return shlex.split(line)[1:]


def cli_commands() -> dict[str, Any]:
    """Every leaf command of the app by its path (`patches list`), as click sees it: for tests that read the
    declared options without running anything."""
    import typer

    from mlstack_ds.cli.app import build_app

    found: dict[str, Any] = {}

    def walk(command: Any, path: str) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                walk(sub, f"{path} {name}".strip())
        else:
            found[path] = command

    walk(typer.main.get_command(build_app()), "")
    return found


def command_options(command: Any) -> dict[str, Any]:
    """A command's click parameters by every flag they answer to (`--config` and `--ds-config` alike)."""
    return {opt: param for param in getattr(command, "params", []) for opt in getattr(param, "opts", [])}


class StreamedLines:
    """A running CLI's stderr (or any text stream), read line by line by a thread of its own, so that a test
    can wait for the status line that says a step happened (not a sleep) and still read everything after.

    Why a thread: `readline()` on the pipe would block past a deadline when the CLI hangs."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait_for(self, text: str, timeout: float) -> str:
        """The first line containing `text`; AssertionError with what was read when the stream ends or
        `timeout` s pass without one."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = next((line for line in self.lines if text in line), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise AssertionError(f"no line with {text!r} ({'stream ended' if self._closed else 'timed out'}"
                                         "):\n" + "\n".join(self.lines[-40:]))
                self._changed.wait(left)

    def text(self, timeout: float = 60) -> str:
        """Everything read, once the stream has ended (the process exited)."""
        self._reader.join(timeout)
        with self._changed:
            return "\n".join(self.lines)
