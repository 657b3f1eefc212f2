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
import json
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
                 after: BackgroundInstall | PublishedInstall | None = None,
                 requirements: tuple[str, ...] = (TORCH_PIN, *CLIENT_PACKAGES),
                 air_gap: AirGap | None = None, handoff: InstallHandoff | None = None) -> None:
        self.target = Target(venv, cache)
        self.handoff = handoff  # where the result is published for the other test processes, if any
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

    def join(self) -> None:
        """Until the install has ended (finished, failed or stopped)."""
        self._thread.join()

    def _run(self) -> None:
        try:
            if self._after is not None:
                self._after.join()
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
            if self.handoff is not None:
                self.handoff.publish(self._outcome())

    def _outcome(self) -> dict[str, object]:
        """What a process waiting on the InstallHandoff needs: the target, and the result or why there is none."""
        document: dict[str, object] = {"venv": str(self.target.venv), "cache": str(self.target.cache),
                                       "seconds": self.seconds}
        if self._error is not None:
            document["error"] = f"making the target venv failed: {self._error}"
        elif self._result is None:
            document["error"] = "the cold install was stopped before it ran"
        else:
            document.update(args=[str(arg) for arg in self._result.args], returncode=self._result.returncode,
                            stdout=self._result.stdout, stderr=self._result.stderr)
        return document

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

    def finish(self, *, others_may_wait: bool) -> None:
        """End of session: when other test processes may still wait for this install (`others_may_wait`: xdist,
        and not interrupted), let it end and publish; otherwise stop it."""
        if others_may_wait and not self._stopped.is_set():
            self._thread.join()
        self.stop()

    def stop(self) -> None:
        """Ctrl-C, or the end of a session nobody else waits on: kill an install still running, so pytest can
        exit."""
        self._stopped.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=30)


class InstallHandoff:
    """One cold install shared by the test processes of one run (scripts/test.sh's xdist workers): the first
    process to need it claims it (`claim`) and runs it; it publishes the result where the others wait for it
    (`PublishedInstall`). `directory` is common to the run's processes (xdist's base temp directory) and to
    no other run."""

    def __init__(self, directory: Path, name: str) -> None:
        self.owner = directory / f"{name}.owner"
        self.result = directory / f"{name}.json"

    def claim(self) -> bool:
        """Whether this process is the one to run the install (the first to ask)."""
        try:
            handle = os.open(self.owner, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(f"{os.getpid()}\n")
        return True

    def publish(self, outcome: dict[str, object]) -> None:
        """Write the install's outcome in one rename (a waiting process never reads half a file)."""
        partial = self.result.with_suffix(".partial")
        partial.write_text(json.dumps(outcome), encoding="utf-8")
        partial.replace(self.result)

    def owner_alive(self) -> bool:
        """Whether the process that claimed the install still runs (it publishes before it exits)."""
        try:
            pid = int(self.owner.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return True  # claimed a moment ago: the pid is being written
        return Path(f"/proc/{pid}").exists()


class PublishedInstall:
    """Another test process's cold install (InstallHandoff), seen from a process that did not claim it: the
    same `target`, `wait()` and `seconds` as a BackgroundInstall."""

    POLL_S = 2.0

    def __init__(self, handoff: InstallHandoff) -> None:
        self.handoff = handoff
        self.seconds = 0.0
        self._target: Target | None = None

    @property
    def target(self) -> Target:
        assert self._target is not None, "the target is known once wait() has returned"
        return self._target

    def join(self) -> None:
        with contextlib.suppress(TimeoutError, RuntimeError):
            self.wait()

    def wait(self, timeout: float = 3600) -> CliResult:
        deadline = time.monotonic() + timeout
        while True:
            alive = self.handoff.owner_alive()  # before looking: the owner publishes, then exits
            if self.handoff.result.exists():
                break
            if not alive:
                raise RuntimeError(f"the test process that ran the cold install ended without its result "
                                   f"({self.handoff.result})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cold install (another test process's) did not finish in {timeout:g} s")
            time.sleep(self.POLL_S)
        document = json.loads(self.handoff.result.read_text(encoding="utf-8"))
        self.seconds = document["seconds"]
        self._target = Target(Path(document["venv"]), Path(document["cache"]))
        if "error" in document:
            raise RuntimeError(document["error"])
        return CliResult(document["args"], document["returncode"], document["stdout"], document["stderr"])

    def finish(self, *, others_may_wait: bool) -> None:
        """Nothing to end here: the process that claimed the install ends it."""

    def stop(self) -> None:
        """Nothing to stop here: the process that claimed the install stops it."""
