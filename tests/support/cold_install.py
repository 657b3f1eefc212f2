"""The session's cold `mlstack-ds install`s, started in the background when the session begins: the default
pin's, and the second pin's (DeepSpeed 0.19.8) after it, one build at a time.

The cold build compiles for minutes, several ops at once (buildjobs: up to four compilers on two cores).
It runs at a lower priority (nice 10), so the rest of the suite, running meanwhile, keeps the cores it
needs and its time-outs mean what they say; the build takes what is left. The tests that need the
installed target are moved to the end of the run (tests/conftest.py), and the first of them waits for the
install here. The second pin's install waits for the first to finish (two builds at once would only halve
each other's cores) and overlaps the default pin's tests; its own tests run last.

Both run on a thread while tests run, and tests change os.environ (monkeypatch: PIP_NO_INDEX and PIP_FIND_LINKS
pointing pip at an empty mirror, in tests/integration/test_source_fetch.py). So each install takes a copy of the
environment when it is made, at the start of the session, and its pip and its `mlstack-ds install` get that copy,
never os.environ as it is at the moment they start: CI's run of 72dc275 made the second pin's venv during such a
test and pip said "Cannot install torch==2.13.0 because these package versions have conflicting dependencies".
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path

from .cli import CliResult, start_cli
from .e2e import Target
from .pins import CLIENT_PACKAGES, TORCH_PIN
from .target_env import make_venv

INSTALLED_TARGET_FIXTURE = "installed_target"
INSTALLED_NEXT_TARGET_FIXTURE = "installed_next_target"


class BackgroundInstall:
    """Make the target venv (`requirements`: torch pinned, plus the Hugging Face clients verify's hf_trainer check
    uses), then run `mlstack-ds install --json` into it, on a daemon thread; `wait()` returns the result."""

    def __init__(self, venv: Path, cache: Path, install_args: tuple[str, ...] = (),
                 after: BackgroundInstall | None = None,
                 requirements: tuple[str, ...] = (TORCH_PIN, *CLIENT_PACKAGES)) -> None:
        self.target = Target(venv, cache)
        self._env = dict(os.environ)  # as it is now, not as a test running later may have changed it
        self._requirements = requirements
        self._install_args = install_args
        self._after = after
        self._thread = threading.Thread(target=self._run, name="cold-install", daemon=True)
        self._proc: subprocess.Popen[str] | None = None
        self._stopped = threading.Event()
        self._result: CliResult | None = None
        self._error: BaseException | None = None
        self.started_at = 0.0
        self.seconds = 0.0

    def start(self) -> BackgroundInstall:
        self.started_at = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            if self._after is not None:
                self._after._thread.join()
                self.started_at = time.monotonic()
                if self._stopped.is_set():
                    return
            make_venv(self.target.venv, *self._requirements, env=self._env)
            if self._stopped.is_set():
                return
            self._proc = start_cli("install", "--python", self.target.python, "--cache-dir", self.target.cache,
                                   *self._install_args, "--json", prefix=("nice", "-n", "10"), columns=200,
                                   base_env=self._env)
            out, err = self._proc.communicate()
            self._result = CliResult(self._proc.args, self._proc.returncode, out, err)
        except BaseException as exc:  # handed to the waiting test, which fails with it
            self._error = exc
        finally:
            self.seconds = time.monotonic() - self.started_at

    def wait(self, timeout: float = 3600) -> CliResult:
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.stop()
            raise TimeoutError(f"the cold install did not finish in {timeout:g} s")
        if self._error is not None:
            raise RuntimeError(f"making the target venv failed: {self._error}") from self._error
        assert self._result is not None, "the cold install was stopped before it ran"
        return self._result

    def stop(self) -> None:
        """End of session (or Ctrl-C): kill an install still running, so pytest can exit."""
        self._stopped.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=30)
