"""One cold install shared by scripts/test.sh's two xdist workers (tests/support/cold_install.py: InstallHandoff).

The process that claims the install runs it and publishes its result; a test on the other worker waits for
that result instead of building a second time, and never waits forever on a process that is gone. Here the
install is the real CLI refusing an unknown pin (seconds, as in test_cold_install_environment.py), the waiting
side a separate Python process, as the other worker is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cold_install import BackgroundInstall, InstallHandoff, PublishedInstall

TESTS_DIR = Path(__file__).resolve().parents[1]

# The other worker: waits for the published install and prints what it got.
WAITER = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from support.cold_install import InstallHandoff, PublishedInstall
waiting = PublishedInstall(InstallHandoff(Path(sys.argv[2]), "cold-install"))
result = waiting.wait(timeout=600)
print(json.dumps({"returncode": result.returncode, "stderr": result.stderr, "venv": str(waiting.target.venv)}))
"""


def test_the_other_process_waits_for_the_claimed_install_and_gets_its_result(tmp_path: Path) -> None:
    handoff = InstallHandoff(tmp_path, "cold-install")
    assert handoff.claim() is True
    assert InstallHandoff(tmp_path, "cold-install").claim() is False, "a second process claimed the same install"
    waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(TESTS_DIR), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    install = BackgroundInstall(tmp_path / "venv", tmp_path / "cache", install_args=("--deepspeed-version", "0.0.1"),
                                requirements=("packaging",), handoff=handoff).start()
    result = install.wait(timeout=600)
    out, err = waiter.communicate(timeout=120)

    assert waiter.returncode == 0, err
    seen = json.loads(out)
    assert result.returncode == 2 and "no recipe named '0.0.1'" in result.stderr
    assert seen == {"returncode": 2, "stderr": result.stderr, "venv": str(tmp_path / "venv")}


def test_a_waiter_fails_at_once_when_the_claiming_process_ended_without_a_result(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    (tmp_path / "cold-install.owner").write_text(gone.stdout)  # claimed by a process that has exited
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="ended without its result"):
        PublishedInstall(InstallHandoff(tmp_path, "cold-install")).wait(timeout=600)
    assert time.monotonic() - started < 30


def test_an_install_stopped_before_it_ran_publishes_why(tmp_path: Path) -> None:
    """Ctrl-C while the second pin's install still waits for the first: the waiters learn it at once."""
    handoff = InstallHandoff(tmp_path, "cold-install")
    assert handoff.claim()
    first = BackgroundInstall(tmp_path / "first", tmp_path / "cache", install_args=("--deepspeed-version", "0.0.1"),
                              requirements=("packaging",)).start()
    second = BackgroundInstall(tmp_path / "venv", tmp_path / "cache", after=first, handoff=handoff).start()
    second.stop()  # while the first still makes its venv
    with pytest.raises(RuntimeError, match="stopped before it ran"):
        PublishedInstall(handoff).wait(timeout=600)
    first.stop()
