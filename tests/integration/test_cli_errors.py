"""The CLI's contract for failures: one line, a hint, a documented exit code, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from mlstack_ds import __version__


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mlstack_ds", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_version_and_help() -> None:
    assert cli("--version").stdout.strip() == f"mlstack-ds {__version__}"
    help_text = cli("--help").stdout
    assert "detect" in help_text and "Exit codes" in help_text


def test_unknown_command_is_usage_error() -> None:
    result = cli("no-such-command")
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_bad_option_value_is_usage_error() -> None:
    result = cli("detect", "--tool-timeout", "soon")
    assert result.returncode == 2 and "Traceback" not in result.stderr
