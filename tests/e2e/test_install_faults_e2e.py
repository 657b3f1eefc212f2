"""Faults while installing, for real (issue 28): two installs into one environment at once, `kill -9` while pip
swaps one pin for the other, a corrupt wheel in the cache.

The environment is a hard-linked copy of the session's installed target (pip only adds and removes files, so
the original stays as it was); the wheels are the session's two cold builds, copied into a cache of this
module's own, so installs here take seconds and build nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli import start_cli
from support.e2e import Target, processes_mentioning

from mlstack_ds.installed.integrity import check_files

pytestmark = pytest.mark.slow

OLD, NEW = "0.19.5", "0.19.8"

# Run in the target: what `import deepspeed` gives, and which distributions of it are installed, with their
# files checked against their RECORD (a mix of versions shows as a version mismatch or modified files).
IMPORTED = """
import json, sys
try:
    import deepspeed
    out = {"imported": deepspeed.__version__}
except Exception as exc:
    out = {"imported": None, "error": "%s: %s" % (type(exc).__name__, exc)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def scratch(installed_target: Target, installed_next_target: tuple[Target, dict],
            tmp_path_factory: pytest.TempPathFactory) -> Target:
    """A copy of the installed target (DeepSpeed 0.19.5 by mlstack-ds) and a cache with both pins' wheels."""
    root = tmp_path_factory.mktemp("install-faults")
    venv = root / "venv"
    subprocess.run(["cp", "-al", str(installed_target.venv), str(venv)], check=True)
    cache = root / "cache"
    for source in (installed_target.cache, installed_next_target[0].cache):
        shutil.copytree(source / "wheels", cache / "wheels", dirs_exist_ok=True)
    target = Target(venv, cache)
    assert target.status()["intact"] is True
    return target


def site_packages(target: Target) -> Path:
    (site,) = target.venv.glob("lib/python3*/site-packages")
    return site


class Watched:
    """A CLI run whose output lines are read as they come, each with the time it arrived; `on_line` runs
    on the reader thread at that moment (to look at the environment then)."""

    def __init__(self, *args: str, on_line: Callable[[str], None] = lambda _line: None) -> None:
        self.proc = start_cli(*args, columns=200, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self._on_line = on_line
        self._readers = [threading.Thread(target=self._read, args=(stream,), daemon=True)
                         for stream in (self.proc.stdout, self.proc.stderr)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            self._on_line(line)

    def wait(self, timeout: float = 900) -> int:
        code = self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=30)
        return code

    def text(self) -> str:
        return "\n".join(line for _, line in sorted(self.lines))


def holding_the_lock(target: Target, install: Watched) -> None:
    """Wait until `install` holds the environment's install lock (its pid is in the lock file)."""
    lock = target.venv / "share" / "mlstack-ds" / "install.lock"
    deadline = time.monotonic() + 300
    while str(install.proc.pid) not in (lock.read_text() if lock.exists() else ""):
        assert install.proc.poll() is None, f"the install ended before it held the lock:\n{install.text()}"
        assert time.monotonic() < deadline, f"no lock after 300 s:\n{install.text()}"
        time.sleep(0.05)


def test_two_installs_into_one_environment_are_serialized(scratch: Target) -> None:
    receipt = scratch.venv / "share" / "mlstack-ds" / "receipt.json"
    started = time.time()
    seen_at_go: list[float] = []  # the receipt's mtime when the second install went on past the lock

    def second_goes_on(line: str) -> None:
        if line.startswith("reusing cached wheel") and not seen_at_go:
            seen_at_go.append(receipt.stat().st_mtime)

    args = ("install", "--python", scratch.python, "--cache-dir", str(scratch.cache), "--force", "--no-verify")
    first = Watched(*args)
    # The two installs were 0.5 s apart; under load the first needed longer than that to reach the
    # lock, the second took it first and neither waited (run 2 under load). So the second starts once the
    # first holds the lock, which is the case this test is about.
    holding_the_lock(scratch, first)
    second = Watched(*args, on_line=second_goes_on)
    assert (first.wait(), second.wait()) == (0, 0), first.text() + "\n---\n" + second.text()
    assert f"waiting for another mlstack-ds install into {scratch.python} (pid {first.proc.pid})" in second.text()
    assert "waiting" not in first.text()
    # Not interleaved: when the second went past the lock, the first had already written its receipt.
    assert seen_at_go and seen_at_go[0] >= started, second.text()
    status = scratch.status()
    assert status["intact"] is True and status["receipt"]["deepspeed_version"] == OLD


def test_a_second_install_with_lock_timeout_0_is_refused(scratch: Target) -> None:
    args = ("install", "--python", scratch.python, "--cache-dir", str(scratch.cache), "--force", "--no-verify")
    first = Watched(*args)
    holding_the_lock(scratch, first)
    refused = scratch.install("--force", "--no-verify", "--lock-timeout", "0")
    assert first.wait() == 0, first.text()
    assert refused.returncode == 7, refused.stderr
    error, hint = refused.one_error()
    assert f"another mlstack-ds install into {scratch.python} (pid {first.proc.pid}) is still running" in error
    assert "--lock-timeout" in hint
    assert scratch.status()["intact"] is True


def _moment(name: str, site: Path, old_info: str) -> Callable[[], bool]:
    """The kill points, as the filesystem shows them: pip has moved the old version aside (nothing of it is
    left in place); pip is writing the new files (the package directory is back, without a dist-info)."""
    if name == "old moved aside":
        return lambda: not (site / old_info).exists()
    return lambda: (not (site / old_info).exists() and (site / "deepspeed").is_dir()
                    and not any(site.glob("deepspeed-*.dist-info")))


def _kill(watched: Watched, venv: Path, *, with_pip: bool) -> None:
    """SIGKILL the tool's process group; with its pip (which runs in a session of its own) when `with_pip`."""
    os.killpg(watched.proc.pid, signal.SIGKILL)
    if with_pip:
        for pid in processes_mentioning(str(venv)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    watched.wait(timeout=60)


@pytest.mark.parametrize(("to", "moment", "with_pip"), [
    (NEW, "old moved aside", True),
    (OLD, "new files being written", True),
    (NEW, "new files being written", True),
    (OLD, "old moved aside", False),  # the tool alone: its pip runs on, holding the environment's lock
])
def test_kill_9_during_an_upgrade_leaves_no_mix_and_the_next_install_repairs(
        scratch: Target, to: str, moment: str, with_pip: bool) -> None:
    site = site_packages(scratch)
    (old_info,) = (p.name for p in site.glob("deepspeed-*.dist-info"))
    before = old_info.removeprefix("deepspeed-").removesuffix(".dist-info")
    assert before != to
    install = ("install", "--deepspeed-version", to, "--python", scratch.python, "--cache-dir", str(scratch.cache),
               "--no-verify")
    watched = Watched(*install)
    reached = _moment(moment, site, old_info)
    deadline = time.monotonic() + 600
    while watched.proc.poll() is None and not reached() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert watched.proc.poll() is None, f"the install ended before '{moment}':\n{watched.text()}"
    _kill(watched, scratch.venv, with_pip=with_pip)

    # Never a mix: DeepSpeed imports as the previous version, intact, or not at all (the guard refuses it).
    imported = _imported(scratch)
    if imported["imported"] is not None:
        assert imported["imported"] == before, imported
        _assert_one_intact_distribution(site, before)
    else:
        assert "interrupted" in imported["error"], imported
    if with_pip:
        status = scratch.status()
        assert status["intact"] is False
        assert "was interrupted" in status["problems"][0], status["problems"]

    repaired = scratch.install("--deepspeed-version", to, "--no-verify")
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    assert "was interrupted; repairing" in repaired.stderr
    status = scratch.status()
    assert status["intact"] is True, status["problems"]
    assert status["receipt"]["deepspeed_version"] == to
    assert status["receipt"]["previous"]["deepspeed_version"] == before  # rollback still goes back there
    assert _imported(scratch)["imported"] == to
    _assert_one_intact_distribution(site, to)
    assert not [p.name for p in site.iterdir() if p.name.startswith("~") or p.name.endswith("progress.pth")]
    assert not processes_mentioning(str(scratch.venv))


def _imported(target: Target) -> dict:
    done = subprocess.run([target.python, "-c", IMPORTED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_one_intact_distribution(site: Path, version: str) -> None:
    infos = sorted(p.name for p in site.glob("deepspeed-*.dist-info"))
    assert infos == [f"deepspeed-{version}.dist-info"], infos
    files = check_files(site / infos[0] / "RECORD")
    assert files.ok, files.summary()


def test_a_corrupt_cached_wheel_is_named_with_the_fix_and_nothing_changes(installed_target: Target,
                                                                           tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(installed_target.cache / "wheels", cache / "wheels")
    (wheel,) = cache.glob("wheels/*/deepspeed-*.whl")
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit, in the middle of some compressed member
    wheel.write_bytes(bytes(data))
    before = installed_target.status()
    result = installed_target.cli("install", "--python", installed_target.python, "--cache-dir", str(cache),
                                  "--force", "--no-verify")
    assert result.returncode == 6, result.stderr[-3000:]
    error, hint = result.one_error()
    assert f"cached wheel {wheel} is corrupt" in error and "nothing was installed" in error
    assert "--rebuild" in hint
    after = installed_target.status()
    assert after["intact"] is True and after["receipt"] == before["receipt"]
