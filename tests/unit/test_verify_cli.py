"""`mlstack-ds verify` bad input: one-line error, hint, exit code 2, before anything is launched."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import run_cli


def verify(*args: str) -> tuple[int, str]:
    result = run_cli("verify", *args)
    return result.returncode, " ".join(result.stderr.split())  # undo rich wrapping


def test_unknown_check() -> None:
    code, err = verify("--only", "zero4")
    assert code == 2 and "unknown check(s) zero4" in err and "hint:" in err and "Traceback" not in err


def test_missing_python(tmp_path: Path) -> None:
    code, err = verify("--python", str(tmp_path / "nope"))
    assert code == 2 and "no such file" in err


def test_python_that_is_not_executable(tmp_path: Path) -> None:
    plain = tmp_path / "python"
    plain.write_text("")
    code, err = verify("--python", str(plain))
    assert code == 2 and "not executable" in err


@pytest.mark.parametrize(("option", "value"), [("--timeout", "0"), ("--world-size", "0")])
def test_non_positive_numbers(option: str, value: str) -> None:
    code, err = verify(option, value)
    assert code == 2 and option in err


def test_bad_hostfile(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("just-a-name\n")
    code, err = verify("--hostfile", str(hostfile))
    assert code == 2 and "slots=N" in err


def test_world_size_with_hostfile_is_refused(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a slots=2\n")
    code, err = verify("--hostfile", str(hostfile), "--world-size", "4")
    assert code == 2 and "cannot be combined with --hostfile" in err
