"""The subprocess runner: time-outs kill the whole process group; failures are typed errors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mlstack_ds.errors import ExitCode, ToolMissing, ToolTimedOut
from mlstack_ds.runner import run, which


def test_nonzero_exit_is_a_result_not_an_exception() -> None:
    result = run(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.returncode, result.stdout, result.stderr, result.ok) == (3, "out\n", "err\n", False)


def test_missing_executable() -> None:
    with pytest.raises(ToolMissing) as info:
        run(["/nonexistent/tool"])
    assert info.value.exit_code == ExitCode.ENVIRONMENT


def test_timeout_kills_grandchildren(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(ToolTimedOut):
        run(["/bin/sh", "-c", f"/bin/sleep 300 & echo $! > {pid_file}; wait"], timeout=1)
    assert time.monotonic() - started < 10
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {grandchild} survived the time-out")


def test_tail_skips_traceback_underlines() -> None:
    result = run(["/bin/sh", "-c", "printf 'x = f()\\n    ^^^^\\nValueError: bad\\n' >&2; exit 1"])
    assert result.tail(1) == "ValueError: bad"


def test_which_prefers_path_then_extra_dirs(tmp_path: Path) -> None:
    on_path, extra = tmp_path / "a", tmp_path / "b"
    for directory in (on_path, extra):
        directory.mkdir()
        tool = directory / "tool"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    assert which("tool", [extra], path=str(on_path)) == on_path / "tool"
    assert which("tool", [extra], path=str(tmp_path / "none")) == extra / "tool"
    assert which("tool", [], path=str(tmp_path / "none")) is None
