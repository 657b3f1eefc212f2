"""`-m "not slow"` never starts a DeepSpeed build: tests/conftest.py marks every test whose fixtures build
or install DeepSpeed (SLOW_FIXTURES, directly or through another fixture) as `slow`. Checked on the real
suite with pytest's own collection (nothing runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def collected(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, cwd=TESTS.parent, timeout=300)
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_tests_needing_a_build_are_deselected_by_not_slow() -> None:
    # Neither file marks these itself: test_config_target.py needs no_ops_venv (pip builds DeepSpeed), the
    # hostfile install tests need installed_target through their own fixtures (the cold install).
    files = [str(TESTS / "integration" / "test_config_target.py"),
             str(TESTS / "multinode" / "test_install_hostfile.py")]
    everything = collected(*files)
    fast = collected("-m", "not slow", *files)
    assert any("test_config_target.py::" in test for test in everything)
    assert not [test for test in fast if "test_config_target.py::" in test]
    needs_install = [t for t in everything if "test_install_hostfile.py::" in t and t not in fast]
    assert needs_install, "the hostfile install tests on the installed target must be slow"
    slow_only = collected("-m", "slow", *files)
    assert sorted(slow_only) == sorted(t for t in everything if t not in fast)


def test_tests_without_a_build_stay_selected() -> None:
    file = str(TESTS / "integration" / "test_config_cli.py")
    fast = collected("-m", "not slow", file)
    assert fast and not [test for test in fast if "guide" in test]  # guide_plans needs no_ops_venv
    assert len(fast) < len(collected(file))
