"""MLSTACK_TEST_FAILURES_LOG (tests/conftest.py): each failure is written when it happens, not at the end, so a
suite stopped after hours under load (scripts/test_under_load.sh) still tells what failed and why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

SAMPLE = '''
import os, signal
def test_passes():
    pass
def test_fails():
    assert 1 + 1 == 3, "arithmetic under load"
def test_suite_is_killed_here():
    os.kill(os.getpid(), signal.SIGKILL)  # as a stopped run ends: no summary is ever printed
'''


def test_failures_are_logged_as_they_happen_even_if_the_run_is_killed(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    log = tmp_path / "failures.log"
    env = {**os.environ, "MLSTACK_TEST_FAILURES_LOG": str(log), "PYTHONPATH": str(TESTS)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                           "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "basetemp"),
                           str(tmp_path / "test_sample.py")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == -9, done.stdout[-2000:] + done.stderr[-2000:]
    assert "arithmetic under load" not in done.stdout  # pytest itself never got to print it
    text = log.read_text()
    assert text.startswith("=== test_sample.py::test_fails (call, ")
    assert "AssertionError: arithmetic under load" in text
    assert "test_passes" not in text
