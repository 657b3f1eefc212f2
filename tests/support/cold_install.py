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

The second pin's install is also the suite's air-gapped install (issue 41), so that proof costs no build of its
own: `mlstack-ds bundle` makes the bundle for 0.19.8 first (online, like the machine with network access), then
`mlstack-ds install --offline DIR` builds, installs and verifies in a network namespace of its own, with only
loopback up (verify's ranks talk over it) and no route out, into the venv that already has the CPU torch.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .bundles import network_namespace
from .cli import CliResult, run_cli, start_cli
from .e2e import Target
from .pins import CLIENT_PACKAGES, TORCH_PIN, TORCH_VERSION
from .target_env import make_venv

INSTALLED_TARGET_FIXTURE = "installed_target"
INSTALLED_NEXT_TARGET_FIXTURE = "installed_next_target"


@dataclass(frozen=True)
class AirGap:
    """Install from a bundle made at `directory` of `recipe`'s pinned `sdist` (`bundle --source`), with no network
    when this machine lets the tests make a network namespace (`unshare -n`: root or user namespaces)."""

    directory: Path
    recipe: str
    sdist: Path


class BackgroundInstall:
    """Make the target venv (`requirements`: torch pinned, plus the Hugging Face clients verify's hf_trainer check
    uses), then run `mlstack-ds install --json` into it, on a daemon thread; `wait()` returns the result."""

    def __init__(self, venv: Path, cache: Path, install_args: tuple[str, ...] = (), *,
                 after: BackgroundInstall | None = None,
                 requirements: tuple[str, ...] = (TORCH_PIN, *CLIENT_PACKAGES),
                 air_gap: AirGap | None = None) -> None:
        self.target = Target(venv, cache)
        self.air_gap = air_gap
        self.bundle: CliResult | None = None  # `bundle --json`'s result, with an air gap
        self.isolated = False  # whether the install ran in a network namespace with no route out
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
            args, prefix = self._install_args, ("nice", "-n", "10")
            if self.air_gap is not None:
                self.bundle = self._make_bundle(self.air_gap)
                namespace = network_namespace()
                self.isolated = bool(namespace)
                args, prefix = (*args, "--offline", self.air_gap.directory), (*namespace, *prefix)
            self._proc = start_cli("install", "--python", self.target.python, "--cache-dir", self.target.cache,
                                   *args, "--json", prefix=prefix, columns=200, base_env=self._env)
            out, err = self._proc.communicate()
            self._result = CliResult(self._proc.args, self._proc.returncode, out, err)
        except BaseException as exc:  # handed to the waiting test, which fails with it
            self._error = exc
        finally:
            self.seconds = time.monotonic() - self.started_at

    def _make_bundle(self, air_gap: AirGap) -> CliResult:
        """`mlstack-ds bundle` for the target's Python and platform (this machine's) and torch: the step on the
        machine with network access."""
        made = run_cli("bundle", "--to", air_gap.directory, "--recipe", air_gap.recipe, "--source", air_gap.sdist,
                       "--torch", TORCH_VERSION, "--json", columns=200, timeout=1200, base_env=self._env)
        if made.returncode != 0:
            raise RuntimeError(f"mlstack-ds bundle failed ({made.returncode}): {made.stderr[-3000:]}")
        return made

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
